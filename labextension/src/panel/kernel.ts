/**
 * A kernel row of the side panel (`.jp-gpushare-kernel`): the notebook (a button that opens
 * it), the slice, a used/slice bar, utilisation, the state or queue position (and the expected
 * wait), the memory its processes hold beyond the slice, how long it has been idle and what its
 * idle timer will do, the warnings, and the actions resize, release (cancel for a start still
 * queued, request for a kernel that gave its slice back), suspend (or resume) and shut down.
 */

import { capabilitiesOf, offered } from '../actions';
import { h, percentOf, setAttr, setText } from '../dom';
import { formatBytes, formatGiB } from '../sizes';
import { IKernelSlice } from '../types';
import { idleText, waitOf } from '../waits';

export const KERNEL_CLASS = 'jp-gpushare-kernel';

/** Above this share of its slice a kernel shows the warning colour. */
export const WARN_RATIO = 0.9;
/** The title of a button whose action this kernel's backend does not offer (a kernel pod). */
const HELD_FOR_LIFE =
  'This kernel keeps its GPU until it ends: shut the kernel down to free it';

/** What the row's buttons do; the plugin provides them. */
export interface IKernelActions {
  /** Open the kernel's notebook. */
  open(kernel: IKernelSlice): void;
  /** Ask for a new size and resize. */
  resize(kernel: IKernelSlice): void;
  /** Release the slice (the kernel keeps running), or withdraw a queued start. */
  release(kernel: IKernelSlice): void;
  /** Ask for a slice again, for a kernel that released its own. */
  request(kernel: IKernelSlice): void;
  /** Move the GPU state to host memory and give the slice back. */
  suspend(kernel: IKernelSlice): void;
  /** Bring a suspended kernel's GPU state back. */
  resume(kernel: IKernelSlice): void;
  /** Shut the kernel down. */
  shutdown(kernel: IKernelSlice): void;
}

/** The notebook of a kernel as the panel shows it. */
export interface INotebookRef {
  /** The label: the notebook's file name, else the kernelspec. */
  label: string;
  /** The server path to open, or null when unknown. */
  path: string | null;
}

/** The level of a kernel's memory use: ok, near its slice, or above it. */
export function usageLevel(kernel: IKernelSlice): 'ok' | 'warn' | 'over' {
  const request = kernel.memory_request ?? 0;
  if (kernel.state !== 'running' || request <= 0) {
    return kernel.warnings.length ? 'warn' : 'ok';
  }
  const ratio = kernel.memory_used / request;
  if (ratio > 1) {
    return 'over';
  }
  return ratio > WARN_RATIO || kernel.warnings.length ? 'warn' : 'ok';
}

/**
 * One row, updated in place; its buttons keep focus across updates.
 */
export class KernelRow {
  constructor(private _actions: IKernelActions) {
    this.node = h(
      'li',
      { class: KERNEL_CLASS },
      h('div', { class: 'jp-gpushare-kernel-head' }, this._open, this._state),
      this._detail,
      this._bar,
      h(
        'div',
        { class: 'jp-gpushare-kernel-figures' },
        this._usage,
        this._util,
        this._source
      ),
      this._idle,
      this._warnings,
      h(
        'div',
        { class: 'jp-gpushare-actions' },
        this._resize,
        this._release,
        this._suspend,
        this._shutdown
      )
    );
    this._bar.append(this._used);
    this._open.addEventListener('click', () => {
      if (this._kernel && this._path) {
        this._actions.open(this._kernel);
      }
    });
    this._resize.addEventListener('click', () => {
      if (this._kernel) {
        this._actions.resize(this._kernel);
      }
    });
    this._release.addEventListener('click', () => {
      if (this._kernel?.state === 'released') {
        this._actions.request(this._kernel);
      } else if (this._kernel) {
        this._actions.release(this._kernel);
      }
    });
    this._suspend.addEventListener('click', () => {
      if (this._kernel?.state === 'suspended') {
        this._actions.resume(this._kernel);
      } else if (this._kernel) {
        this._actions.suspend(this._kernel);
      }
    });
    this._shutdown.addEventListener('click', () => {
      if (this._kernel) {
        this._actions.shutdown(this._kernel);
      }
    });
  }

