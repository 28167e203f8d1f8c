/**
 * The side panel `#jp-gpushare-panel`: a card per device, a row per kernel of this server,
 * the queue, whether the pool is simulated, and the Usage chart of the last day. It holds the
 * model (so the stream runs) only while it is visible, and asks for the usage only then.
 */

import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { h, setText } from '../dom';
import { gpuIcon } from '../icons';
import { GPUShareModel } from '../model';
import { IKernelSlice } from '../types';
import { DeviceCard } from './device';
import { IKernelActions, INotebookRef, KernelRow } from './kernel';
import { USAGE_REFRESH_MS, USAGE_SINCE, UsageView } from './usage';

/** How often the rows' words about time ("idle 42 min") are renewed while shown (ms). */
const CLOCK_MS = 15_000;

export const PANEL_ID = 'jp-gpushare-panel';

/** The options of the panel. */
export interface IPanelOptions {
  model: GPUShareModel;
  actions: IKernelActions;
  /** The notebook a kernel belongs to (from the running sessions). */
  notebookOf: (kernel: IKernelSlice) => INotebookRef;
}

/**
 * The GPU side panel.
 */
export class GPUSharePanel extends Widget {
  constructor(options: IPanelOptions) {
    super();
    this._model = options.model;
    this._actions = options.actions;
    this._notebookOf = options.notebookOf;
    this._usage = new UsageView(() => this._model.api.usage(USAGE_SINCE));
    this.id = PANEL_ID;
    this.addClass('jp-gpushare-panel');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU sharing';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU sharing');
    this.node.append(
      h(
        'header',
        { class: 'jp-gpushare-header' },
        h('h2', { class: 'jp-gpushare-title' }, 'GPUs'),
        this._badge,
        this._connection
      ),
      this._error,
      h(
        'section',
        { class: 'jp-gpushare-section', 'aria-label': 'GPU devices' },
        this._devices,
        this._noDevices
      ),
      h(
        'section',
        { class: 'jp-gpushare-section', 'aria-label': 'Your GPU kernels' },
        h('h3', { class: 'jp-gpushare-subtitle' }, 'Your kernels'),
        this._kernels,
        this._noKernels
      ),
      this._queue,
      this._usage.node
    );
    this._model.changed.connect(this.render, this);
    this.render();
  }

  /** Re-read the sessions (a notebook opened, renamed or closed) and render. */
  sessionsChanged(): void {
    this.render();
  }

  /** Show the model's latest state. */
  render(): void {
    const model = this._model;
    const pool = model.pool;
    this._badge.hidden = !pool?.simulated;
    setText(this._connection, CONNECTION_LABELS[model.connection]);
    this._connection.dataset.state = model.connection;
    // The server's own problem (the cluster cannot be read, the ledger cannot be used) shows
    // like ours: a banner with the sentence that names the fix.
    const problem = model.error ?? pool?.problem ?? '';
    this._error.hidden = !problem;
    setText(this._error, problem);

    // Devices, keyed by uuid.
    const devices = pool?.devices ?? [];
    const seenDevices = new Set<string>();
    devices.forEach((device, index) => {
      seenDevices.add(device.uuid);
      let card = this._deviceCards.get(device.uuid);
      if (!card) {
        card = new DeviceCard();
        this._deviceCards.set(device.uuid, card);
      }
      const yours = model.yoursReserved(device);
      card.update({
        device,
        yours: Math.min(yours, device.memory_reserved),
        others: model.othersReserved(device),
        overcommit: pool?.overcommit ?? 1,
        history: model.history(device)
      });
      if (this._devices.children[index] !== card.node) {
        this._devices.insertBefore(
          card.node,
          this._devices.children[index] ?? null
        );
      }
    });
    for (const [uuid, card] of this._deviceCards) {
      if (!seenDevices.has(uuid)) {
        card.node.remove();
        this._deviceCards.delete(uuid);
      }
    }
    // A pool with a problem is empty because of it: the banner says why, not "no GPU".
    this._noDevices.hidden =
      devices.length > 0 || pool === null || !!pool.problem;
    setText(this._noDevices, pool === null ? '' : 'No GPU in this pool.');

    // Kernels of this server (others' slices appear only as occupancy on the devices).
    const kernels = model.kernels.filter(k => k.kernel_id);
    const seenKernels = new Set<string>();
    kernels.forEach((kernel, index) => {
      const id = kernel.kernel_id as string;
      seenKernels.add(id);
      let row = this._kernelRows.get(id);
      if (!row) {
        row = new KernelRow(this._actions);
        this._kernelRows.set(id, row);
      }
      row.update(kernel, this._notebookOf(kernel));
      if (this._kernels.children[index] !== row.node) {
        this._kernels.insertBefore(
          row.node,
          this._kernels.children[index] ?? null
        );
      }
    });
    for (const [id, row] of this._kernelRows) {
      if (!seenKernels.has(id)) {
        row.node.remove();
        this._kernelRows.delete(id);
      }
    }
    this._noKernels.hidden = kernels.length > 0;

    // The queue: how many wait, anonymous unless they are ours.
    const queue = pool?.queue ?? [];
    this._queue.hidden = queue.length === 0;
    const mine = queue.filter(entry => entry.kernel_id !== null).length;
    setText(
      this._queue,
      queue.length === 0
        ? ''
        : `${queue.length} request${queue.length === 1 ? '' : 's'} waiting for room` +
            (mine ? ` (${mine} yours)` : '')
    );
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this._model.hold(this);
    }
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.hold(this);
    void this._model.refresh();
    this._startTimers();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.unhold(this);
    this._stopTimers();
  }

  protected onBeforeDetach(msg: Message): void {
    this._model.unhold(this);
    this._stopTimers();
    super.onBeforeDetach(msg);
  }

  private _startTimers(): void {
    this._stopTimers();
    void this._usage.refresh();
    this._usageTimer = window.setInterval(
      () => void this._usage.refresh(),
      USAGE_REFRESH_MS
    );
    this._clockTimer = window.setInterval(() => this.render(), CLOCK_MS);
  }

  private _stopTimers(): void {
    window.clearInterval(this._usageTimer);
    window.clearInterval(this._clockTimer);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.unhold(this);
    this._stopTimers();
    this._model.changed.disconnect(this.render, this);
    super.dispose();
  }

  private _model: GPUShareModel;
  private _actions: IKernelActions;
  private _notebookOf: (kernel: IKernelSlice) => INotebookRef;
  private _usage: UsageView;
  private _usageTimer = 0;
  private _clockTimer = 0;
  private _deviceCards = new Map<string, DeviceCard>();
  private _kernelRows = new Map<string, KernelRow>();
  private _badge = h(
    'span',
    {
      class: 'jp-gpushare-simulated-badge',
      title: 'A simulated pool: devices and usage are declared, not measured'
    },
    'simulated'
  );
  private _connection = h('span', {
    class: 'jp-gpushare-connection',
    'aria-live': 'polite'
  });
  private _error = h('div', { class: 'jp-gpushare-error', role: 'alert' });
  private _devices = h('ul', {
    class: 'jp-gpushare-devices',
    'aria-label': 'Devices'
  });
  private _noDevices = h('p', { class: 'jp-gpushare-empty' });
  private _kernels = h('ul', {
    class: 'jp-gpushare-kernels',
    'aria-label': 'Kernels'
  });
  private _noKernels = h(
    'p',
    { class: 'jp-gpushare-empty' },
    'No GPU kernel yet: start a notebook with a "GPU" kernel from the launcher.'
  );
  private _queue = h('p', { class: 'jp-gpushare-queue' });
}

const CONNECTION_LABELS = {
  idle: '',
  connecting: 'connecting…',
  live: 'live',
  retrying: 'reconnecting…'
};
