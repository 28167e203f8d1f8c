/**
 * The status bar item of the current notebook's GPU kernel: `GPU2 · 2.1 of 4 GiB used` (the
 * device first, then the use: "GPU 0 / 4 GiB" read like device 0), in the
 * warning colour above 90% of the slice or with a warning; a click (or Enter) opens the panel.
 * It shows only while the current notebook runs a gpushare kernel, and holds the model (so
 * the stream runs) only then.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { h, setAttr, setText } from '../dom';
import { gpuIcon } from '../icons';
import { GPUShareModel } from '../model';
import { usageLevel } from '../panel/kernel';
import { formatGiB } from '../sizes';
import { waitOf } from '../waits';

export const STATUS_CLASS = 'jp-gpushare-status';

/**
 * The item's widget.
 */
export class GPUStatusItem extends Widget {
  constructor(
    private _model: GPUShareModel,
    private _notebooks: INotebookTracker,
    private _isGPUKernel: (kernelName: string) => boolean,
    private _openPanel: () => void
  ) {
    super();
    this.addClass(STATUS_CLASS);
    this.addClass('jp-StatusBar-GroupItem');
    this.node.setAttribute('role', 'button');
    this.node.setAttribute('tabindex', '0');
    const icon = h('span', { class: 'jp-gpushare-status-icon' });
    gpuIcon.element({ container: icon, height: '16px', width: '16px' });
    this.node.append(icon, this._text);
    this.node.addEventListener('click', () => this._openPanel());
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        this._openPanel();
      }
    });
    _model.changed.connect(this._render, this);
    _notebooks.currentChanged.connect(this._follow, this);
    this._follow();
  }

  /** Whether the current notebook runs a GPU kernel of this server. */
  get isActiveItem(): boolean {
    return this._active;
  }

  /** Emitted when the item appears or disappears. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.unhold(this);
    Signal.clearData(this);
    super.dispose();
  }

  /** Track the current notebook and its kernel changes. */
  private _follow(): void {
    const context = this._notebooks.currentWidget?.sessionContext ?? null;
    if (context !== this._context) {
      this._context?.kernelChanged.disconnect(this._onKernel, this);
      this._context = context;
      this._context?.kernelChanged.connect(this._onKernel, this);
    }
    this._onKernel();
  }

  private _onKernel(): void {
    // Hold the model while the current notebook runs a GPU kernel.
    const kernel = this._context?.session?.kernel;
    if (kernel && this._isGPUKernel(kernel.name)) {
      this._model.hold(this);
      void this._model.refresh();
    } else {
      this._model.unhold(this);
    }
    this._render();
  }

  private _render(): void {
    const kernelId = this._context?.session?.kernel?.id;
    const kernel = this._model.kernel(kernelId);
    const active = !!kernel;
    if (kernel) {
      let text: string;
      if (kernel.state === 'running') {
        // On Kubernetes the kernel runs on a GPU node, named.
        const where =
          kernel.node ??
          (kernel.device !== null ? `GPU${kernel.device}` : 'GPU');
        text =
          `${where} · ${formatGiB(kernel.memory_used)} of ` +
          `${formatGiB(kernel.memory_request ?? 0)} GiB used`;
      } else if (kernel.state === 'queued') {
        const wait = waitOf(kernel);
        text =
          `GPU queued #${kernel.queue_position ?? '?'}` +
          (wait ? ` · ${wait}` : '');
      } else if (kernel.state === 'suspended') {
        text = 'GPU suspended';
      } else {
        text = 'GPU released';
      }
      setText(this._text, text);
      const level = usageLevel(kernel);
      this.toggleClass('jp-mod-warn', level !== 'ok');
      this.toggleClass('jp-mod-over', level === 'over');
      // A running kernel's text names its device already.
      const device =
        kernel.device !== null && kernel.state !== 'running'
          ? ` on GPU${kernel.device}`
          : '';
      const details = [
        `${text} (${kernel.size ?? 'no slice'}${device})`,
        ...kernel.warnings
      ];
      setAttr(
        this.node,
        'title',
        `${details.join('\n')}\nClick to open the GPU panel.`
      );
      setAttr(
        this.node,
        'aria-label',
        `${text}${kernel.warnings.length ? `; ${kernel.warnings.join('; ')}` : ''}. Opens the GPU panel.`
      );
    }
    if (active !== this._active) {
      this._active = active;
      this._activeStateChanged.emit();
    }
  }

  private _text = h('span', { class: 'jp-gpushare-status-text' });
  private _context: ISessionContext | null = null;
  private _active = false;
  private _activeStateChanged = new Signal<this, void>(this);
}
