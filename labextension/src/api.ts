/**
 * The client of the gpushare REST API and its live stream.
 *
 * Every URL is built from `ServerConnection` settings, whose base URL comes from the page
 * config, so the extension works under a JupyterHub-style prefix (`/user/alice/`). Requests go
 * through `ServerConnection.makeRequest`, which adds the token or the XSRF header as the rest of
 * JupyterLab does.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  IErrorBody,
  IFit,
  IGPUShareConfig,
  IKernelSlice,
  IPool,
  IResize,
  IUsage,
  IUsageEvent
} from './types';

/** The route prefix of the server extension, relative to the server's base URL. */
export const API_PATH = 'api/gpushare';

/**
 * A refusal of the server, carrying its sentence (`{"message"}`) and HTTP status.
 */
export class GPUShareError extends Error {
  constructor(
    message: string,
    readonly status: number
  ) {
    super(message);
    this.name = 'GPUShareError';
  }
}

/**
 * The REST routes of docs/reference/rest-api.md that the panel, the picker and the status bar use.
 */
export class GPUShareAPI {
  /**
   * @param settings - The server connection settings; the default ones of the page.
   */
  constructor(settings?: ServerConnection.ISettings) {
    this.settings = settings ?? ServerConnection.makeSettings();
  }

  /** The server connection settings in use. */
  readonly settings: ServerConnection.ISettings;

  /** The absolute URL of a route, e.g. `url('kernels', id)`. */
  url(...parts: string[]): string {
    return URLExt.join(
      this.settings.baseUrl,
      API_PATH,
      ...parts.map(encodeURIComponent)
    );
  }

  /**
   * The URL of the live stream for an `EventSource`, which sends the page's cookies but can
   * set no header: the token rides in the query only when the settings carry one.
   */
  streamUrl(): string {
    const url = this.url('stream');
    const token = this.settings.token;
    return token ? `${url}?token=${encodeURIComponent(token)}` : url;
  }

  /** `GET pool`. */
  pool(): Promise<IPool> {
    return this.request<IPool>('GET', ['pool']);
  }

  /** `GET kernels`: this server's GPU kernels. */
  kernels(): Promise<IKernelSlice[]> {
    return this.request<IKernelSlice[]>('GET', ['kernels']);
  }

  /** `GET kernels/{id}`. */
  kernel(kernelId: string): Promise<IKernelSlice> {
    return this.request<IKernelSlice>('GET', ['kernels', kernelId]);
  }

  /** Pool and kernels at once, shaped as one event of the stream. */
  async snapshot(): Promise<IUsageEvent> {
    const [pool, kernels] = await Promise.all([this.pool(), this.kernels()]);
    return { pool, kernels };
  }

  /** `GET config`: the presets, defaults and modes the picker offers. */
  async config(): Promise<IGPUShareConfig> {
    return this.request<IGPUShareConfig>('GET', ['config']);
  }

  /**
   * `PATCH kernels/{id}`: resize the slice in place (409 with the reason if it cannot); with
   * `restart`, the kernel restarts with the new size (how a kernel pod is resized).
   */
  resize(
    kernelId: string,
    size: string,
    restart = false
  ): Promise<IKernelSlice> {
    const body: IResize = restart
      ? { gpu_memory: size, restart: true }
      : { gpu_memory: size };
    return this.request<IKernelSlice>('PATCH', ['kernels', kernelId], body);
  }

  /**
   * `GET fit`: what starting a kernel of each size would do now (a dry run of the allocator
   * that decides the start), in the order asked.
   */
  fit(sizes: string[], mode: string | null): Promise<IFit[]> {
    const query = new URLSearchParams(sizes.map(size => ['gpu_memory', size]));
    if (mode) {
      query.append('gpu_mode', mode);
    }
    return this.request<IFit[]>('GET', ['fit'], undefined, query.toString());
  }

  /**
   * `POST kernels`: start a kernel of a gpushare kernelspec with the picked slice. The answer
   * comes within a second: the kernel runs, or it is queued (`state: 'queued'`).
   */
  start(options: {
    name: string;
    path: string;
    gpu_memory: string;
    gpu_mode: string | null;
  }): Promise<IKernelSlice> {
    return this.request<IKernelSlice>('POST', ['kernels'], options);
  }

  /**
   * `GET usage`: what the user's kernels (everyone's for an admin) reserved and used over the
   * last `since` (`24h`, `7d`), with each user's series of reserved and used memory.
   */
  usage(
    since = '24h',
    by: 'user' | 'group' | 'kernel' = 'user'
  ): Promise<IUsage> {
    const query = new URLSearchParams({ since, by });
    return this.request<IUsage>('GET', ['usage'], undefined, query.toString());
  }

  /** `DELETE kernels/{id}/gpu`: release the slice; the kernel keeps running. */
  async release(kernelId: string): Promise<void> {
    await this.request<void>('DELETE', ['kernels', kernelId, 'gpu']);
  }

  /**
   * `POST kernels/{id}/suspend`: the kernel's GPU state goes to host memory and its slice back
   * to the pool (409 with the reason when it cannot; it then keeps its slice).
   */
  suspend(kernelId: string): Promise<IKernelSlice> {
    return this.request<IKernelSlice>('POST', ['kernels', kernelId, 'suspend']);
  }

  /**
   * `POST kernels/{id}/resume`: wait for a slice like a start, then restore the kernel's GPU
   * state; answers once it runs again.
   */
  resume(kernelId: string): Promise<IKernelSlice> {
    return this.request<IKernelSlice>('POST', ['kernels', kernelId, 'resume']);
  }

  private async request<T>(
    method: string,
    parts: string[],
    body?: unknown,
    query?: string
  ): Promise<T> {
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let response: Response;
    try {
      const url = this.url(...parts);
      response = await ServerConnection.makeRequest(
        query ? `${url}?${query}` : url,
        init,
        this.settings
      );
    } catch (error) {
      throw new GPUShareError(
        `the server cannot be reached: ${(error as Error).message}`,
        0
      );
    }
    const text = await response.text();
    let data: unknown = undefined;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = undefined;
      }
    }
    if (!response.ok) {
      const message =
        (data as IErrorBody | undefined)?.message ||
        `${method} ${parts.join('/')} failed: ${response.status} ${response.statusText}`;
      throw new GPUShareError(message, response.status);
    }
    return data as T;
  }
}
