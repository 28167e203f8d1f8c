/**
 * The live state behind the panel and the status bar: the latest pool and kernels, a minute
 * of utilisation history per device, and the stream that keeps them fresh.
 *
 * The stream (`GET stream`, server-sent events) runs only while someone looks: while a
 * consumer holds the model (the panel while it is visible, the status bar while the current
 * notebook runs a gpushare kernel) and the browser tab is visible. Every event carries the
 * complete state, so a reconnect (the browser's own after a dropped connection, or ours after
 * an error that closed the stream) needs no replay; after an error the model also re-reads the
 * REST routes so the view is right before the stream is back.
 */

import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { GPUShareAPI, GPUShareError } from './api';
import { IDevice, IKernelSlice, IPool, IUsageEvent } from './types';

/** How long utilisation history is kept for the sparklines. */
export const HISTORY_MS = 60_000;

/** Delays before reopening a stream that the browser gave up on. */
const REOPEN_DELAYS_MS = [1000, 2000, 4000, 8000];

/** One utilisation sample of a device. */
export interface ISample {
  /** When it arrived (ms since the epoch). */
  time: number;
  /** Percent busy, or null where unknown. */
  value: number | null;
}

/** The connection of the model to the server. */
export type ConnectionState = 'idle' | 'connecting' | 'live' | 'retrying';

/** The constructor seams: tests and screenshots can pass their own. */
export interface IModelOptions {
  api: GPUShareAPI;
  /** The EventSource class (the browser's by default). */
  eventSource?: typeof EventSource;
}

/**
 * Pool, kernels and history, kept live while held.
 */
export class GPUShareModel implements IDisposable {
  constructor(options: IModelOptions) {
    this.api = options.api;
    this._EventSource = options.eventSource ?? EventSource;
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  /** The REST client. */
  readonly api: GPUShareAPI;

  /** The latest pool, or null before the first answer. */
  get pool(): IPool | null {
    return this._pool;
  }

  /** This server's GPU kernels, as of the latest event. */
  get kernels(): IKernelSlice[] {
    return this._kernels;
  }

  /** The state of the stream. */
  get connection(): ConnectionState {
    return this._connection;
  }

  /** The last error reading the server, or null. */
  get error(): string | null {
    return this._error;
  }

  /** Emitted after every change of pool, kernels, connection or error. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Whether the model is disposed. */
  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** This server's entry for a kernel, if it is a GPU kernel. */
  kernel(kernelId: string | null | undefined): IKernelSlice | undefined {
    if (!kernelId) {
      return undefined;
    }
    return this._kernels.find(k => k.kernel_id === kernelId);
  }

  /** The last minute of utilisation samples of a device. */
  history(device: IDevice): ISample[] {
    return this._history.get(device.uuid) ?? [];
  }

  /**
   * Bytes reserved on a device by slices that are not this server's: other users' and other
   * servers' kernels, shown as anonymous occupancy.
   */
  othersReserved(device: IDevice): number {
    return Math.max(0, device.memory_reserved - this.yoursReserved(device));
  }

  /**
   * Bytes this server's kernels take on a device: each slice, or what its processes hold when
   * that is more, and what released kernels' processes still hold there.
   */
  yoursReserved(device: IDevice): number {
    return this._kernels
      .filter(k => k.device === device.id)
      .reduce(
        (sum, k) =>
          sum +
          (k.state === 'running'
            ? Math.max(k.memory_request ?? 0, k.held)
            : k.state === 'released'
              ? k.held
              : 0),
        0
      );
  }

  /**
   * Ask for live updates on behalf of `consumer` (any object); the stream opens when the
   * first consumer comes and the tab is visible.
   */
  hold(consumer: unknown): void {
    this._holders.add(consumer);
    this._update();
  }

  /** Withdraw a consumer; the stream closes when none is left. */
  unhold(consumer: unknown): void {
    this._holders.delete(consumer);
    this._update();
  }

  /** Whether the stream is wanted now. */
  get wanted(): boolean {
    return (
      !this._isDisposed &&
      this._holders.size > 0 &&
      document.visibilityState !== 'hidden'
    );
  }

  /**
   * Read pool and kernels over REST now (after an action, or when the stream failed).
   */
  async refresh(): Promise<void> {
    try {
      this.apply(await this.api.snapshot());
      this._setError(null);
    } catch (error) {
      this._setError(
        error instanceof GPUShareError ? error.message : String(error)
      );
    }
  }

  /** Take a complete state (an event of the stream or a REST snapshot). */
  apply(event: IUsageEvent): void {
    const now = Date.now();
    for (const device of event.pool.devices) {
      const samples = this._history.get(device.uuid) ?? [];
      samples.push({ time: now, value: device.utilization });
      while (samples.length && samples[0].time < now - HISTORY_MS) {
        samples.shift();
      }
      this._history.set(device.uuid, samples);
    }
    this._pool = event.pool;
    this._kernels = event.kernels;
    this._changed.emit();
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    document.removeEventListener('visibilitychange', this._onVisibility);
    this._close();
    Signal.clearData(this);
  }

  private _update(): void {
    if (this.wanted) {
      if (!this._source && this._reopenTimer === null) {
        this._open();
      }
    } else {
      this._close();
    }
  }

  private _open(): void {
    this._setConnection('connecting');
    const source = new this._EventSource(this.api.streamUrl(), {
      withCredentials: true
    });
    this._source = source;
    source.addEventListener('usage', (event: MessageEvent) => {
      if (this._source !== source) {
        return;
      }
      try {
        this.apply(JSON.parse(event.data) as IUsageEvent);
      } catch (error) {
        console.warn('jupyter-gpushare: unreadable usage event', error);
        return;
      }
      this._failures = 0;
      this._setError(null);
      this._setConnection('live');
    });
    source.addEventListener('error', () => {
      if (this._source !== source) {
        return;
      }
      this._setConnection('retrying');
      // The stream may be down for a while (a server restart): show the REST state meanwhile.
      void this.refresh();
      if (source.readyState === source.CLOSED) {
        // The browser gave up (an HTTP error rather than a dropped connection): retry ourselves.
        this._source = null;
        source.close();
        const delay =
          REOPEN_DELAYS_MS[
            Math.min(this._failures, REOPEN_DELAYS_MS.length - 1)
          ];
        this._failures += 1;
        this._reopenTimer = window.setTimeout(() => {
          this._reopenTimer = null;
          this._update();
        }, delay);
      }
    });
  }

  private _close(): void {
    if (this._reopenTimer !== null) {
      window.clearTimeout(this._reopenTimer);
      this._reopenTimer = null;
    }
    if (this._source) {
      this._source.close();
      this._source = null;
    }
    this._setConnection('idle');
  }

  private _setConnection(state: ConnectionState): void {
    if (this._connection !== state) {
      this._connection = state;
      this._changed.emit();
    }
  }

  private _setError(error: string | null): void {
    if (this._error !== error) {
      this._error = error;
      this._changed.emit();
    }
  }

  private _onVisibility = (): void => {
    this._update();
  };

  private _EventSource: typeof EventSource;
  private _source: EventSource | null = null;
  private _reopenTimer: number | null = null;
  private _failures = 0;
  private _holders = new Set<unknown>();
  private _pool: IPool | null = null;
  private _kernels: IKernelSlice[] = [];
  private _history = new Map<string, ISample[]>();
  private _connection: ConnectionState = 'idle';
  private _error: string | null = null;
  private _isDisposed = false;
  private _changed = new Signal<this, void>(this);
}
