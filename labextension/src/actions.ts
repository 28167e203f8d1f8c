/**
 * Which actions a GPU kernel offers now: one answer for the panel's buttons and the commands'
 * `isEnabled`, from the kernel's state and its backend's capabilities (never its kind).
 */

import { ICapabilities, IKernelSlice } from './types';

/** The actions on one kernel (each a command in `commands.ts`). */
export type KernelAction =
  'resize' | 'release' | 'request' | 'suspend' | 'resume' | 'shutdown';

/**
 * Nothing that needs a capability. Every kernel the server lists (`GET kernels`, the stream)
 * carries its backend's capabilities — the server and this extension ship in one wheel — so a
 * kernel without them is a shape this code was not written for: it is offered nothing a
 * capability decides.
 */
const NONE_OFFERED: ICapabilities = {
  can_request: false,
  can_release: false,
  can_suspend: false,
  can_force_shrink: false,
  resize_restarts: false
};

/** The capabilities of a kernel's backend. */
export function capabilitiesOf(kernel: IKernelSlice): ICapabilities {
  return kernel.capabilities ?? NONE_OFFERED;
}

/**
 * Whether `action` is offered for `kernel` now. `release` also withdraws a start still
 * queued (the kernel never starts); `request` asks again for a kernel that gave its slice back.
 */
export function offered(kernel: IKernelSlice, action: KernelAction): boolean {
  const can = capabilitiesOf(kernel);
  const state = kernel.state;
  switch (action) {
    case 'resize':
      return state === 'running';
    case 'release':
      return state === 'queued' || (state === 'running' && can.can_release);
    case 'request':
      return state === 'released' && can.can_request;
    case 'suspend':
      return state === 'running' && can.can_suspend;
    case 'resume':
      return state === 'suspended';
    case 'shutdown':
      return state !== 'queued';
  }
}
