/**
 * The size picker of a kernel start: what {@link KernelStarts} asks before it starts a
 * gpushare kernel. It offers the presets of `GPUShare.sizes` and a custom size, each with what
 * a start would do now (`GET fit`), the modes this pool honours, and first the notebook's last
 * pick (kept per notebook path in the state database), else the kernelspec's size, else the
 * configured default.
 */

import { IStateDB } from '@jupyterlab/statedb';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { GPUShareAPI } from '../api';
import { ISpecSlice } from '../kernelspecs';
import { GPUShareModel } from '../model';
import { IStartRequest, Picker } from '../starts/starter';
import { IGPUShareConfig } from '../types';
import { IPick, pickSize } from './dialog';

/** The state database key of the remembered choices. */
export const STATE_KEY = 'jupyter-gpushare:picks';

type Remembered = { [path: string]: { memory: string | null; mode: string } };

/** What the start picker needs. */
export interface IStartPickerOptions {
  api: GPUShareAPI;
  model: GPUShareModel;
  config: () => Promise<IGPUShareConfig>;
  state: IStateDB | null;
}

/**
 * The picker the UI plugin gives {@link KernelStarts}.
 */
export function startPicker(options: IStartPickerOptions): Picker {
  const { api, model, state } = options;
  let memory: Remembered = {};

  const remembered = async (): Promise<Remembered> => {
    if (!state) {
      return memory;
    }
    try {
      return ((await state.fetch(STATE_KEY)) as unknown as Remembered) ?? {};
    } catch {
      return memory;
    }
  };

  const remember = async (path: string, pick: IPick): Promise<void> => {
    memory = { ...(await remembered()), [path]: { ...pick } };
    if (state) {
      await state.save(
        STATE_KEY,
        memory as unknown as ReadonlyPartialJSONObject
      );
    }
  };

  return async (
    request: IStartRequest,
    slice: ISpecSlice
  ): Promise<IPick | null> => {
    const config = await options.config();
    const last = (await remembered())[request.path];
    const mode = slice.mode ?? config.default_mode;
    const offered: string[] = config.modes;
    const modes = offered.includes(mode) ? offered : [mode, ...offered];
    const name = request.path.split('/').pop() || request.path;
    const pick = await pickSize({
      title: `GPU for ${name}`,
      sizes: config.sizes,
      current: last?.memory ?? slice.memory ?? config.default_memory,
      allowNone: false,
      modes,
      mode: last && modes.includes(last.mode) ? last.mode : mode,
      deviceMemory: (model.pool ?? (await api.pool())).devices.map(
        device => device.memory_total
      ),
      acceptLabel: 'Start',
      fit: (sizes, chosenMode) => api.fit(sizes, chosenMode)
    });
    if (pick) {
      await remember(request.path, pick);
    }
    return pick;
  };
}
