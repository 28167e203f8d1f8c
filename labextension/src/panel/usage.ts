/**
 * The panel's Usage view (`.jp-gpushare-usage`): what the user's kernels reserved and used over
 * the last day, drawn as a chart — reserved memory as an area, used memory as a line — with the
 * day's GiB·hours beside it; for an admin (a broker's), one small chart per user on a shared
 * scale. The points are `GET usage`'s series; the chart is plain SVG drawn here (no chart
 * library). It asks again every `USAGE_REFRESH_MS` while the panel is visible.
 */

import { h, setAttr, setText } from '../dom';
import { formatBytes, GiB } from '../sizes';
import { IUsage, IUsageRow, IUserSeries } from '../types';

export const USAGE_CLASS = 'jp-gpushare-usage';
export const USAGE_CHART_CLASS = 'jp-gpushare-usage-chart';
/** How often the Usage view asks the server again while shown (ms). */
export const USAGE_REFRESH_MS = 60_000;
/** The period the view shows. */
export const USAGE_SINCE = '24h';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 64;
const SMALL_HEIGHT = 36;

/** The GiB·hours of a row, as the view and the report print them. */
export function gibHours(value: number): string {
  return value >= 10 ? value.toFixed(0) : value.toFixed(value >= 1 ? 1 : 2);
}

/** The chart's summary line: "4.2 GiB·h reserved, 1.1 used (26%)". */
export function summaryOf(row: IUsageRow | undefined): string {
  if (!row || row.reserved_gib_hours <= 0) {
    return 'nothing reserved';
  }
  const share =
    row.used_share === null ? '' : ` (${Math.round(row.used_share * 100)}%)`;
  return `${gibHours(row.reserved_gib_hours)} GiB·h reserved, ${gibHours(row.used_gib_hours)} used${share}`;
}

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attributes: { [name: string]: string | number } = {}
): SVGElementTagNameMap[K] {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    element.setAttribute(name, String(value));
  }
  return element;
}

/** A round top for the y axis: 1, 2, 4, 8… GiB, and at least the largest value. */
export function scaleTop(bytes: number): number {
  let top = GiB;
  while (top < bytes) {
    top *= 2;
  }
  return top;
}

/**
 * The chart of one user's series: the reserved area, the used line, an axis label for the top
 * of the scale and one for each 6 hours.
 */
export function drawChart(
  series: IUserSeries,
  start: number,
  step: number,
  top: number,
  height: number,
  label: string
): SVGSVGElement {
  const count = Math.max(series.reserved.length, 1);
  const x = (i: number) => (i / count) * WIDTH;
  const y = (bytes: number) => height - (bytes / top) * (height - 2) - 1;
  const chart = svg('svg', {
    class: USAGE_CHART_CLASS,
    viewBox: `0 0 ${WIDTH} ${height}`,
    preserveAspectRatio: 'none',
    role: 'img',
    'aria-label': label
  });
  chart.dataset.user = series.user;
  // Steps as flat segments: each point is the mean over its step.
  let area = `M0,${height}`;
  let line = '';
  series.reserved.forEach((bytes, i) => {
    area += ` L${x(i).toFixed(1)},${y(bytes).toFixed(1)} L${x(i + 1).toFixed(1)},${y(bytes).toFixed(1)}`;
  });
  area += ` L${WIDTH},${height} Z`;
  series.used.forEach((bytes, i) => {
    line += `${i ? ' L' : 'M'}${x(i).toFixed(1)},${y(bytes).toFixed(1)} L${x(i + 1).toFixed(1)},${y(bytes).toFixed(1)}`;
  });
  const grid = svg('g', { class: 'jp-gpushare-usage-grid' });
  const hours = (count * step) / 3600;
  for (let hour = 6; hour < hours; hour += 6) {
    const at = (hour / hours) * WIDTH;
    grid.append(svg('line', { x1: at, x2: at, y1: 0, y2: height }));
  }
  chart.append(
    grid,
    svg('path', { class: 'jp-gpushare-usage-reserved', d: area }),
    svg('path', { class: 'jp-gpushare-usage-used', d: line || 'M0,0' })
  );
  chart.dataset.start = String(start);
  return chart;
}

