/**
 * Picking a GPU size when a notebook starts, or changes to, a gpushare kernel.
 *
 * The kernel starts with its kernelspec's slice (that is what the sessions API can ask for);
 * the picker then asks for the size and applies the choice to the running kernel: a resize
 * (`PATCH kernels/{id}`), a release for "no GPU" (`DELETE kernels/{id}/gpu`), or, for another
 * mode, a change to the gpushare kernelspec of that mode, whose new kernel then gets the size
 * without asking again. The choice is remembered per notebook path (in the state database)
 * and offered first next time; a kernel it was already applied to is not asked about again,
 * across page reloads too.
 */

import { showErrorMessage } from '@jupyterlab/apputils';
import { ISessionContext } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel, KernelSpec } from '@jupyterlab/services';
import { IStateDB } from '@jupyterlab/statedb';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { GPUShareAPI } from '../api';
import { specForMode, specSlice } from '../kernelspecs';
import { GPUShareModel } from '../model';
import { IGPUShareConfig } from '../types';
import { IPick, pickSize } from './dialog';

/** The state database key of the remembered choices. */
export const STATE_KEY = 'jupyter-gpushare:picks';

/** A remembered choice for one notebook. */
interface IRemembered {
  memory: string | null;
  mode: string;
  /** The kernel the choice was last applied to. */
  kernelId: string | null;
}

type Remembered = { [path: string]: IRemembered };

/** What the start picker needs. */
export interface IStartPickerOptions {
  api: GPUShareAPI;
  model: GPUShareModel;
  notebooks: INotebookTracker;
  kernelspecs: KernelSpec.IManager;
  config: () => Promise<IGPUShareConfig>;
  state: IStateDB | null;
}

/**
 * Watches notebooks and asks for a size when one gets a new gpushare kernel.
 */
export class StartPicker {
  constructor(private _options: IStartPickerOptions) {
    _options.notebooks.widgetAdded.connect((_, panel) => this._watch(panel));
    _options.notebooks.forEach(panel => this._watch(panel));
  }

  /**
   * Ask for a size for the kernel of a notebook now and apply it (the command palette's
   * "Choose GPU Size…").
   */
  async pickFor(panel: NotebookPanel): Promise<void> {
    const kernel = panel.sessionContext.session?.kernel;
    if (kernel) {
      await this._pickAndApply(panel.sessionContext, kernel, true);
    }
  }

  private _watch(panel: NotebookPanel): void {
    const context = panel.sessionContext;
    if (this._watched.has(context)) {
      return;
    }
    this._watched.add(context);
    context.kernelChanged.connect((_, change) => {
      if (change.newValue) {
        void this._onKernel(context, change.newValue);
      }
    });
    const current = context.session?.kernel;
    if (current) {
      void this._onKernel(context, current);
    }
  }

  private async _onKernel(
    context: ISessionContext,
    kernel: Kernel.IKernelConnection
  ): Promise<void> {
    if (this._seen.has(kernel.id)) {
      return;
    }
    this._seen.add(kernel.id);
    await this._options.kernelspecs.ready;
    const slice = specSlice(
      this._options.kernelspecs.specs?.kernelspecs[kernel.name]
    );
    if (!slice) {
      return;
    }
    const remembered = (await this._remembered())[context.path];
    if (remembered?.kernelId === kernel.id) {
      return; // applied before this page was loaded
    }
    const pending = this._pending.get(context.path);
    if (pending) {
      // The new kernel of a mode change: apply the size chosen before the change.
      this._pending.delete(context.path);
      await this._apply(context, kernel, pending);
      return;
    }
    await this._pickAndApply(context, kernel, false);
  }

  private async _pickAndApply(
    context: ISessionContext,
    kernel: Kernel.IKernelConnection,
    explicit: boolean
  ): Promise<void> {
    const { api, model, kernelspecs } = this._options;
    const slice = specSlice(kernelspecs.specs?.kernelspecs[kernel.name]);
    if (!slice) {
      if (explicit) {
        await showErrorMessage(
          'No GPU kernel',
          `The kernel "${kernel.name}" does not use gpushare; choose a GPU kernel first.`
        );
      }
      return;
    }
    let config: IGPUShareConfig;
    let current: string | null;
    try {
      config = await this._options.config();
      const now = await api.kernel(kernel.id);
      current = now.state === 'released' ? null : (now.size ?? slice.memory);
    } catch (error) {
      console.warn('jupyter-gpushare: cannot read the kernel slice', error);
      return;
    }
    const remembered = (await this._remembered())[context.path];
    const mode = slice.mode ?? config.default_mode;
    // Modes offered: those the node honours that an installed kernelspec uses.
    const modes: string[] = config.modes.filter(
      m => m === mode || specForMode(kernelspecs.specs, m, null) !== null
    );
    const first = !explicit && remembered ? remembered.memory : current;
    const name = context.path.split('/').pop() || context.path;
    const pick = await pickSize({
      title: `GPU for ${name}`,
      sizes: config.sizes,
      current: first,
      allowNone: true,
      modes,
      mode:
        !explicit && remembered && modes.includes(remembered.mode)
          ? remembered.mode
          : mode,
      deviceMemory: (model.pool ?? (await api.pool())).devices.map(
        d => d.memory_total
      ),
      acceptLabel: 'Apply'
    });
    if (pick === null) {
      return;
    }
    if (pick.mode !== mode) {
      const target = specForMode(kernelspecs.specs, pick.mode, pick.memory);
      if (target) {
        this._pending.set(context.path, pick);
        await context.changeKernel({ name: target.name });
        return;
      }
    }
    await this._apply(context, kernel, pick);
  }

  private async _apply(
    context: ISessionContext,
    kernel: Kernel.IKernelConnection,
    pick: IPick
  ): Promise<void> {
    const { api, model } = this._options;
    try {
      const now = await api.kernel(kernel.id);
      if (pick.memory === null) {
        if (now.state !== 'released') {
          await api.release(kernel.id);
        }
      } else if (now.state === 'released') {
        throw new Error(
          'the kernel holds no GPU slice any more; run `%gpu request SIZE` in it to take one'
        );
      } else if ((now.size ?? '').toLowerCase() !== pick.memory.toLowerCase()) {
        // A kernel pod's slice is fixed: it restarts in a new pod of the picked size.
        await api.resize(kernel.id, pick.memory, Boolean(now.pod));
      }
      await this._remember(context.path, { ...pick, kernelId: kernel.id });
    } catch (error) {
      await showErrorMessage(
        'GPU size not applied',
        `${pick.memory ?? 'No GPU'} for ${context.path}: ${(error as Error).message}`
      );
    } finally {
      void model.refresh();
    }
  }

  private async _remembered(): Promise<Remembered> {
    const state = this._options.state;
    if (!state) {
      return this._memory;
    }
    try {
      const value = await state.fetch(STATE_KEY);
      return (value as unknown as Remembered) ?? {};
    } catch {
      return this._memory;
    }
  }

  private async _remember(path: string, choice: IRemembered): Promise<void> {
    const all = { ...(await this._remembered()), [path]: choice };
    this._memory = all;
    const state = this._options.state;
    if (state) {
      await state.save(STATE_KEY, all as unknown as ReadonlyPartialJSONObject);
    }
  }

  private _watched = new WeakSet<ISessionContext>();
  private _seen = new Set<string>();
  private _pending = new Map<string, IPick>();
  private _memory: Remembered = {};
}
