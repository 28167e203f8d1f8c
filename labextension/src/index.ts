/**
 * jupyter-gpushare's JupyterLab extension (docs/users/panel.md): the GPU side panel, the size picked
 * before a gpushare kernel starts, and the status bar item of the current kernel.
 *
 * Four plugins: two service plugins (the kernel starts, and the session manager whose sessions
 * REST client starts gpushare kernels through them), the session dialogs that start them
 * through the picker, and the user interface. The `activate` functions only wire; the work is
 * in the modules they name.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISessionContext,
  ISessionContextDialogs,
  SessionContextDialogs,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import {
  IConnectionStatus,
  IKernelManager,
  IKernelSpecManager,
  IServerSettings,
  ISessionManager,
  Kernel,
  KernelSpec,
  ServerConnection,
  ServiceManagerPlugin,
  Session,
  SessionManager
} from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStateDB } from '@jupyterlab/statedb';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';

import { GPUShareAPI } from './api';
import { addCommands, CommandIDs } from './commands';
import { GPUShareModel } from './model';
import { INotebookRef } from './panel/kernel';
import { GPUSharePanel } from './panel/panel';
import { startPicker } from './picker/start';
import { GPUStartIndicator } from './starts/indicator';
import {
  GPUShareSessionAPIClient,
  GPUShareSessionDialogs,
  holdGPUStart,
  noSecondStart,
  StartCancelled
} from './starts/session';
import { IGPUShareStarts, KernelStarts } from './starts/starter';
import { GPUStatusItem } from './statusbar/item';
import { IGPUShareConfig, IKernelSlice } from './types';

export { CommandIDs, IGPUShareStarts, KernelStarts };

/** The kernel starts: the size first, then one start at that size. */
const startsPlugin: ServiceManagerPlugin<KernelStarts> = {
  id: 'jupyter-gpushare:kernel-starts',
  description: 'Starts gpushare kernels at the size picked before they start.',
  autoStart: true,
  provides: IGPUShareStarts,
  requires: [IKernelSpecManager],
  optional: [IServerSettings],
  activate: (
    _: null,
    kernelspecs: KernelSpec.IManager,
    serverSettings: ServerConnection.ISettings | null
  ) =>
    new KernelStarts({
      api: new GPUShareAPI(serverSettings ?? undefined),
      kernelspecs
    })
};

/**
 * JupyterLab's session manager, whose sessions REST client starts a gpushare kernelspec by
 * name through the kernel starts (it replaces the default session manager plugin).
 */
const sessionManagerPlugin: ServiceManagerPlugin<Session.IManager> = {
  id: 'jupyter-gpushare:session-manager',
  description:
    'The session manager, with gpushare kernels started at a picked size.',
  autoStart: true,
  provides: ISessionManager,
  requires: [IKernelManager, IGPUShareStarts],
  optional: [IServerSettings, IConnectionStatus],
  activate: (
    _: null,
    kernelManager: Kernel.IManager,
    starts: KernelStarts,
    serverSettings: ServerConnection.ISettings | null,
    connectionStatus: { isConnected: boolean } | null
  ) =>
    new SessionManager({
      kernelManager,
      serverSettings: serverSettings ?? undefined,
      standby: () => !connectionStatus?.isConnected || 'when-hidden',
      sessionAPIClient: new GPUShareSessionAPIClient(
        { serverSettings: serverSettings ?? undefined },
        starts
      )
    })
};

/** JupyterLab's session dialogs, starting a gpushare kernelspec through the picker. */
const dialogsPlugin: JupyterFrontEndPlugin<ISessionContext.IDialogs> = {
  id: 'jupyter-gpushare:session-dialogs',
  description: 'Kernel selection and restart dialogs that ask for a GPU size.',
  autoStart: true,
  provides: ISessionContextDialogs,
  requires: [IGPUShareStarts],
  optional: [ITranslator, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    starts: KernelStarts,
    translator: ITranslator | null,
    settingRegistry: ISettingRegistry | null
  ) =>
    new GPUShareSessionDialogs(
      new SessionContextDialogs({
        translator: translator ?? undefined,
        settingRegistry
      }),
      starts,
      showStartError
    )
};

