/**
 * The GPU size picker: presets from `GPUShare.sizes`, a custom size checked as it is typed
 * (the rules of docs/users/sizes.md, and no larger than the largest device), "no GPU", and the mode where
 * the node offers several. An invalid custom size disables the accept button and says why;
 * nothing is sent until the choice is valid.
 *
 * Given a `fit` function (`GET fit`, the server's dry run of a start), each choice also says
 * what a start of that size would do now — "fits now on GPU1, 36G free", "queue position 2",
 * "larger than any card" — kept current while the dialog is open; a choice that can never
 * start cannot be accepted.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { h, setText } from '../dom';
import { checkSize, formatBytes } from '../sizes';
import { IFit } from '../types';

/** How often the answers of `fit` are renewed while the picker is open (ms). */
export const FIT_REFRESH_MS = 1000;

export const PICKER_CLASS = 'jp-gpushare-picker';

/** A choice: a size (null for no GPU) and a mode. */
export interface IPick {
  memory: string | null;
  mode: string;
}

/** What the picker offers. */
export interface IPickerOptions {
  /** The dialog title. */
  title: string;
  /** Preset sizes, in order. */
  sizes: string[];
  /** The size to select first (a preset, or a custom size), or null for no GPU. */
  current: string | null;
  /** Whether "no GPU" is offered. */
  allowNone: boolean;
  /** The modes to choose from; no mode selector with fewer than two. */
  modes: string[];
  /** The mode to select first. */
  mode: string;
  /** Memory of each device, to refuse sizes larger than any of them. */
  deviceMemory: number[];
  /** The accept button's label. */
  acceptLabel?: string;
  /** What starting each size in a mode would do now (the server's dry run); none: not shown. */
  fit?: (sizes: string[], mode: string) => Promise<IFit[]>;
}

let counter = 0;

/**
 * The body of the picker dialog.
 */
export class SizePicker extends Widget implements Dialog.IBodyWidget<IPick> {
  constructor(private _options: IPickerOptions) {
    super();
    this.addClass(PICKER_CLASS);
    const group = `jp-gpushare-size-${++counter}`;
    const presets = _options.sizes;
    const current = _options.current;
    const currentIsPreset =
      current !== null &&
      presets.some(p => p.toLowerCase() === current.toLowerCase());

    const fieldset = h(
      'fieldset',
      { class: 'jp-gpushare-picker-sizes' },
      h('legend', {}, 'GPU memory')
    );
    for (const size of presets) {
      const checked =
        current !== null && size.toLowerCase() === current.toLowerCase();
      fieldset.append(
        this._radio(group, size, size === 'whole' ? 'Whole GPU' : size, checked)
      );
    }
    this._customRadio = this._radioInput(
      group,
      'custom',
      current !== null && !currentIsPreset
    );
    this._custom = h('input', {
      class: 'jp-mod-styled jp-gpushare-custom',
      type: 'text',
      placeholder: 'e.g. 6G, 512M, 25%',
      'aria-label': 'Custom GPU size',
      spellcheck: 'false',
      autocomplete: 'off'
    });
    if (current !== null && !currentIsPreset) {
      this._custom.value = current;
    }
    const customId = `${group}-custom-input`;
    this._custom.id = customId;
    fieldset.append(
      h(
        'div',
        { class: 'jp-gpushare-picker-option jp-gpushare-picker-custom' },
        h('label', {}, this._customRadio, ' Custom: '),
        this._custom,
        this._fitNote('custom')
      )
    );
    if (_options.allowNone) {
      fieldset.append(this._radio(group, 'none', 'No GPU', current === null));
    }
    this._message = h('div', {
      class: 'jp-gpushare-picker-message',
      role: 'status',
      'aria-live': 'polite'
    });
    this._custom.setAttribute('aria-describedby', `${group}-message`);
    this._message.id = `${group}-message`;
    this.node.append(fieldset, this._message);

    if (_options.modes.length > 1) {
      this._mode = h('select', {
        class: 'jp-mod-styled jp-gpushare-mode',
        'aria-label': 'GPU sharing mode'
      });
      for (const mode of _options.modes) {
        const option = h('option', { value: mode }, mode);
        option.selected = mode === _options.mode;
        this._mode.append(option);
      }
      this.node.append(
        h('label', { class: 'jp-gpushare-picker-mode' }, 'Mode ', this._mode)
      );
    }

    const onInput = (event: Event) => {
      if (this._resyncing) {
        return;
      }
      if (event.target === this._custom) {
        this._customRadio.checked = true;
        this._showFits();
        window.clearTimeout(this._customTimer);
        this._customTimer = window.setTimeout(() => {
          void this._refreshFits();
        }, 250);
      }
      if (event.target === this._mode) {
        this._fits.clear();
        this._showFits();
        void this._refreshFits();
      }
      this._validate();
    };
    this.node.addEventListener('input', onInput, true);
    this.node.addEventListener('change', onInput, true);
    this._custom.addEventListener('focus', () => {
      this._customRadio.checked = true;
      this._validate();
    });
    // Enter in an invalid custom size must not accept the dialog.
    this._custom.addEventListener(
      'keydown',
      event => {
        if (event.key === 'Enter' && !this.isValid) {
          event.preventDefault();
          event.stopPropagation();
        }
      },
      true
    );
  }

