/**
 * The notebook's GPU start indicator, next to its kernel name in the toolbar: while the
 * notebook's gpushare kernel waits for room it says "waiting for GPU (position 2)", with a
 * button that cancels the wait. Hidden the rest of the time.
 */

import { ISessionContext } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { h, setText } from '../dom';
import { IPendingStart, KernelStarts } from './starter';

export const INDICATOR_CLASS = 'jp-gpushare-start-indicator';

/** What the indicator says about a start. */
export function startText(start: IPendingStart): string {
  if (start.phase === 'choosing') {
    return 'choosing a GPU size…';
  }
  if (start.phase === 'waiting') {
    return start.position
      ? `waiting for GPU (position ${start.position})`
      : 'waiting for GPU';
  }
  return 'starting the GPU kernel…';
}

/**
 * The indicator of one notebook.
 */
export class GPUStartIndicator extends Widget {
  constructor(
    private _context: ISessionContext,
    private _starts: KernelStarts
  ) {
    super();
    this.addClass(INDICATOR_CLASS);
    this.node.setAttribute('role', 'status');
    this.node.setAttribute('aria-live', 'polite');
    this._cancel.addEventListener('click', () => {
      this._starts.pending(this._context.path)?.cancel();
    });
    this.node.append(this._text, this._cancel);
    _starts.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._starts.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const start = this._starts.pending(this._context.path);
    // The picker's own dialog says enough while it is open.
    const shown = !!start && start.phase !== 'choosing';
    this.node.hidden = !shown;
    this.node.dataset.phase = start?.phase ?? '';
    setText(this._text, start ? startText(start) : '');
    this.node.title = start?.detail ?? '';
    this._cancel.hidden = !start?.kernelId;
  }

  private _text = h('span', { class: 'jp-gpushare-start-text' });
  private _cancel = h(
    'button',
    {
      class: 'jp-gpushare-start-cancel jp-mod-styled',
      type: 'button',
      'aria-label': 'Cancel the wait for a GPU'
    },
    'Cancel'
  );
}
