/**
 * The GPU icon of the side panel tab and the status bar item. Its `jp-icon3` group takes
 * the theme's icon colour, so it reads in light and dark themes.
 */

import { LabIcon } from '@jupyterlab/ui-components';

import gpuSvg from '../style/icons/gpu.svg';

export const gpuIcon = new LabIcon({
  name: 'jupyter-gpushare:gpu',
  svgstr: gpuSvg
});