  /** Whether the current choice can be sent. */
  get isValid(): boolean {
    return this._problem === null;
  }

  /** The chosen size and mode (only meaningful when `isValid`). */
  getValue(): IPick {
    const mode = this._mode?.value ?? this._options.mode;
    const chosen = this._chosen();
    if (chosen === 'none') {
      return { memory: null, mode };
    }
    if (chosen === 'custom') {
      return { memory: this._custom.value.trim(), mode };
    }
    return { memory: chosen ?? this._options.current, mode };
  }

  protected onAfterAttach(): void {
    this._validate();
    if (this._options.fit) {
      void this._refreshFits();
      this._fitTimer = window.setInterval(() => {
        void this._refreshFits();
      }, FIT_REFRESH_MS);
    }
  }

  private _chosen(): string | null {
    const checked = this.node.querySelector<HTMLInputElement>(
      'input[type="radio"]:checked'
    );
    return checked ? checked.value : null;
  }

  private _validate(): void {
    const chosen = this._chosen();
    let problem: string | null = null;
    let note = '';
    if (chosen === null) {
      problem = 'Choose a size.';
    } else if (chosen === 'custom') {
      const result = checkSize(this._custom.value, this._options.deviceMemory);
      if (!result.ok) {
        problem = capitalise(result.message);
      } else if (result.form === 'bytes') {
        note = `${formatBytes(result.bytes)} of GPU memory.`;
      } else if (result.form === 'percent') {
        note = `${result.percent}% of the GPU the kernel is placed on.`;
      } else {
        note = 'A whole GPU.';
      }
    } else if (chosen === 'none') {
      note = 'The kernel runs without a GPU slice.';
    }
    const fit = chosen ? this._fits.get(chosen) : undefined;
    const fresh =
      fit &&
      (chosen !== 'custom' || fit.gpu_memory === this._custom.value.trim());
    if (
      problem === null &&
      fit &&
      fresh &&
      ['never', 'full'].includes(fit.verdict)
    ) {
      // The server would refuse it: say why rather than send it.
      problem = `${fit.gpu_memory} cannot start: ${fit.reason ?? fit.summary}`;
    } else if (problem === null && fit && fresh && fit.verdict === 'queue') {
      note = `Waits for room (${fit.summary}): ${fit.reason ?? ''}`;
    }
    this._problem = problem;
    const invalidInput = problem !== null && chosen === 'custom';
    this._custom.classList.toggle('jp-mod-error', invalidInput);
    this._custom.setCustomValidity(invalidInput ? (problem as string) : '');
    this._custom.setAttribute('aria-invalid', invalidInput ? 'true' : 'false');
    this._message.textContent = problem ?? note;
    // `.jp-mod-error` is what the dialog's own check looks for to refuse accepting.
    this._message.classList.toggle('jp-mod-error', problem !== null);
    this._message.classList.toggle(
      'jp-gpushare-picker-problem',
      problem !== null
    );
    // The dialog's accept button, disabled while the choice is invalid.
    const dialog = this.node.closest('.jp-Dialog');
    dialog
      ?.querySelectorAll<HTMLButtonElement>('.jp-Dialog-button.jp-mod-accept')
      .forEach(button => {
        button.disabled = problem !== null;
      });
    // The dialog re-checks its inputs on every `input` event, but in the capture phase of the
    // document, before this body could update: let it check again now.
    this._resyncing = true;
    try {
      this.node.dispatchEvent(new Event('input', { bubbles: true }));
    } finally {
      this._resyncing = false;
    }
  }