/** The panel, the picker, the notebooks' start indicators, the commands, the status bar. */
const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:plugin',
  description:
    'GPU side panel, size picker and status bar item for jupyter-gpushare.',
  autoStart: true,
  requires: [INotebookTracker, IDocumentManager, IGPUShareStarts],
  optional: [ILayoutRestorer, IStatusBar, IStateDB, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    docManager: IDocumentManager,
    starts: KernelStarts,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    state: IStateDB | null,
    palette: ICommandPalette | null
  ): void => {
    const api = starts.api;
    const model = new GPUShareModel({ api });
    const config = once(() => api.config());
    const notebookOf = (kernel: IKernelSlice) =>
      notebookRef(kernel, app.serviceManager.sessions.running());

    starts.setPicker(startPicker({ api, model, config, state }));
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: NotebookPanel, context) => {
        holdGPUStart(context, starts);
        noSecondStart(context.sessionContext, starts);
        const indicator = new GPUStartIndicator(context.sessionContext, starts);
        if (
          !panel.toolbar.insertBefore('kernelName', 'gpushare-start', indicator)
        ) {
          panel.toolbar.addItem('gpushare-start', indicator);
        }
        return indicator;
      }
    });

    const actions = addCommands(app, {
      api,
      model,
      notebooks,
      docManager,
      config,
      notebookOf,
      palette
    });
    const panel = new GPUSharePanel({ model, actions, notebookOf });
    app.serviceManager.sessions.runningChanged.connect(() =>
      panel.sessionsChanged()
    );
    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, 'jupyter-gpushare-panel');

    if (statusBar) {
      const item = new GPUStatusItem(
        model,
        notebooks,
        name => starts.isGPUKernel(name),
        () => void app.commands.execute(CommandIDs.openPanel)
      );
      statusBar.registerStatusItem('jupyter-gpushare:status', {
        item,
        align: 'left',
        rank: 5,
        isActive: () => item.isActiveItem,
        activeStateChanged: item.activeStateChanged
      });
    }
  }
};

/** A start that failed (not one the user cancelled), with the server's reason. */
function showStartError(error: unknown): void {
  if (!(error instanceof StartCancelled)) {
    void showErrorMessage('GPU kernel not started', (error as Error).message);
  }
}

/** The notebook a kernel belongs to, from the running sessions or the path it started for. */
function notebookRef(
  kernel: IKernelSlice,
  sessions: Iterable<Session.IModel>
): INotebookRef {
  for (const session of sessions) {
    if (session.kernel?.id === kernel.kernel_id) {
      // The name, not the path's last part: a session context creates its session under a
      // unique path first and renames it once the kernel runs (the name is the notebook's).
      return {
        label: session.name || basename(session.path),
        path: session.path
      };
    }
  }
  if (kernel.path) {
    // A server path, or the absolute working directory a session gives (not openable).
    const absolute = kernel.path.startsWith('/');
    return {
      label: basename(kernel.path),
      path: absolute ? null : kernel.path
    };
  }
  return { label: kernel.kernel_name || 'kernel', path: null };
}

/** `load()` once; again after a failure. */
function once(
  load: () => Promise<IGPUShareConfig>
): () => Promise<IGPUShareConfig> {
  let loading: Promise<IGPUShareConfig> | null = null;
  return () => {
    if (!loading) {
      loading = load().catch(error => {
        loading = null;
        throw error;
      });
    }
    return loading;
  };
}

function basename(path: string): string {
  return path.split('/').pop() || path;
}

export default [startsPlugin, sessionManagerPlugin, dialogsPlugin, plugin];
