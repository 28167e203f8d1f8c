/**
 * The GPU size picker: presets from `GPUShare.sizes`, a custom size checked as it is typed
 * (the rules of SPEC §3, and no larger than the largest device), "no GPU", and the mode where
 * the node offers several. An invalid custom size disables the accept button and says why;
 * nothing is sent until the choice is valid.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { h } from '../dom';
import { checkSize, formatBytes } from '../sizes';

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
        this._custom
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
      } else if (result.kind === 'bytes') {
        note = `${formatBytes(result.bytes)} of GPU memory.`;
      } else if (result.kind === 'percent') {
        note = `${result.percent}% of the GPU the kernel is placed on.`;
      } else {
        note = 'A whole GPU.';
      }
    } else if (chosen === 'none') {
      note = 'The kernel runs without a GPU slice.';
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
      ` ${label}`
    );
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