  /** The row's element. */
  readonly node: HTMLLIElement;

  /** Show a kernel's latest figures. */
  update(kernel: IKernelSlice, notebook: INotebookRef): void {
    this._kernel = kernel;
    this._path = notebook.path;
    const running = kernel.state === 'running';
    const request = kernel.memory_request ?? 0;
    const level = usageLevel(kernel);
    this.node.dataset.kernelId = kernel.kernel_id ?? '';
    this.node.dataset.state = kernel.state;
    this.node.dataset.unused = kernel.unused ? 'true' : '';
    this.node.classList.toggle('jp-mod-warn', level === 'warn');
    this.node.classList.toggle('jp-mod-over', level === 'over');

    setText(this._open, notebook.label);
    this._open.disabled = !notebook.path;
    setAttr(
      this._open,
      'title',
      notebook.path ? `Open ${notebook.path}` : `Kernel ${kernel.kernel_id}`
    );

    let state: string;
    const where = kernel.node ? kernel.node : `GPU${kernel.device}`;
    if (kernel.state === 'queued') {
      const wait = waitOf(kernel);
      state =
        `queued #${kernel.queue_position ?? '?'} · ${kernel.size ?? ''}` +
        (wait ? ` · wait ${wait}` : '');
    } else if (kernel.state === 'released') {
      state = kernel.held
        ? `no GPU (released) · ${formatBytes(kernel.held)} held on GPU${kernel.device}`
        : 'no GPU (released)';
    } else if (kernel.state === 'suspended') {
      state = `suspended · ${kernel.size ?? ''}`;
    } else {
      state = `${kernel.size ?? formatBytes(request)} on ${where} · ${kernel.mode}`;
    }
    if (kernel.unused) {
      // Its notebook's tab closed before it got the kernel: nothing uses it.
      state = `not open · ${state}`;
    }
    setText(this._state, state);
    this._state.className = `jp-gpushare-state jp-gpushare-state-${kernel.state}`;
    // A kernel pod's start in the cluster's words ("pending: 0/4 nodes are available: …"), or
    // where a suspended kernel's GPU state waits.
    const detail =
      kernel.state === 'queued' || kernel.state === 'suspended'
        ? (kernel.detail ?? '')
        : '';
    setText(this._detail, detail);
    this._detail.hidden = !detail;
    // "idle 42 min — will suspend in 18 min": not a live region (it changes every minute).
    const idle = idleText(kernel) ?? '';
    setText(this._idle, idle);
    this._idle.hidden = !idle;

    this._bar.hidden = !running;
    this._used.style.width = percentOf(kernel.memory_used, request);
    setAttr(this._bar, 'aria-valuenow', String(kernel.memory_used));
    setAttr(this._bar, 'aria-valuemax', String(request));
    // Memory held beyond the slice shows as use above it ("3.8 / 1 GiB"), which the ledger
    // keeps reserved; a released kernel's row says what it still holds.
    const usage = running
      ? `${formatGiB(kernel.memory_used)} / ${formatGiB(request)} GiB`
      : '';
    setAttr(this._bar, 'aria-valuetext', usage);
    setText(this._usage, usage);
    setText(
      this._util,
      running
        ? kernel.utilization === null
          ? 'util –'
          : `util ${kernel.utilization}%`
        : ''
    );
    setText(
      this._source,
      kernel.usage_source === 'simulated' ? 'simulated use' : ''
    );

    const warnings = kernel.warnings;
    if (warnings.join('\n') !== this._shownWarnings) {
      this._shownWarnings = warnings.join('\n');
      this._warnings.replaceChildren(
        ...warnings.map(text => h('li', { class: 'jp-gpushare-warning' }, text))
      );
    }
    this._warnings.hidden = warnings.length === 0;

    // Every button follows offered() (actions.ts), as the commands' isEnabled does.
    this._resize.disabled = !offered(kernel, 'resize');
    // One button, three meanings: release a running slice, withdraw a queued start (the
    // kernel never starts), ask again for a kernel that gave its slice back. A backend that
    // cannot give memory back (a kernel pod) holds the GPU for the kernel's life.
    const queued = kernel.state === 'queued';
    const released = kernel.state === 'released';
    const can = capabilitiesOf(kernel);
    setText(
      this._release,
      queued ? 'Cancel' : released ? 'Request…' : 'Release'
    );
    this._release.disabled = !(
      offered(kernel, 'release') || offered(kernel, 'request')
    );
    setAttr(
      this._release,
      'title',
      running && !can.can_release
        ? HELD_FOR_LIFE
        : queued
          ? 'Withdraw the start from the queue: the kernel never starts'
          : released
            ? can.can_request
              ? 'Ask for a GPU slice again (it waits in the queue when the GPUs are full)'
              : HELD_FOR_LIFE
            : 'Release the GPU slice; the kernel keeps running'
    );
    // A queued start has no kernel to shut down yet: Cancel withdraws it.
    this._shutdown.disabled = !offered(kernel, 'shutdown');
    const suspended = kernel.state === 'suspended';
    setText(this._suspend, suspended ? 'Resume' : 'Suspend');
    this._suspend.disabled = !(
      offered(kernel, 'suspend') || offered(kernel, 'resume')
    );
    const name = notebook.label;
    setAttr(
      this._suspend,
      'aria-label',
      suspended
        ? `Resume the GPU state of ${name}`
        : `Suspend the GPU state of ${name}`
    );
    setAttr(
      this._suspend,
      'title',
      suspended
        ? 'Wait for a GPU slice and restore the GPU state'
        : !can.can_suspend
          ? can.can_release
            ? 'Suspending is not offered for this kernel: release its slice instead'
            : HELD_FOR_LIFE
          : 'Move the GPU state to host memory and give the slice back; the next cell resumes it'
    );
    setAttr(this._resize, 'aria-label', `Resize the GPU slice of ${name}`);
    setAttr(
      this._release,
      'aria-label',
      queued
        ? `Cancel the GPU start of ${name}`
        : released
          ? `Request a GPU slice for ${name}`
          : `Release the GPU slice of ${name}`
    );
    setAttr(this._shutdown, 'aria-label', `Shut down the kernel of ${name}`);
  }

