// Hyperparameter plots on ECharts: parallel coordinates with brushing, scatter of each
// hyperparameter against the metric, and a heat map of two hyperparameters.
import { echarts } from "./charts.js";
import { h, fmtNum } from "./dom.js";

/** Flattens nested hyperparameters to dotted names. */
export function flatHparams(hp, prefix = "", out = {}) {
  for (const [k, v] of Object.entries(hp || {})) {
    if (v !== null && typeof v === "object" && !Array.isArray(v)) flatHparams(v, `${prefix}${k}.`, out);
    else out[`${prefix}${k}`] = Array.isArray(v) ? JSON.stringify(v) : v;
  }
  return out;
}

export function hparamNames(trials) {
  const names = new Set();
  for (const t of trials) for (const k of Object.keys(flatHparams(t.hparams))) names.add(k);
  return [...names].sort();
}

const isNumeric = (values) => values.every((v) => v === null || v === undefined || typeof v === "number");

function axisFor(name, values, i) {
  if (isNumeric(values)) return { dim: i, name, type: "value", scale: true };
  const cats = [...new Set(values.map((v) => String(v)))].sort();
  return { dim: i, name, type: "category", data: cats };
}

/**
 * Mounts the three plots. `trials`: [{trial_id, hparams, best_metric}], `metric`: its name.
 * `onSelect(ids|null)` receives the trial ids left by the brushes (null: no brush).
 */
