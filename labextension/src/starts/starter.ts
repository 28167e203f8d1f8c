/**
 * Starting a gpushare kernel at the size the user picks, before it starts (docs/users/panel.md).
 *
 * JupyterLab's sessions API can only name a kernelspec, so a kernel started through it would
 * hold the kernelspec's size. Here the size is asked first (the picker that the UI plugin
 * registers), the kernel is started once at that size through `POST api/gpushare/kernels`,
 * and only then handed to JupyterLab, as an existing kernel id, for the notebook's session.
 * While the start waits in the GPU queue its position is published (`changed`, `pending`) for
 * the notebook's indicator, and the wait can be cancelled: the queued request is withdrawn and
 * nothing is held.
 */

import { Kernel, KernelAPI, KernelSpec } from '@jupyterlab/services';
import { Token } from '@lumino/coreutils';
import { ISignal, Signal } from '@lumino/signaling';

import { GPUShareAPI, GPUShareError } from '../api';
import { ISpecSlice, specSlice } from '../kernelspecs';
import { IPick } from '../picker/dialog';
import { IKernelSlice } from '../types';

/** How often a queued start is looked at (ms). */
const POLL_MS = 400;

/** A start to ask for: a gpushare kernelspec for a notebook (or console) path. */
export interface IStartRequest {
  /** The gpushare kernelspec. */
  kernelName: string;
  /** The path of the notebook the kernel is for (its directory is the kernel's). */
  path: string;
  /**
   * The kernel the new one replaces (a session's kernel being changed): never taken up as
   * left behind, however recently the server judged it unused.
   */
  replaces?: string | null;
}

/** What picks the size: the UI plugin's dialog; null when the user cancels. */
export type Picker = (
  request: IStartRequest,
  slice: ISpecSlice
) => Promise<IPick | null>;

/** A start in progress, as the notebook's indicator shows it. */
export interface IPendingStart {
  readonly path: string;
  readonly kernelName: string;
  /** choosing: the picker is open; waiting: queued for a GPU; starting: placed, coming up. */
  readonly phase: 'choosing' | 'waiting' | 'starting';
  /** The kernel being started, once there is one. */
  readonly kernelId: string | null;
  /** The queue position while waiting, where known. */
  readonly position: number | null;
  /** What the start is doing in the server's words (a kernel pod's phase, the queue's reason). */
  readonly detail: string | null;
  /** Withdraw the start: the queued request leaves the queue; nothing is held. */
  cancel(): void;
}

/** A notebook whose automatic start of a gpushare kernel was held for the picker. */
export interface IHeldStart {
  /** The gpushare kernelspec it was about to start. */
  readonly kernelName: string;
  /** Give the notebook its kernel preference back. */
  restore(): void;
}

/** The token of the kernel starts (a service: the session manager plugin needs it). */
export const IGPUShareStarts = new Token<KernelStarts>(
  'jupyter-gpushare:IGPUShareStarts',
  'Starts gpushare kernels at the size picked before they start.'
);

/**
 * The start of gpushare kernels, shared by the session manager, the session dialogs and the
 * notebooks' indicators.
 */
export class KernelStarts {
  constructor(options: { api: GPUShareAPI; kernelspecs: KernelSpec.IManager }) {
    this.api = options.api;
    this.kernelspecs = options.kernelspecs;
  }

  /** The REST client. */
  readonly api: GPUShareAPI;

  /** The kernelspecs, to tell gpushare ones. */
  readonly kernelspecs: KernelSpec.IManager;

  /** Notebooks (by session context) whose gpushare start waits for the picker. */
  readonly held = new WeakMap<object, IHeldStart>();

  /** Emitted when a start begins, moves in the queue, or ends. */
  get changed(): ISignal<this, IPendingStart | null> {
    return this._changed;
  }

  /** The gpushare slice of a kernelspec, or null for any other kernelspec. */
  slice(kernelName: string | undefined): ISpecSlice | null {
    return kernelName
      ? specSlice(this.kernelspecs.specs?.kernelspecs[kernelName])
      : null;
  }

  /** Whether a kernelspec is a gpushare one (known once the kernelspecs are loaded). */
  isGPUKernel(kernelName: string | undefined): boolean {
    return this.slice(kernelName) !== null;
  }

  /** Let the UI ask for sizes (without a picker, a start takes the kernelspec's size). */
  setPicker(picker: Picker | null): void {
    this._picker = picker;
  }

  /** The start in progress for a path, if any. */
  pending(path: string): IPendingStart | undefined {
    return this._pending.get(path);
  }

