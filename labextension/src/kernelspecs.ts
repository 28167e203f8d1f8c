/**
 * Which kernelspecs are gpushare kernelspecs (docs/admins/configuration.md), and what slice each asks for.
 */

import { KernelSpec } from '@jupyterlab/services';

export const PROVISIONER_NAME = 'gpushare-provisioner';

/** The slice a gpushare kernelspec asks for. */
export interface ISpecSlice {
  name: string;
  memory: string | null;
  mode: string | null;
}

/**
 * The slice of a kernelspec, or null when it does not use `gpushare-provisioner`.
 */
export function specSlice(
  spec: KernelSpec.ISpecModel | undefined
): ISpecSlice | null {
  const stanza = (spec?.metadata as any)?.kernel_provisioner;
  if (!spec || !stanza || stanza.provisioner_name !== PROVISIONER_NAME) {
    return null;
  }
  const config = stanza.config ?? {};
  const memory = config.gpu_memory;
  return {
    name: spec.name,
    memory:
      typeof memory === 'number'
        ? `${memory}M`
        : typeof memory === 'string'
          ? memory
          : null,
    mode: typeof config.gpu_mode === 'string' ? config.gpu_mode : null
  };
}