export async function mountHpPlots(container, trials, metric, { onSelect = () => {} } = {}) {
  const ec = await echarts();
  const flat = trials.map((t) => ({ id: t.trial_id, hp: flatHparams(t.hparams), m: t.best_metric }));
  // Plot the hyperparameters the search varied (all of them if none varies), most values first.
  const distinct = (n) => new Set(flat.map((t) => JSON.stringify(t.hp[n]))).size;
  const all = hparamNames(trials);
  const varied = all.filter((n) => distinct(n) > 1);
  const names = (varied.length ? varied : all).sort((a, b) => distinct(b) - distinct(a) || a.localeCompare(b));
  const charts = [];
  const info = h("span", { class: "muted", id: "pcp-selection" }, `${flat.length} trials`);
  const pcpEl = h("div", { class: "echart", id: "pcp" });
  const scatterGrid = h("div", { class: "charts-grid", id: "scatters" });
  const xSel = h("select", { id: "heat-x", "aria-label": "heat map x" }, names.map((n, i) => h("option", { value: n, selected: i === 0 }, n)));
  const ySel = h("select", { id: "heat-y", "aria-label": "heat map y" }, names.map((n, i) => h("option", { value: n, selected: i === Math.min(1, names.length - 1) }, n)));
  const heatEl = h("div", { class: "echart", id: "heatmap" });
  container.replaceChildren(
    h("div", { class: "card" }, h("h2", {}, "Parallel coordinates ", info),
      h("p", { class: "muted" }, "Drag along an axis to keep only the trials in that range; click the axis outside a range to clear it."), pcpEl),
    h("div", { class: "card" }, h("h2", {}, `Each hyperparameter against ${metric}`), scatterGrid),
    h("div", { class: "card" }, h("h2", {}, `Heat map of ${metric}`), h("div", { class: "filters" }, "x ", xSel, " y ", ySel), heatEl));
  if (!names.length) { container.prepend(h("p", { class: "muted" }, "This experiment has no hyperparameters.")); return () => {}; }

  // Parallel coordinates.
  const dims = [...names, metric];
  const columns = dims.map((d, i) => (i < names.length ? flat.map((t) => t.hp[d]) : flat.map((t) => t.m)));
  const axes = dims.map((d, i) => axisFor(d, columns[i], i));
  const rows = flat.map((t, r) => dims.map((d, i) => {
    const v = columns[i][r];
    return axes[i].type === "category" ? String(v) : v ?? null;
  }));
  const pcp = ec.init(pcpEl);
  charts.push(pcp);
  pcp.setOption({
    animation: false,
    parallelAxis: axes,
    parallel: { left: 60, right: 90, top: 40, bottom: 30 },
    tooltip: { trigger: "item", formatter: (p) => `trial ${flat[p.dataIndex].id}` },
    series: [{ type: "parallel", data: rows, lineStyle: { width: 1, opacity: 0.6 },
      inactiveStyle: { opacity: 0.05 }, activeStyle: { width: 1.5, opacity: 0.9 }, smooth: false }],
    visualMap: flat.some((t) => t.m !== null) ? { show: false, dimension: dims.length - 1, min: Math.min(...flat.filter((t) => t.m !== null).map((t) => t.m)),
      max: Math.max(...flat.filter((t) => t.m !== null).map((t) => t.m)), inRange: { color: ["#2664c9", "#17a398", "#f3a712", "#e4572e"] } } : undefined,
  });
  pcp.on("axisareaselected", () => {
    const series = pcp.getModel().getSeries()[0];
    const active = series.getRawIndicesByActiveState("active");
    const brushed = pcp.getModel().findComponents({ mainType: "parallelAxis" }).some((a) => a.activeIntervals && a.activeIntervals.length);
    const ids = brushed ? active.map((i) => flat[i].id) : null;
    info.textContent = ids ? `${ids.length} of ${flat.length} trials selected` : `${flat.length} trials`;
    pcpEl.dataset.selected = ids ? String(ids.length) : "";
    onSelect(ids);
  });

  // Scatter of each hyperparameter against the metric.
  const scored = flat.filter((t) => t.m !== null && t.m !== undefined);
  for (const [i, name] of names.entries()) {
    const el = h("div", { class: "echart small", dataset: { hparam: name } });
    scatterGrid.append(el);
    const chart = ec.init(el);
    charts.push(chart);
    const axis = axes[i];
    chart.setOption({
      animation: false,
      title: { text: name, textStyle: { fontSize: 13 } },
      grid: { left: 60, right: 20, top: 40, bottom: 40 },
      tooltip: { formatter: (p) => `trial ${p.data[2]}<br>${name}: ${p.data[0]}<br>${metric}: ${fmtNum(p.data[1])}` },
      xAxis: axis.type === "category" ? { type: "category", data: axis.data, name } : { type: "value", scale: true, name },
      yAxis: { type: "value", scale: true, name: metric },
      series: [{ type: "scatter", symbolSize: 7, data: scored.map((t) => [axis.type === "category" ? String(t.hp[name]) : t.hp[name], t.m, t.id]) }],
    });
  }

  // Heat map: the best metric in each cell of two hyperparameters (numbers binned in 8).
  const heat = ec.init(heatEl);
  charts.push(heat);
  const smaller = container.dataset.smallerIsBetter !== "false";
  function bins(name) {
    const values = scored.map((t) => t.hp[name]);
    if (!isNumeric(values)) {
      const cats = [...new Set(values.map(String))].sort();
      return { labels: cats, of: (v) => cats.indexOf(String(v)) };
    }
    const distinct = [...new Set(values)].sort((a, b) => a - b);
    if (distinct.length <= 8) return { labels: distinct.map((v) => fmtNum(v, 3)), of: (v) => distinct.indexOf(v) };
    const positive = distinct[0] > 0;
    const logScale = positive && distinct[distinct.length - 1] / distinct[0] > 100;
    const f = logScale ? Math.log10 : (x) => x;
    const lo = f(distinct[0]), hi = f(distinct[distinct.length - 1]);
    const n = 8, w = (hi - lo) / n || 1;
    const inv = logScale ? (x) => 10 ** x : (x) => x;
    return { labels: Array.from({ length: n }, (_, i) => `${fmtNum(inv(lo + i * w), 2)}–${fmtNum(inv(lo + (i + 1) * w), 2)}`),
      of: (v) => Math.min(n - 1, Math.floor((f(v) - lo) / w)) };
  }
  function drawHeat() {
    const bx = bins(xSel.value), by = bins(ySel.value);
    const cells = new Map();
    for (const t of scored) {
      const key = `${bx.of(t.hp[xSel.value])},${by.of(t.hp[ySel.value])}`;
      const cur = cells.get(key);
      if (cur === undefined || (smaller ? t.m < cur : t.m > cur)) cells.set(key, t.m);
    }
    const data = [...cells].map(([k, v]) => [...k.split(",").map(Number), v]);
    const vals = data.map((d) => d[2]);
    heat.setOption({
      animation: false,
      tooltip: { formatter: (p) => `${xSel.value}: ${bx.labels[p.data[0]]}<br>${ySel.value}: ${by.labels[p.data[1]]}<br>best ${metric}: ${fmtNum(p.data[2])}` },
      grid: { left: 110, right: 90, top: 20, bottom: 60 },
      xAxis: { type: "category", data: bx.labels, name: xSel.value, nameLocation: "middle", nameGap: 35 },
      yAxis: { type: "category", data: by.labels, name: ySel.value },
      visualMap: { min: vals.length ? Math.min(...vals) : 0, max: vals.length ? Math.max(...vals) : 1, calculable: true, orient: "vertical", right: 0, top: "center",
        inRange: { color: smaller ? ["#2b9348", "#f3f3b0", "#c53030"] : ["#c53030", "#f3f3b0", "#2b9348"] } },
      series: [{ type: "heatmap", data, label: { show: data.length <= 64, formatter: (p) => fmtNum(p.data[2], 3) } }],
    }, true);
  }
  xSel.onchange = drawHeat; ySel.onchange = drawHeat;
  drawHeat();
  const resize = () => charts.forEach((c) => c.resize());
  window.addEventListener("resize", resize);
  return () => { window.removeEventListener("resize", resize); charts.forEach((c) => c.dispose()); };
}
