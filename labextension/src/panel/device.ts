/**
 * A device card of the side panel (`.jp-gpushare-device`): name, the memory bar (this
 * server's slices, other users' slices as anonymous occupancy, free), the memory really used,
 * and a sparkline of the last minute's utilisation.
 */

import { h, percentOf, setAttr, setText } from '../dom';
import { HISTORY_MS, ISample } from '../model';
import { formatBytes } from '../sizes';
import { IDevice } from '../types';

/** Bytes for the legend: `0` rather than `0M`. */
function short(bytes: number): string {
  return bytes > 0 ? formatBytes(bytes) : '0';
}

/** CSS classes, one place to change them. */
export const DEVICE_CLASS = 'jp-gpushare-device';
const SPARK_WIDTH = 120;
const SPARK_HEIGHT = 24;

/**
 * The figures a card shows; computed by the panel from the pool and this server's kernels.
 */
export interface IDeviceFigures {
  device: IDevice;
  /** Bytes reserved by this server's kernels on the device. */
  yours: number;
  /** Bytes reserved by everyone else (anonymous). */
  others: number;
  /** The pool's overcommit: what a device offers is its memory times this. */
  overcommit: number;
  /** Utilisation samples of the last minute. */
  history: ISample[];
}

/**
 * One card, updated in place.
 */
export class DeviceCard {
  constructor() {
    this.node = h(
      'li',
      { class: DEVICE_CLASS },
      h('div', { class: 'jp-gpushare-device-title' }, this._name, this._util),
      this._bar,
      this._usedBar,
      this._legend,
      this._spark
    );
    this._bar.append(this._yours, this._others);
    this._usedBar.append(this._used);
  }

  /** The card's element. */
  readonly node: HTMLLIElement;

  /** Show new figures. */
  update(figures: IDeviceFigures): void {
    const { device, yours, others } = figures;
    const total = device.memory_total;
    // Free as everywhere (magics, refusals, the picker): what no kernel has reserved of what
    // the device offers, yours included.
    const free = Math.max(
      0,
      Math.floor(total * figures.overcommit) - device.memory_reserved
    );
    // Under an overcommit free can exceed the card: say what it is out of.
    const offered =
      figures.overcommit === 1
        ? short(total)
        : `${short(total)} ×${figures.overcommit}`;
    this.node.dataset.uuid = device.uuid;
    // On Kubernetes a device is a GPU node, named "2× NVIDIA A100 on gpu-node-1".
    setText(
      this._name,
      device.node ? device.name : `GPU${device.id} · ${device.name}`
    );
    setAttr(this._name, 'title', device.uuid);
    setText(
      this._util,
      device.utilization === null ? 'util –' : `util ${device.utilization}%`
    );
    this._yours.style.width = percentOf(yours, total);
    this._others.style.width = percentOf(others, total);
    this._used.style.width = percentOf(device.memory_used, total);
    const summary =
      `yours ${formatBytes(yours)}, others ${formatBytes(others)}, ` +
      `free ${formatBytes(free)} of ${offered}`;
    setAttr(
      this._bar,
      'aria-label',
      `GPU${device.id} memory reserved: ${summary}`
    );
    setAttr(this._bar, 'title', `Reserved: ${summary}`);
    setAttr(
      this._usedBar,
      'aria-label',
      `GPU${device.id} memory used: ${formatBytes(device.memory_used)} of ${formatBytes(total)}`
    );
    setAttr(this._usedBar, 'title', `Used: ${formatBytes(device.memory_used)}`);
    setText(this._legendYours, short(yours));
    setText(this._legendOthers, short(others));
    setText(this._legendFree, short(free));
    setText(this._legendUsed, short(device.memory_used));
    setText(this._legendTotal, offered);
    this._drawSparkline(figures.history);
  }

  private _drawSparkline(samples: ISample[]): void {
    const now = Date.now();
    const points = samples
      .filter(s => s.value !== null)
      .map(s => {
        const x = SPARK_WIDTH - ((now - s.time) / HISTORY_MS) * SPARK_WIDTH;
        const y =
          SPARK_HEIGHT - ((s.value as number) / 100) * (SPARK_HEIGHT - 2) - 1;
        return `${Math.max(0, x).toFixed(1)},${y.toFixed(1)}`;
      });
    if (points.length === 1) {
      points.unshift(`0,${points[0].split(',')[1]}`);
    }
    this._line.setAttribute('points', points.join(' '));
    const last = samples.length ? samples[samples.length - 1].value : null;
    setAttr(
      this._spark,
      'aria-label',
      last === null
        ? 'Utilisation over the last minute: unknown'
        : `Utilisation over the last minute, now ${last}%`
    );
  }

  private _name = h('span', { class: 'jp-gpushare-device-name' });
  private _util = h('span', { class: 'jp-gpushare-device-util' });
  private _bar = h('div', { class: 'jp-gpushare-bar', role: 'img' });
  private _yours = h('div', { class: 'jp-gpushare-seg jp-gpushare-seg-yours' });
  private _others = h('div', {
    class: 'jp-gpushare-seg jp-gpushare-seg-others'
  });
  private _usedBar = h('div', {
    class: 'jp-gpushare-bar jp-gpushare-bar-thin',
    role: 'img'
  });
  private _used = h('div', { class: 'jp-gpushare-seg jp-gpushare-seg-used' });
  private _legendYours = h('span');
  private _legendOthers = h('span');
  private _legendFree = h('span');
  private _legendUsed = h('span');
  private _legendTotal = h('span');
  private _legend = h(
    'div',
    { class: 'jp-gpushare-legend' },
    h('span', { class: 'jp-gpushare-key jp-gpushare-key-yours' }),
    'yours ',
    this._legendYours,
    ' ',
    h('span', { class: 'jp-gpushare-key jp-gpushare-key-others' }),
    'others ',
    this._legendOthers,
    ' ',
    h('span', { class: 'jp-gpushare-key jp-gpushare-key-free' }),
    'free ',
    this._legendFree,
    ' of ',
    this._legendTotal,
    ' · used ',
    this._legendUsed
  );
  private _line = document.createElementNS(
    'http://www.w3.org/2000/svg',
    'polyline'
  );
  private _spark = (() => {
    const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('class', 'jp-gpushare-sparkline');
    svg.setAttribute('viewBox', `0 0 ${SPARK_WIDTH} ${SPARK_HEIGHT}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    svg.append(this._line);
    return svg;
  })();
}
