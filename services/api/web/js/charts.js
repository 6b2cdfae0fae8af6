// Learning curves on uPlot (many series, log axis, smoothing, click to highlight, live points)
// and ECharts, loaded only by the pages that draw hyperparameter plots.
import uPlot from "/ui/vendor/uPlot.esm.js";
import { h, fmtNum } from "./dom.js";

let echartsModule = null;
/** The ECharts module, imported on first use (it is large and only some pages need it). */
export async function echarts() {
  if (!echartsModule) echartsModule = await import("/ui/vendor/echarts.esm.min.js");
  return echartsModule;
}

const PALETTE = ["#2664c9", "#e4572e", "#17a398", "#f3a712", "#7b4fb6", "#c2185b", "#5c946e",
  "#3a86ff", "#8d6a9f", "#dd7230", "#2b9348", "#6c757d"];
export const color = (i) => PALETTE[i % PALETTE.length];

/** Exponential moving average with weight w in [0, 1) (0: none), debiased at the start. */
export function smooth(values, w) {
  if (!w) return values;
  const out = new Array(values.length);
  let acc = 0, n = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v === null || !Number.isFinite(v)) { out[i] = null; continue; }
    acc = acc * w + (1 - w) * v; n++;
    out[i] = acc / (1 - Math.pow(w, n));
  }
  return out;
}

/**
 * Line chart of many series sharing a step axis.
 * series: Map/array of {key, label, steps: number[], values: number[]}.
 */
export class LineChart {
  constructor(container, { title = "", height = 320, onHighlight = () => {}, xLabel = "batches" } = {}) {
    this.container = container;
    this.height = height;
    this.onHighlight = onHighlight;
    this.xLabel = xLabel;
    this.title = title;
    this.series = new Map();
    this.logY = false;
    this.smoothing = 0;
    this.highlighted = null;
    this.focused = null;
    this.plot = null;
    this.label = h("div", { class: "chart-label" });
    this.holder = h("div", { class: "chart" });
    container.replaceChildren(this.holder, this.label);
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(container);
    this.drawCount = 0;
  }

  setSeries(list) {
    this.series = new Map(list.map((s) => [s.key, { ...s, steps: [...s.steps], values: [...s.values] }]));
    this.rebuild();
  }

  /** Adds one live point (ignored if the series already has that step). */
  addPoint(key, label, step, value) {
    let s = this.series.get(key);
    if (!s) { s = { key, label, steps: [], values: [] }; this.series.set(key, s); }
    const n = s.steps.length;
    if (n && s.steps[n - 1] >= step) {
      if (s.steps.includes(step)) return false;
      let i = s.steps.findIndex((x) => x > step);
      s.steps.splice(i, 0, step); s.values.splice(i, 0, value);
    } else { s.steps.push(step); s.values.push(value); }
    return true;
  }

  setLog(on) { this.logY = on; this.rebuild(); }
  setSmoothing(w) { this.smoothing = w; this.rebuild(); }

  highlight(key) {
    this.highlighted = key;
    if (!this.plot) return;
    const keys = [...this.series.keys()];
    keys.forEach((k, i) => {
      const s = this.plot.series[i + 1];
      s.width = k === key ? 3 : 1;
      s.alpha = key === null || k === key ? 1 : 0.25;
    });
    this.plot.redraw(false);
    const s = this.series.get(key);
    this.label.textContent = s ? `highlighted: ${s.label}` : "";
    this.container.dataset.highlighted = key === null ? "" : key;
  }

  /** Total points held across series (exposed on the container as data-points). */
  pointCount() {
    let n = 0;
    for (const s of this.series.values()) n += s.steps.length;
    return n;
  }

  data() {
    this.container.dataset.points = String(this.pointCount());
    this.container.dataset.series = String(this.series.size);
    const all = new Set();
    for (const s of this.series.values()) for (const x of s.steps) all.add(x);
    const xs = Float64Array.from(all).sort();
    const index = new Map();
    xs.forEach((x, i) => index.set(x, i));
    const cols = [xs];
    for (const s of this.series.values()) {
      const col = new Array(xs.length).fill(null);
      const vals = smooth(s.values, this.smoothing);
      for (let i = 0; i < s.steps.length; i++) {
        const v = vals[i];
        col[index.get(s.steps[i])] = this.logY && !(v > 0) ? null : v;
      }
      cols.push(col);
    }
    return cols;
  }

  rebuild() {
    if (this.plot) { this.plot.destroy(); this.plot = null; }
    const width = Math.max(300, this.container.clientWidth || 600);
    const keys = [...this.series.keys()];
    const many = keys.length > 30;
    const opts = {
      width, height: this.height, title: this.title,
      legend: { show: false },
      scales: { x: { time: false }, y: { distr: this.logY ? 3 : 1 } },
      axes: [{ label: this.xLabel }, { size: 60, values: (u, vals) => vals.map((v) => fmtNum(v, 3)) }],
      cursor: { focus: { prox: 16 }, points: { show: !many } },
      focus: { alpha: 0.3 },
      series: [{}, ...keys.map((k, i) => {
        const s = this.series.get(k);
        return { label: s.label, stroke: s.color || color(i), width: 1, spanGaps: true, points: { show: false } };
      })],
      hooks: {
        setSeries: [(u, i, o) => { if (o && o.focus) this.focused = i; }],
        setCursor: [(u) => this.hover(u)],
        draw: [() => { this.drawCount++; this.container.dataset.drawn = String(this.drawCount); }],
      },
    };
    this.plot = new uPlot(opts, this.data(), this.holder);
    this.plot.over.addEventListener("click", () => {
      if (this.focused === null || this.focused < 1) return;
      const key = keys[this.focused - 1];
      const next = this.highlighted === key ? null : key;
      this.highlight(next);
      this.onHighlight(next);
    });
    if (this.highlighted !== null) this.highlight(this.highlighted);
  }

  hover(u) {
    const i = u.cursor.idx;
    if (i === null || i === undefined || this.focused === null || this.focused < 1) return;
    const keys = [...this.series.keys()];
    const s = this.series.get(keys[this.focused - 1]);
    const v = u.data[this.focused] ? u.data[this.focused][i] : null;
    if (s && v !== null && v !== undefined && this.highlighted === null) {
      this.label.textContent = `${s.label} · step ${u.data[0][i]} · ${fmtNum(v)}`;
    }
  }

  /** Redraws with the current points (after addPoint), keeping zoom-free full extent. */
  refresh() {
    if (!this.plot || this.plot.series.length !== this.series.size + 1) { this.rebuild(); return; }
    this.plot.setData(this.data());
  }

  resize() {
    if (!this.plot) return;
    const width = Math.max(300, this.container.clientWidth || 600);
    if (Math.abs(width - this.plot.width) > 4) this.plot.setSize({ width, height: this.height });
  }

  destroy() { this.observer.disconnect(); if (this.plot) this.plot.destroy(); }
}

/** The controls row of a learning-curve chart: log axis and smoothing. */
export function curveControls(chart, extra = []) {
  const log = h("input", { type: "checkbox", "aria-label": "log scale", onchange: (e) => chart.setLog(e.target.checked) });
  const slider = h("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: "0", "aria-label": "smoothing",
    oninput: (e) => { out.textContent = e.target.value; chart.setSmoothing(Number(e.target.value)); } });
  const out = h("span", {}, "0");
  return h("div", { class: "chart-controls" }, extra, h("label", {}, log, " log scale"), h("label", {}, "smoothing ", slider, " ", out));
}
