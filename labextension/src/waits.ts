/**
 * Words for time: how long a queued start is expected to wait ("about 6 min"), and what an
 * idle kernel's timer will do ("idle 42 min — will suspend in 18 min").
 *
 * `describeWait` says what `jupyter_gpushare/core/placement/wait_estimate.py`'s `describe` says, so the
 * picker (whose words come from the server) and the status bar (whose words come from here)
 * agree.
 */

import { IKernelSlice } from './types';

/** "about 6 min", "less than a minute", "about 1.5 h"; "unknown" for null. */
export function describeWait(seconds: number | null): string {
  if (seconds === null) {
    return 'unknown';
  }
  if (seconds < 60) {
    return 'less than a minute';
  }
  const minutes = Math.round(seconds / 60);
  if (minutes < 90) {
    return `about ${minutes} min`;
  }
  const hours = seconds / 3600;
  return hours >= 10
    ? `about ${hours.toFixed(0)} h`
    : `about ${hours.toFixed(1).replace(/\.0$/, '')} h`;
}

/**
 * The expected wait of a queued start: "about 6 min" or "unknown"; null where the server does
 * not estimate it (the field is absent).
 */
export function waitOf(kernel: IKernelSlice, now = Date.now()): string | null {
  if (kernel.state !== 'queued' || kernel.expected_start === undefined) {
    return null;
  }
  const expected = kernel.expected_start;
  return describeWait(
    expected === null ? null : Math.max(0, expected - now / 1000)
  );
}

/** A duration in whole minutes or hours: "42 min", "2 h 5 min", "<1 min". */
export function shortDuration(seconds: number): string {
  if (seconds < 60) {
    return '<1 min';
  }
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const rest = minutes % 60;
  return rest
    ? `${Math.floor(minutes / 60)} h ${rest} min`
    : `${minutes / 60} h`;
}

/**
 * What a running kernel's row says of its idleness: "idle 42 min — will suspend in 18 min",
 * "idle 3 min" (no idle timer); null while a cell runs or where nothing is known.
 */
export function idleText(
  kernel: IKernelSlice,
  now = Date.now()
): string | null {
  if (
    kernel.state !== 'running' ||
    kernel.idle_since === undefined ||
    kernel.idle_since === null
  ) {
    return null;
  }
  const seconds = now / 1000;
  let text = `idle ${shortDuration(Math.max(0, seconds - kernel.idle_since))}`;
  const at = kernel.idle_action_at;
  const action = kernel.idle_action;
  if (action && at !== undefined && at !== null) {
    text +=
      at > seconds
        ? ` — will ${action} in ${shortDuration(at - seconds)}`
        : ` — ${action === 'suspend' ? 'suspending' : 'releasing'} now`;
  }
  return text;
}