  private _kernel: IKernelSlice | null = null;
  private _path: string | null = null;
  private _shownWarnings = '';
  private _detail = h('div', { class: 'jp-gpushare-detail', role: 'status' });
  private _idle = h('div', { class: 'jp-gpushare-idle' });
  private _open = h('button', {
    class: 'jp-gpushare-open',
    type: 'button'
  });
  private _state = h('span', { class: 'jp-gpushare-state' });
  private _bar = h('div', {
    class: 'jp-gpushare-bar',
    role: 'meter',
    'aria-label': 'GPU memory used of the slice',
    'aria-valuemin': '0'
  });
  private _used = h('div', { class: 'jp-gpushare-seg jp-gpushare-seg-used' });
  private _usage = h('span', { class: 'jp-gpushare-usage' });
  private _util = h('span', { class: 'jp-gpushare-util' });
  private _source = h('span', { class: 'jp-gpushare-source' });
  private _warnings = h('ul', {
    class: 'jp-gpushare-warnings',
    'aria-label': 'Warnings'
  });
  private _resize = h(
    'button',
    { class: 'jp-gpushare-action jp-gpushare-resize', type: 'button' },
    'Resize'
  );
  private _release = h(
    'button',
    { class: 'jp-gpushare-action jp-gpushare-release', type: 'button' },
    'Release'
  );
  private _suspend = h(
    'button',
    { class: 'jp-gpushare-action jp-gpushare-suspend', type: 'button' },
    'Suspend'
  );
  private _shutdown = h(
    'button',
    { class: 'jp-gpushare-action jp-gpushare-shutdown', type: 'button' },
    'Shut down'
  );
}