/**
 * The view: a heading, the chart(s), a legend; updated in place on each answer.
 */
export class UsageView {
  constructor(private _load: () => Promise<IUsage>) {
    this.node = h(
      'section',
      {
        class: `jp-gpushare-section ${USAGE_CLASS}`,
        'aria-label': 'GPU usage over the last day'
      },
      h(
        'h3',
        { class: 'jp-gpushare-subtitle' },
        'Usage ',
        h('span', { class: 'jp-gpushare-usage-period' }, 'last 24 h')
      ),
      this._legend,
      this._charts,
      this._message
    );
  }

  /** The view's element. */
  readonly node: HTMLElement;

  /** Ask the server and draw what it says (a failure shows as a line, never throws). */
  async refresh(): Promise<void> {
    try {
      this.show(await this._load());
    } catch (error) {
      this._charts.replaceChildren();
      this._legend.hidden = true;
      setText(this._message, (error as Error).message);
      this._message.hidden = false;
    }
  }

  /** Draw a report. */
  show(usage: IUsage): void {
    const users = usage.series.users;
    const rows = new Map(usage.rows.map(row => [row.key, row]));
    const everyone = usage.scope === 'everyone';
    this.node.dataset.scope = usage.scope;
    const top = scaleTop(
      Math.max(0, ...users.flatMap(s => [...s.reserved, ...s.used]))
    );
    // Heaviest first, as the report lists them.
    const ordered = [...users].sort(
      (a, b) =>
        (rows.get(b.user)?.reserved_gib_hours ?? 0) -
        (rows.get(a.user)?.reserved_gib_hours ?? 0)
    );
    const charts = ordered.map(series => {
      const row = rows.get(series.user);
      const summary = summaryOf(row);
      const chart = drawChart(
        series,
        usage.series.start,
        usage.series.step,
        top,
        everyone ? SMALL_HEIGHT : HEIGHT,
        `${everyone ? `${series.user}: ` : ''}GPU memory reserved and used over the last day; ${summary}`
      );
      return h(
        'figure',
        { class: 'jp-gpushare-usage-figure' },
        chart,
        h(
          'div',
          { class: 'jp-gpushare-usage-axis', 'aria-hidden': 'true' },
          h('span', {}, '24 h ago'),
          h('span', {}, 'now')
        ),
        h(
          'figcaption',
          { class: 'jp-gpushare-usage-caption' },
          everyone
            ? h('span', { class: 'jp-gpushare-usage-user' }, series.user)
            : '',
          h('span', { class: 'jp-gpushare-usage-summary' }, summary)
        )
      );
    });
    this._charts.replaceChildren(...charts);
    setText(this._legendTop, formatBytes(top));
    setAttr(this._legend, 'title', `Scale: 0 to ${formatBytes(top)}`);
    this._legend.hidden = charts.length === 0;
    const nothing = charts.length === 0;
    setText(
      this._message,
      nothing
        ? everyone
          ? 'No GPU kernel of anyone in the last 24 hours.'
          : 'None of your kernels held a GPU in the last 24 hours.'
        : ''
    );
    this._message.hidden = !nothing;
  }

  private _legendTop = h('span', { class: 'jp-gpushare-usage-top' });
  private _legend = h(
    'div',
    { class: 'jp-gpushare-legend jp-gpushare-usage-legend' },
    h('span', { class: 'jp-gpushare-key jp-gpushare-key-reserved' }),
    'reserved ',
    h('span', { class: 'jp-gpushare-key jp-gpushare-key-used-line' }),
    'used · scale 0–',
    this._legendTop
  );
  private _charts = h('div', { class: 'jp-gpushare-usage-charts' });
  private _message = h('p', { class: 'jp-gpushare-usage-empty' });
}
