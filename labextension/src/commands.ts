/**
 * The JupyterLab commands of jupyter-gpushare (docs/users/panel.md): the panel, and the actions on a GPU
 * kernel — resize, release (or withdraw a queued start), request a slice again, suspend and
 * resume, shut down, open its notebook — that the panel's
 * rows run and that the command palette and key bindings reach too (as JupyterLab's
 * running-sessions panel does).
 *
 * A kernel command takes `{kernelId}`; without it, it acts on the current notebook's kernel.
 */

import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { capabilitiesOf, KernelAction, offered } from './actions';
import { GPUShareAPI } from './api';
import { gpuIcon } from './icons';
import { GPUShareModel } from './model';
import { IKernelActions, INotebookRef } from './panel/kernel';
import { PANEL_ID } from './panel/panel';
import { pickSize } from './picker/dialog';
import { IGPUShareConfig, IKernelSlice } from './types';

/** Command ids. */
export namespace CommandIDs {
  export const openPanel = 'gpushare:open-panel';
  export const resize = 'gpushare:resize-kernel';
  export const release = 'gpushare:release-kernel';
  export const request = 'gpushare:request-kernel';
  export const suspend = 'gpushare:suspend-kernel';
  export const resume = 'gpushare:resume-kernel';
  export const shutdown = 'gpushare:shutdown-kernel';
  export const openNotebook = 'gpushare:open-kernel-notebook';
}

/** What the commands need. */
export interface ICommandsOptions {
  api: GPUShareAPI;
  model: GPUShareModel;
  notebooks: INotebookTracker;
  docManager: IDocumentManager;
  config: () => Promise<IGPUShareConfig>;
  /** The notebook of a kernel (from the running sessions). */
  notebookOf: (kernel: IKernelSlice) => INotebookRef;
  palette: ICommandPalette | null;
}

/**
 * Add the commands; the panel's row actions, which run them.
 */
