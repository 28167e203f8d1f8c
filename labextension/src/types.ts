/**
 * The REST payloads of `{base_url}api/gpushare/`, as the package's OpenAPI document
 * (`jupyter_gpushare/openapi.yaml`) describes them.
 *
 * Each interface names its schema with `@schema`; `tests/unit/test_labextension_types.py`
 * compares every property (name, optional or required, nullable, enum values, element type)
 * with the document, so a field added or renamed on the server fails the tests until it is
 * mirrored here.
 */

/**
 * How a slice is shared and enforced (docs/how-it-works/modes.md): the name of one of the modes
 * installed where the server runs. The names come from the server (`GET config`'s `modes`),
 * never from a list of our own: a package may add a mode.
 *
 * @schema Mode
 */
export type Mode = string;

/**
 * `GET pool`: the devices, what is reserved and used on each, and the queue.
 *
 * @schema Pool
 */
export interface IPool {
  backend: 'local' | 'kubernetes';
  simulated: boolean;
  overcommit: number;
  devices: IDevice[];
  queue: IQueueEntry[];
  // Why the view is empty or stale, with its fix (the panel's banner): the cluster cannot be
  // read, or the node's ledger file cannot be used.
  problem?: string;
}

/**
 * One GPU of the pool; `memory_reserved` counts every user's slices on it.
 *
 * @schema Device
 */
export interface IDevice {
  id: number;
  uuid: string;
  name: string;
  memory_total: number;
  memory_reserved: number;
  memory_used: number;
  utilization: number | null;
  modes: Mode[];
  mig: IMigInstance[];
  node?: string;
  cards?: number | null;
  sharing?: string | null;
  allocatable?: Record<string, string>;
}

/**
 * A MIG instance of a device.
 *
 * @schema MigInstance
 */
export interface IMigInstance {
  uuid: string;
  profile: string;
  memory_total: number;
  kernel_id: string | null;
  in_use: boolean;
}

/**
 * A request waiting for room; another user's is anonymous.
 *
 * @schema QueueEntry
 */
export interface IQueueEntry {
  position: number;
  kernel_id: string | null;
  owner: string;
  memory_request: number | null;
  size: string;
  mode: Mode;
  requested_at: number;
  reason?: string | null;
}

/**
 * One GPU kernel of this server (`GET kernels`, `GET kernels/{id}`).
 *
 * @schema Kernel
 */
export interface IKernelSlice {
  kernel_id: string | null;
  kernel_name: string;
  path: string;
  owner: string;
  state: 'queued' | 'running' | 'released' | 'suspended';
  queue_position: number | null;
  device: number | null;
  mode: Mode | null;
  memory_request: number | null;
  size: string | null;
  memory_used: number;
  utilization: number | null;
  usage_source: 'nvml' | 'kernel' | 'simulated' | 'hami' | null;
  warnings: string[];
  // Bytes its processes hold beyond its slice (or without one), kept reserved until freed.
  held: number;
  // While suspended: the GPU state kept in host memory.
  suspended_bytes?: number | null;
  pod?: string | null;
  node?: string | null;
  detail?: string | null;
  // This server's kernel that no session refers to and no client uses (shut down after
  // `GPUShare.unused_kernel_timeout`).
  unused?: boolean;
  // A queued start: when it is expected to get its slice (seconds since the epoch), null when
  // there is no history to tell. Absent where the backend does not estimate.
  expected_start?: number | null;
  // Since when it is idle (null while a cell runs), and what its idle timer does when.
  idle_since?: number | null;
  idle_action?: 'suspend' | 'release' | null;
  idle_action_at?: number | null;
  // What its backend can do with its slice (this server's own kernels only).
  capabilities?: ICapabilities;
}

/**
 * What the backend of one of this server's kernels can do with its slice: the panel's buttons
 * and the commands follow it (`actions.ts`), never the backend's kind.
 *
 * @schema Capabilities
 */
export interface ICapabilities {
  can_request: boolean;
  can_release: boolean;
  can_suspend: boolean;
  can_force_shrink: boolean;
  resize_restarts: boolean;
}

/**
 * The body of `PATCH kernels/{id}`.
 *
 * @schema Resize
 */
export interface IResize {
  gpu_memory: string | number;
  restart?: boolean;
  force?: boolean;
}

/**
 * The `data` of one `usage` event of `GET stream`.
 *
 * @schema UsageEvent
 */
export interface IUsageEvent {
  pool: IPool;
  kernels: IKernelSlice[];
}

/**
 * `GET config`: what the size picker offers.
 *
 * @schema Config
 */
export interface IGPUShareConfig {
  sizes: string[];
  default_memory: string;
  default_mode: Mode;
  modes: Mode[];
}

/**
 * What starting a kernel of one size would do now: one entry of `GET fit`.
 *
 * @schema Fit
 */
export interface IFit {
  gpu_memory: string;
  verdict: 'now' | 'queue' | 'full' | 'never';
  summary: string;
  reason: string | null;
  device: number | null;
  node: string | null;
  free: number | null;
  memory_request: number | null;
  queue_position: number | null;
  expected_start: number | null;
}

/**
 * One row of `GET usage`: a user's, a group's or a kernel's figures over the period.
 *
 * @schema UsageRow
 */
export interface IUsageRow {
  key: string;
  label: string;
  owner: string | null;
  started: string | null;
  notebook: string | null;
  kernelspec: string | null;
  kernels: number;
  reserved_gib_hours: number;
  used_gib_hours: number;
  used_share: number | null;
  busy_hours: number;
  idle_hours: number;
  suspended_hours: number;
  queue_wait_hours: number;
  starts: number;
  mean_start_wait_seconds: number | null;
  suspends: number;
  resumes: number;
}

/**
 * One user's mean reserved and used bytes per step.
 *
 * @schema UserSeries
 */
export interface IUserSeries {
  user: string;
  reserved: number[];
  used: number[];
}

/**
 * The points of the Usage chart.
 *
 * @schema UsageSeries
 */
export interface IUsageSeries {
  start: number;
  step: number;
  users: IUserSeries[];
}

/**
 * `GET usage`: what the user's kernels (everyone's, for an admin) reserved and used.
 *
 * @schema Usage
 */
export interface IUsage {
  since: string;
  until: string;
  by: 'user' | 'group' | 'kernel';
  scope: 'self' | 'everyone';
  rows: IUsageRow[];
  total: IUsageRow;
  test_kernels: IUsageRow;
  series: IUsageSeries;
}

/**
 * Every error answer: a sentence saying what is wrong.
 *
 * @schema Error
 */
export interface IErrorBody {
  message: string;
}
