/**
 * Where JupyterLab would start a gpushare kernel by name, the start goes through
 * {@link KernelStarts} instead: the size is picked first, the kernel starts once at that size,
 * and JupyterLab gets it as an existing kernel id. Three seams, each a JupyterLab extension
 * point, so the notebook stays an ordinary JupyterLab session:
 *
 * - the sessions REST client of the session manager ({@link GPUShareSessionAPIClient}): every
 *   session created, or changed, with a gpushare kernelspec by name — the guarantee that no
 *   such kernel starts before its size is known, whoever asks (consoles, other extensions);
 * - the session dialogs ({@link GPUShareSessionDialogs}): "Select Kernel", "Change Kernel" and
 *   the restart of a notebook without a kernel, where Cancel must change nothing;
 * - notebooks opening with a gpushare kernelspec ({@link holdGPUStart}): the session context
 *   is not given the kernelspec to start, so it asks for a kernel through the session dialogs,
 *   which start it through the picker instead; Cancel leaves the notebook without a kernel
 *   ("No Kernel"), as JupyterLab's own choice does.
 */

import {
  ISessionContext,
  Notification,
  SessionContextDialogs
} from '@jupyterlab/apputils';
import { DocumentRegistry } from '@jupyterlab/docregistry';
import { Kernel, Session, SessionAPI } from '@jupyterlab/services';

import { KernelStarts } from './starter';

/** What a notebook whose kernel still starts says when asked for another one. */
export const WAITING_MESSAGE =
  "This notebook's GPU kernel is still starting (see its toolbar); run the cell once it is " +
  'ready, or cancel the wait there.';

/** A start the user cancelled: nothing was started. */
export class StartCancelled extends Error {
  constructor() {
    super('No kernel was started: no GPU size was chosen.');
    this.name = 'StartCancelled';
  }
}

/**
 * The sessions REST client of the session manager: a session asked for with a gpushare
 * kernelspec by name gets a kernel started at the picked size, passed by id.
 */
export class GPUShareSessionAPIClient extends SessionAPI.SessionAPIClient {
  constructor(
    options: ConstructorParameters<typeof SessionAPI.SessionAPIClient>[0],
    private _starts: KernelStarts
  ) {
    super(options);
  }

  async startNew(options: Session.ISessionOptions): Promise<Session.IModel> {
    const kernel = await this._sized(options.kernel, async () => ({
      path: sessionPath(options)
    }));
    return super.startNew(kernel ? { ...options, kernel } : options);
  }

  async update(
    model: Parameters<SessionAPI.SessionAPIClient['update']>[0]
  ): Promise<Session.IModel> {
    const kernel = await this._sized(
      model.kernel as Partial<Kernel.IModel> | undefined,
      async () => {
        // The session's kernel now is the one being replaced: the server may still judge it
        // unused for a moment after the session took it, and it must not be its own successor.
        const session = await this.getModel(model.id);
        return {
          path: model.path ?? session.path,
          replaces: session.kernel?.id ?? null
        };
      }
    );
    return super.update(kernel ? { ...model, kernel } : model);
  }

  /** `{id, name}` of a kernel started at the picked size, or null when none is needed. */
  private async _sized(
    kernel: Partial<Kernel.IModel> | null | undefined,
    target: () => Promise<{ path: string; replaces?: string | null }>
  ): Promise<Partial<Kernel.IModel> | null> {
    if (!kernel?.name || kernel.id || !this._starts.isGPUKernel(kernel.name)) {
      return null;
    }
    const id = await this._starts.start({
      kernelName: kernel.name,
      ...(await target())
    });
    if (id === null) {
      throw new StartCancelled();
    }
    return { id, name: kernel.name };
  }
}

/**
 * The path a session is for. A session context first creates its session under a unique
 * path in the notebook's directory, with the notebook's name, and renames it when it runs.
 */
function sessionPath(options: Session.ISessionOptions): string {
  const slash = options.path.lastIndexOf('/');
  const directory = slash >= 0 ? options.path.slice(0, slash + 1) : '';
  return options.name ? `${directory}${options.name}` : options.path;
}

/**
 * Start a gpushare kernel for a session context through the picker; false when cancelled.
 * A notebook closed while its start waits withdraws the start; one closed once its kernel
 * came up shuts that kernel down: nothing is left holding a GPU for a notebook that is gone.
 */
export async function startInContext(
  context: ISessionContext,
  kernelName: string,
  starts: KernelStarts
): Promise<boolean> {
  const path = context.path;
  const closed = () => starts.pending(path)?.cancel();
  context.disposed.connect(closed);
  let id: string | null;
  try {
    id = await starts.start({ kernelName, path });
  } finally {
    context.disposed.disconnect(closed);
  }
  if (id === null) {
    return false;
  }
  if (context.isDisposed) {
    await starts.withdraw(id);
    return false;
  }
  // By id and name: the session takes the started kernel; the name is what the notebook
  // shows meanwhile.
  await context.changeKernel({ id, name: kernelName });
  return true;
}

