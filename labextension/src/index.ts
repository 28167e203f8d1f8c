/**
 * jupyter-gpushare's JupyterLab extension (SPEC §9): the GPU side panel, the size picker
 * when a notebook gets a gpushare kernel, and the status bar item of the current kernel.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStateDB } from '@jupyterlab/statedb';
import { IStatusBar } from '@jupyterlab/statusbar';

import { GPUShareAPI } from './api';
import { gpuIcon } from './icons';
import { specSlice } from './kernelspecs';
import { GPUShareModel } from './model';
import { INotebookRef } from './panel/kernel';
import { GPUSharePanel, PANEL_ID } from './panel/panel';
import { pickSize } from './picker/dialog';
import { StartPicker } from './picker/start';
import { GPUStatusItem } from './statusbar/item';
import { IGPUShareConfig, IKernelSlice } from './types';

/** Command ids. */
export namespace CommandIDs {
  export const openPanel = 'gpushare:open-panel';
  export const pickSize = 'gpushare:pick-size';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpushare:plugin',
  description:
    'GPU side panel, size picker and status bar item for jupyter-gpushare.',
  autoStart: true,
  requires: [INotebookTracker, IDocumentManager],
  optional: [ILayoutRestorer, IStatusBar, IStateDB, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    docManager: IDocumentManager,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null,
    state: IStateDB | null,
    palette: ICommandPalette | null
  ): void => {
    const api = new GPUShareAPI();
    const model = new GPUShareModel({ api });
    const { sessions, kernels, kernelspecs } = app.serviceManager;

    let configPromise: Promise<IGPUShareConfig> | null = null;
    const config = (): Promise<IGPUShareConfig> => {
      if (!configPromise) {
        configPromise = api.config().catch(error => {
          configPromise = null; // try again next time
          throw error;
        });
      }
      return configPromise;
    };

    const notebookOf = (kernel: IKernelSlice): INotebookRef => {
      for (const session of sessions.running()) {
        if (session.kernel?.id === kernel.kernel_id) {
          return { label: basename(session.path), path: session.path };
        }
      }
      if (kernel.path) {
        // A path the kernel was started for: a server path, or the absolute working path
        // a session gives (which cannot be opened as is).
        const absolute = kernel.path.startsWith('/');
        return {
          label: basename(kernel.path),
          path: absolute ? null : kernel.path
        };
      }
      return { label: kernel.kernel_name || 'kernel', path: null };
    };

    const deviceMemory = async (): Promise<number[]> =>
      (model.pool ?? (await api.pool())).devices.map(d => d.memory_total);

    const panel = new GPUSharePanel({
      model,
      notebookOf,
      actions: {
        open: path => {
          docManager.openOrReveal(path);
        },
        resize: async kernel => {
          const name = notebookOf(kernel).label;
          try {
            const pick = await pickSize({
              title: `Resize the GPU slice of ${name}`,
              sizes: (await config()).sizes,
              current: kernel.size,
              allowNone: false,
              modes: [],
              mode: kernel.mode ?? '',
              deviceMemory: await deviceMemory(),
              acceptLabel: kernel.pod ? 'Restart in a new pod' : 'Resize'
            });
            if (pick?.memory && kernel.kernel_id) {
              // A pod's resources are fixed: its kernel restarts in a new pod of the new size.
              await api.resize(
                kernel.kernel_id,
                pick.memory,
                Boolean(kernel.pod)
              );
            }
          } catch (error) {
            await showErrorMessage(
              'GPU slice not resized',
              (error as Error).message
            );
          }
          await model.refresh();
        },
        release: async kernel => {
          try {
            if (kernel.kernel_id) {
              await api.release(kernel.kernel_id);
            }
          } catch (error) {
            await showErrorMessage(
              'GPU slice not released',
              (error as Error).message
            );
          }
          await model.refresh();
        },
        shutdown: async kernel => {
          const name = notebookOf(kernel).label;
          const answer = await showDialog({
            title: 'Shut down the kernel?',
            body: `The kernel of ${name} stops and its GPU slice is freed.`,
            buttons: [
              Dialog.cancelButton(),
              Dialog.warnButton({ label: 'Shut Down' })
            ]
          });
          if (!answer.button.accept || !kernel.kernel_id) {
            return;
          }
          try {
            await kernels.shutdown(kernel.kernel_id);
          } catch (error) {
            await showErrorMessage(
              'Kernel not shut down',
              (error as Error).message
            );
          }
          await model.refresh();
        }
      }
    });
    sessions.runningChanged.connect(() => panel.sessionsChanged());
    app.shell.add(panel, 'left', { rank: 650 });
    if (restorer) {
      restorer.add(panel, 'jupyter-gpushare-panel');
    }

    const openPanel = (): void => {
      app.shell.activateById(PANEL_ID);
    };
    const isGPUKernel = (name: string): boolean =>
      specSlice(kernelspecs.specs?.kernelspecs[name]) !== null;

    const picker = new StartPicker({
      api,
      model,
      notebooks,
      kernelspecs,
      config,
      state
    });

    app.commands.addCommand(CommandIDs.openPanel, {
      label: 'Show GPU Panel',
      caption: 'Show the GPU sharing panel',
      icon: gpuIcon,
      execute: openPanel
    });
    app.commands.addCommand(CommandIDs.pickSize, {
      label: 'Choose GPU Size for This Notebook…',
      caption:
        "Resize or release the GPU slice of the current notebook's kernel",
      isEnabled: () => {
        const kernel = notebooks.currentWidget?.sessionContext.session?.kernel;
        return !!kernel && isGPUKernel(kernel.name);
      },
      execute: () => {
        const current = notebooks.currentWidget;
        if (current) {
          return picker.pickFor(current);
        }
      }
    });
    if (palette) {
      for (const command of [CommandIDs.openPanel, CommandIDs.pickSize]) {
        palette.addItem({ command, category: 'GPU' });
      }
    }

    if (statusBar) {
      const item = new GPUStatusItem(model, notebooks, isGPUKernel, openPanel);
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

function basename(path: string): string {
  return path.split('/').pop() || path;
}

export default plugin;