export function addCommands(
  app: JupyterFrontEnd,
  options: ICommandsOptions
): IKernelActions {
  const { api, model, notebooks, docManager, notebookOf } = options;
  const { commands } = app;

  /** The kernel a command is about: `args.kernelId`, else the current notebook's. */
  const kernelOf = async (
    args: ReadonlyPartialJSONObject
  ): Promise<IKernelSlice | null> => {
    const id =
      (args.kernelId as string | undefined) ??
      notebooks.currentWidget?.sessionContext.session?.kernel?.id;
    if (!id) {
      return null;
    }
    const known = model.kernel(id);
    if (known) {
      return known;
    }
    try {
      return await api.kernel(id);
    } catch {
      return null; // not a GPU kernel of this server
    }
  };
  const forKernel =
    (action: (kernel: IKernelSlice) => Promise<void>) =>
    async (args: ReadonlyPartialJSONObject): Promise<void> => {
      const kernel = await kernelOf(args);
      if (!kernel) {
        await showErrorMessage(
          'No GPU kernel',
          'The current notebook does not run a GPU kernel of this server.'
        );
        return;
      }
      await action(kernel);
      await model.refresh();
    };
  /** Ask for a new size of one kernel's slice (null: cancelled). */
  const pickFor = async (
    kernel: IKernelSlice,
    title: string,
    acceptLabel: string,
    withFit: boolean
  ): Promise<string | null> => {
    const pick = await pickSize({
      title,
      sizes: (await options.config()).sizes,
      current: kernel.size,
      allowNone: false,
      modes: [],
      mode: kernel.mode ?? '',
      deviceMemory: (model.pool ?? (await api.pool())).devices.map(
        device => device.memory_total
      ),
      acceptLabel,
      ...(withFit ? { fit: (sizes, mode) => api.fit(sizes, mode) } : {})
    });
    return pick?.memory ?? null;
  };
  const hasKernel = (args: ReadonlyPartialJSONObject): boolean =>
    !!args.kernelId ||
    !!notebooks.currentWidget?.sessionContext.session?.kernel;
  /**
   * A kernel command's `isEnabled`: what offered() says of the kernel as the model last saw
   * it — the panel's buttons ask the same — else whether there is a kernel at all (the
   * command then reads it and the server says what it refuses).
   */
  const enabledFor =
    (action: KernelAction) =>
    (args: ReadonlyPartialJSONObject): boolean => {
      const id =
        (args.kernelId as string | undefined) ??
        notebooks.currentWidget?.sessionContext.session?.kernel?.id;
      const known = id ? model.kernel(id) : null;
      return known ? offered(known, action) : hasKernel(args);
    };

  commands.addCommand(CommandIDs.openPanel, {
    label: 'Show GPU Panel',
    caption: 'Show the GPU sharing panel',
    icon: gpuIcon,
    execute: () => {
      app.shell.activateById(PANEL_ID);
    }
  });
  commands.addCommand(CommandIDs.resize, {
    label: args =>
      args.kernelId
        ? 'Resize GPU Slice…'
        : 'Resize the GPU Slice of This Kernel…',
    caption: 'Choose another size for the GPU slice of a kernel',
    isEnabled: enabledFor('resize'),
    execute: forKernel(async kernel => {
      const name = notebookOf(kernel).label;
      try {
        const memory = await pickFor(
          kernel,
          `Resize the GPU slice of ${name}`,
          capabilitiesOf(kernel).resize_restarts
            ? 'Restart with this size'
            : 'Resize',
          false
        );
        if (memory && kernel.kernel_id) {
          // A backend whose every resize restarts (a kernel pod: a new pod of the new size).
          await api.resize(
            kernel.kernel_id,
            memory,
            capabilitiesOf(kernel).resize_restarts
          );
        }
      } catch (error) {
        await showErrorMessage(
          'GPU slice not resized',
          (error as Error).message
        );
      }
    })
  });
  commands.addCommand(CommandIDs.release, {
    label: args =>
      args.kernelId
        ? 'Release GPU Slice'
        : 'Release the GPU Slice of This Kernel',
    caption:
      'Give the GPU slice back (the kernel keeps running), or withdraw a start still queued',
    isEnabled: enabledFor('release'),
    execute: forKernel(async kernel => {
      try {
        await api.release(kernel.kernel_id as string);
      } catch (error) {
        await showErrorMessage(
          kernel.state === 'queued'
            ? 'GPU start not cancelled'
            : 'GPU slice not released',
          (error as Error).message
        );
      }
    })
  });
  commands.addCommand(CommandIDs.request, {
    label: args =>
      args.kernelId
        ? 'Request GPU Slice…'
        : 'Request a GPU Slice for This Kernel…',
    caption:
      'Ask again for a GPU slice for a kernel that gave its own back (%gpu request)',
    isEnabled: enabledFor('request'),
    execute: forKernel(async kernel => {
      const name = notebookOf(kernel).label;
      try {
        const memory = await pickFor(
          kernel,
          `Request a GPU slice for ${name}`,
          'Request',
          true
        );
        if (!memory) {
          return;
        }
        // The kernel takes its slice itself, as %gpu request in a cell does: its environment
        // (the visible device, the caps) is set inside the kernel's process.
        const mode = kernel.mode ? ` --mode ${kernel.mode}` : '';
        const problem = await runInKernel(
          app,
          kernel,
          `%gpu request ${memory}${mode}`
        );
        if (problem) {
          await showErrorMessage('No GPU slice', problem);
        }
      } catch (error) {
        await showErrorMessage('No GPU slice', (error as Error).message);
      }
    })
  });
  commands.addCommand(CommandIDs.suspend, {
    label: args =>
      args.kernelId
        ? 'Suspend GPU Kernel'
        : 'Suspend the GPU State of This Kernel',
    caption:
      'Move the GPU state to host memory and give the slice back; the next cell resumes it',
    isEnabled: enabledFor('suspend'),
    execute: forKernel(async kernel => {
      try {
        await api.suspend(kernel.kernel_id as string);
      } catch (error) {
        await showErrorMessage(
          'GPU kernel not suspended',
          (error as Error).message
        );
      }
    })
  });
  commands.addCommand(CommandIDs.resume, {
    label: args =>
      args.kernelId
        ? 'Resume GPU Kernel'
        : 'Resume the GPU State of This Kernel',
    caption: 'Wait for a GPU slice and restore the suspended GPU state',
    isEnabled: enabledFor('resume'),
    execute: forKernel(async kernel => {
      try {
        await api.resume(kernel.kernel_id as string);
      } catch (error) {
        await showErrorMessage(
          'GPU kernel not resumed',
          (error as Error).message
        );
      }
    })
  });
  commands.addCommand(CommandIDs.shutdown, {
    label: args =>
      args.kernelId ? 'Shut Down GPU Kernel…' : 'Shut Down This GPU Kernel…',
    caption: 'Shut the kernel down; its GPU slice is freed',
    isEnabled: enabledFor('shutdown'),
    execute: forKernel(async kernel => {
      const name = notebookOf(kernel).label;
      const answer = await showDialog({
        title: 'Shut down the kernel?',
        body: `The kernel of ${name} stops and its GPU slice is freed.`,
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: 'Shut Down' })
        ]
      });
      if (!answer.button.accept) {
        return;
      }
      try {
        await app.serviceManager.kernels.shutdown(kernel.kernel_id as string);
      } catch (error) {
        await showErrorMessage(
          'Kernel not shut down',
          (error as Error).message
        );
      }
    })
  });
  commands.addCommand(CommandIDs.openNotebook, {
    label: 'Open the Notebook of a GPU Kernel',
    caption: 'Open (or show) the notebook a GPU kernel runs for',
    isEnabled: args => !!args.kernelId,
    execute: forKernel(async kernel => {
      const path = notebookOf(kernel).path;
      if (path) {
        docManager.openOrReveal(path);
      }
    })
  });
  if (options.palette) {
    for (const command of [
      CommandIDs.openPanel,
      CommandIDs.resize,
      CommandIDs.release,
      CommandIDs.request,
      CommandIDs.suspend,
      CommandIDs.resume,
      CommandIDs.shutdown
    ]) {
      options.palette.addItem({ command, category: 'GPU' });
    }
  }

  // The rows of the panel run the same commands.
  const run = (command: string) => (kernel: IKernelSlice) =>
    void commands.execute(command, { kernelId: kernel.kernel_id });
  return {
    open: run(CommandIDs.openNotebook),
    resize: run(CommandIDs.resize),
    release: run(CommandIDs.release),
    request: run(CommandIDs.request),
    suspend: run(CommandIDs.suspend),
    resume: run(CommandIDs.resume),
    shutdown: run(CommandIDs.shutdown)
  };
}

/**
 * Run one line in a kernel, out of any notebook's sight (no history, no output shown); what it
 * wrote to stderr or raised, or null when it ran cleanly.
 */
async function runInKernel(
  app: JupyterFrontEnd,
  kernel: IKernelSlice,
  code: string
): Promise<string | null> {
  const connection = app.serviceManager.kernels.connectTo({
    model: { id: kernel.kernel_id as string, name: kernel.kernel_name }
  });
  const problems: string[] = [];
  try {
    const future = connection.requestExecute({
      code,
      silent: false,
      store_history: false
    });
    future.onIOPub = message => {
      const content = message.content as {
        name?: string;
        text?: string;
        ename?: string;
        evalue?: string;
      };
      if (message.header.msg_type === 'stream' && content.name === 'stderr') {
        problems.push(content.text ?? '');
      } else if (message.header.msg_type === 'error') {
        problems.push(`${content.ename}: ${content.evalue}`);
      }
    };
    await future.done;
  } finally {
    connection.dispose();
  }
  return problems.length ? problems.join('').trim() : null;
}