  /**
   * Ask for a size, start the kernel at that size, and wait until it runs: its id, or null
   * when the user cancelled (nothing was started, or the queued start was withdrawn).
   * Throws with the server's reason when the start fails.
   *
   * A kernel of this server already started for the same notebook and kernelspec that
   * nobody uses (its tab closed right after the start, or while it waited in the queue) is
   * taken up instead of starting a second one.
   */
  async start(request: IStartRequest): Promise<string | null> {
    const slice = this.slice(request.kernelName);
    if (!slice) {
      throw new Error(`"${request.kernelName}" is not a gpushare kernelspec`);
    }
    const previous = this._pending.get(request.path);
    if (previous) {
      previous.cancel(); // one start per notebook: the newest wins
    }
    const pending = new Pending(request, () => this._changed.emit(pending));
    this._pending.set(request.path, pending);
    this._active.add(pending);
    pending.update({});
    try {
      const left = await this._leftBehind(request);
      if (left) {
        return await this._follow(left, pending);
      }
      const pick = this._picker
        ? await this._picker(request, slice)
        : { memory: slice.memory, mode: slice.mode ?? '' };
      if (!pick || pending.cancelled) {
        return null;
      }
      const kernel = await this.api.start({
        name: request.kernelName,
        path: request.path,
        gpu_memory: pick.memory ?? '',
        gpu_mode: pick.mode || null
      });
      return await this._follow(kernel, pending);
    } finally {
      this._active.delete(pending);
      if (this._pending.get(request.path) === pending) {
        this._pending.delete(request.path);
      }
      this._changed.emit(null);
    }
  }

  /**
   * Withdraw a start, or end a kernel that was started for a notebook closed meanwhile:
   * leave the queue, and shut the kernel down if it came up.
   */
  async withdraw(kernelId: string): Promise<void> {
    try {
      await this.api.release(kernelId);
    } catch {
      // no slice or request left to withdraw
    }
    try {
      await KernelAPI.shutdownKernel(kernelId, this.api.settings);
    } catch {
      // not started: nothing to shut down
    }
  }

  /**
   * A kernel of this server started for the request's notebook and kernelspec that no other
   * start of this page follows and nobody uses: queued, or running without a session.
   */
  private async _leftBehind(
    request: IStartRequest
  ): Promise<IKernelSlice | null> {
    let kernels: IKernelSlice[];
    try {
      kernels = await this.api.kernels();
    } catch {
      return null; // the picker says what is wrong with the server
    }
    // Starts of this page, a cancelled one still withdrawing its kernel included.
    const followed = new Set(
      [...this._active].map(pending => pending.kernelId)
    );
    return (
      kernels.find(
        kernel =>
          kernel.kernel_id !== null &&
          !followed.has(kernel.kernel_id) &&
          kernel.kernel_id !== request.replaces &&
          kernel.path === request.path &&
          kernel.kernel_name === request.kernelName &&
          (kernel.state === 'queued' || kernel.unused === true)
      ) ?? null
    );
  }

  /** Follow a start until its kernel runs; null when cancelled (it is then withdrawn). */
  private async _follow(
    kernel: IKernelSlice,
    pending: Pending
  ): Promise<string | null> {
    const kernelId = kernel.kernel_id as string;
    pending.update({ kernelId });
    // Placed in the ledger (or the pod runs) is not yet started: JupyterLab may use the kernel
    // only once the server lists it among its kernels.
    let model: Kernel.IModel | undefined = undefined;
    while (!pending.cancelled) {
      if (kernel.state === 'released' && !kernel.unused) {
        throw new GPUShareError('the kernel ended before it started', 409);
      }
      pending.update({
        phase: kernel.state === 'queued' ? 'waiting' : 'starting',
        position: kernel.queue_position,
        detail: kernel.detail ?? null
      });
      if (kernel.state !== 'queued') {
        model = await KernelAPI.getKernelModel(kernelId, this.api.settings);
        if (model) {
          return kernelId;
        }
      }
      await pending.sleep(POLL_MS);
      if (!pending.cancelled) {
        kernel = await this.api.kernel(kernelId);
      }
    }
    await this.withdraw(kernelId);
    return null;
  }

  private _picker: Picker | null = null;
  private _pending = new Map<string, Pending>();
  private _active = new Set<Pending>();
  private _changed = new Signal<this, IPendingStart | null>(this);
}

/** A start in progress: its state, and the means to cancel it and to wait until then. */
class Pending implements IPendingStart {
  constructor(
    request: IStartRequest,
    private _emit: () => void
  ) {
    this.path = request.path;
    this.kernelName = request.kernelName;
  }

  readonly path: string;
  readonly kernelName: string;
  phase: IPendingStart['phase'] = 'choosing';
  kernelId: string | null = null;
  position: number | null = null;
  detail: string | null = null;
  cancelled = false;

  update(state: Partial<IPendingStart>): void {
    Object.assign(this, state);
    this._emit();
  }

  cancel(): void {
    this.cancelled = true;
    this._wake?.();
  }

  /** Wait `ms`, or less when cancelled. */
  sleep(ms: number): Promise<void> {
    return new Promise(resolve => {
      const timer = window.setTimeout(done, ms);
      const wake = () => {
        window.clearTimeout(timer);
        resolve();
      };
      this._wake = wake;
      function done() {
        resolve();
      }
    });
  }

  private _wake: (() => void) | null = null;
}