  private _radio(
    group: string,
    value: string,
    label: string,
    checked: boolean
  ): HTMLElement {
    return h(
      'label',
      { class: 'jp-gpushare-picker-option' },
      this._radioInput(group, value, checked),
      ` ${label}`,
      this._fitNote(value)
    );
  }

  /** The place where a choice says what a start would do (empty until the server answers). */
  private _fitNote(value: string): HTMLElement {
    const note = h('span', { class: 'jp-gpushare-fit', 'data-verdict': '' });
    if (this._options.fit && value !== 'none') {
      this._fitNotes.set(value, note);
    }
    return note;
  }

  /** Ask the server what each choice would do now, and show it. */
  private async _refreshFits(): Promise<void> {
    const fit = this._options.fit;
    if (!fit || this.isDisposed) {
      return;
    }
    const asked: [string, string][] = this._options.sizes.map(size => [
      size,
      size
    ]);
    const custom = this._custom.value.trim();
    const parsed = checkSize(custom, this._options.deviceMemory);
    if (custom && parsed.ok) {
      asked.push(['custom', custom]); // only a size the picker accepts is ever sent
    } else {
      this._fits.delete('custom');
    }
    const request = ++this._fitRequest;
    let answers: IFit[];
    try {
      answers = await fit(
        asked.map(([, size]) => size),
        this._mode?.value ?? this._options.mode
      );
    } catch (error) {
      console.warn('jupyter-gpushare: no dry run of the start', error);
      return;
    }
    if (request !== this._fitRequest || this.isDisposed) {
      return; // an answer to an older question (the custom size changed since)
    }
    asked.forEach(([key], index) => {
      if (answers[index]) {
        this._fits.set(key, answers[index]);
      }
    });
    this._showFits();
    this._validate();
  }

  private _showFits(): void {
    const custom = this._custom.value.trim();
    for (const [key, note] of this._fitNotes) {
      const fit = this._fits.get(key);
      const current = key !== 'custom' || (fit && fit.gpu_memory === custom);
      setText(note, fit && current ? fit.summary : '');
      note.dataset.verdict = fit && current ? fit.verdict : '';
      note.title = fit && current ? (fit.reason ?? '') : '';
    }
  }

  protected onAfterDetach(msg: Message): void {
    window.clearInterval(this._fitTimer);
    window.clearTimeout(this._customTimer);
    super.onAfterDetach(msg);
  }

  private _radioInput(
    group: string,
    value: string,
    checked: boolean
  ): HTMLInputElement {
    // Named by the <label> around it.
    const input = h('input', { type: 'radio', name: group, value });
    input.checked = checked;
    return input;
  }

  private _custom: HTMLInputElement;
  private _customRadio: HTMLInputElement;
  private _message: HTMLElement;
  private _mode: HTMLSelectElement | null = null;
  private _problem: string | null = null;
  private _resyncing = false;
  private _fits = new Map<string, IFit>();
  private _fitNotes = new Map<string, HTMLElement>();
  private _fitRequest = 0;
  private _fitTimer = 0;
  private _customTimer = 0;
}

function capitalise(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/**
 * Show the picker; the choice, or null when cancelled.
 */
export async function pickSize(options: IPickerOptions): Promise<IPick | null> {
  const body = new SizePicker(options);
  const result = await showDialog<IPick>({
    title: options.title,
    body,
    buttons: [
      Dialog.cancelButton(),
      Dialog.okButton({ label: options.acceptLabel ?? 'Apply' })
    ],
    focusNodeSelector: 'input[type="radio"]:checked'
  });
  if (!result.button.accept || !result.value || !body.isValid) {
    return null;
  }
  return result.value;
}