/**
 * A session context whose `changeKernel` to a gpushare kernelspec goes through the picker
 * (everything else is the context's own), for JupyterLab's session dialogs.
 */
export function guardContext(
  context: ISessionContext,
  starts: KernelStarts
): ISessionContext {
  const changeKernel = async (
    options: Partial<Kernel.IModel> = {}
  ): Promise<Kernel.IKernelConnection | null> => {
    if (options.name && !options.id && starts.isGPUKernel(options.name)) {
      await startInContext(context, options.name, starts);
      return context.session?.kernel ?? null;
    }
    return context.changeKernel(options);
  };
  return new Proxy(context, {
    get(target, property) {
      if (property === 'changeKernel') {
        return changeKernel;
      }
      const value = Reflect.get(target, property, target);
      return typeof value === 'function' ? value.bind(target) : value;
    }
  });
}

/**
 * JupyterLab's session dialogs, with a gpushare kernelspec's start going through the picker.
 */
export class GPUShareSessionDialogs implements ISessionContext.IDialogs {
  constructor(
    private _dialogs: SessionContextDialogs,
    private _starts: KernelStarts,
    private _onError: (error: unknown) => void
  ) {}

  async selectKernel(context: ISessionContext): Promise<void> {
    if (this._starts.pending(context.path)) {
      // The notebook's kernel is on its way (the toolbar says where it is in the queue):
      // running a cell meanwhile must not offer to start a second one.
      Notification.info(WAITING_MESSAGE, { autoClose: 5000 });
      return;
    }
    const held = this._starts.held.get(context);
    if (held) {
      // A notebook opening with a gpushare kernelspec: no choice of kernel to make, a size.
      this._starts.held.delete(context);
      held.restore();
      try {
        await startInContext(context, held.kernelName, this._starts);
      } catch (error) {
        this._onError(error);
      }
      return;
    }
    return this._dialogs.selectKernel(guardContext(context, this._starts));
  }

  restart(
    context: ISessionContext,
    options?: ISessionContext.IRestartOptions
  ): Promise<boolean> {
    if (this._starts.pending(context.path)) {
      Notification.info(WAITING_MESSAGE, { autoClose: 5000 });
      return Promise.resolve(false);
    }
    // A running kernel restarts as it is, keeping its slice; a notebook without one starts its
    // last kernelspec again, through the picker.
    return this._dialogs.restart(guardContext(context, this._starts), options);
  }
}

/**
 * While a notebook's gpushare start waits (in the picker or the queue), the notebook's own
 * "start a kernel" (what running a cell without a kernel calls) must not start a second one:
 * it falls through to the session dialogs, which say the kernel is on its way. JupyterLab's
 * cell executor calls the session context's `startKernel` itself, so the context's own method
 * is wrapped (a widget extension calls this for every new notebook).
 */
export function noSecondStart(
  context: ISessionContext,
  starts: KernelStarts
): void {
  const startKernel = context.startKernel.bind(context);
  context.startKernel = async (): Promise<boolean> =>
    starts.pending(context.path) ? true : startKernel();
}

/**
 * Hold the automatic start of a document's gpushare kernelspec (a widget extension calls
 * this for every new notebook): the document sets its kernel preference from its metadata
 * right before its session context initializes; the preference is then given no kernelspec,
 * so the context asks the session dialogs for one, which start it through the picker.
 */
export function holdGPUStart(
  context: DocumentRegistry.IContext<DocumentRegistry.IModel>,
  starts: KernelStarts
): void {
  const session = context.sessionContext;
  const hold = () => {
    const preference = session.kernelPreference;
    if (
      session.isReady ||
      session.session ||
      preference.id ||
      preference.shouldStart === false ||
      preference.canStart === false ||
      !starts.isGPUKernel(preference.name)
    ) {
      return;
    }
    session.kernelPreferenceChanged.disconnect(hold);
    starts.held.set(session, {
      kernelName: preference.name as string,
      restore: () => {
        const { name, language, autoStartDefault } = preference;
        session.kernelPreference = {
          ...session.kernelPreference,
          name,
          language,
          autoStartDefault
        };
      }
    });
    session.kernelPreference = {
      ...preference,
      name: undefined,
      language: undefined,
      autoStartDefault: false
    };
  };
  session.kernelPreferenceChanged.connect(hold);
  hold();
  void session.ready.then(() => {
    session.kernelPreferenceChanged.disconnect(hold);
    // Ready with a session of its own (a running one was found): nothing to start.
    const held = starts.held.get(session);
    if (held && session.session) {
      starts.held.delete(session);
      held.restore();
    }
  });
  session.disposed.connect(() => {
    session.kernelPreferenceChanged.disconnect(hold);
  });
}
