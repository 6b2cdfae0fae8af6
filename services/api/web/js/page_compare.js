// Compare 2-10 trials, from one experiment or several: curves overlaid per metric, a
// hyperparameter table with "differences only", and "Open TensorBoard" over the trials compared.
import { get } from "./api.js";
import { LineChart, curveControls, color } from "./charts.js";
import { h, fmtNum, trialHref, enc } from "./dom.js";
import { flatHparams } from "./hpplots.js";
import { tensorboardButton } from "./tensorboard.js";

export async function render(root, _params, query) {
  const ids = (query.get("trials") || "").split(",").map((s) => s.trim()).filter(Boolean);
  const input = h("input", { id: "compare-ids", placeholder: "trial ids, comma-separated (2 to 10)", value: ids.join(", "), size: 50 });
  const form = h("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    location.hash = `#/compare?trials=${input.value.split(",").map((s) => s.trim()).filter(Boolean).map(enc).join(",")}`;
  } }, input, h("button", { type: "submit" }, "Compare"));
  const msg = h("p", { class: "error", id: "compare-error", role: "alert" });
  root.replaceChildren(h("h1", {}, "Compare trials"), form, msg);
  if (ids.length < 2 || ids.length > 10) {
    if (ids.length) msg.textContent = "Pick between 2 and 10 trials.";
    else root.append(h("p", { class: "muted" }, "Select trials on an experiment's Trials tab, or type their ids."));
    return;
  }
  const loaded = await Promise.all(ids.map(async (id) => {
    try {
      const [trial, data] = await Promise.all([get(`/trials/${enc(id)}`), get(`/trials/${enc(id)}/series?buckets=400`)]);
      return { id, trial, series: data.series };
    } catch (err) { return { id, error: err }; }
  }));
  const bad = loaded.filter((l) => l.error);
  if (bad.length) msg.textContent = bad.map((l) => `${l.id}: ${l.error.status === 403 ? "not allowed" : l.error.status === 404 ? "not found" : l.error.message}`).join("; ");
  const ok = loaded.filter((l) => !l.error);
  if (ok.length) root.append(h("div", { class: "row", id: "compare-tensorboard" }, tensorboardButton(() => ({ trials: ok.map((l) => l.id) }))));

  // Hyperparameters.
  const names = [...new Set(ok.flatMap((l) => Object.keys(flatHparams(l.trial.hparams))))].sort();
  const diffOnly = h("input", { type: "checkbox", id: "differences-only" });
  const table = h("div", { class: "table-wrap", id: "compare-hparams" });
  const rowsOf = () => {
    const rows = [["experiment", ...ok.map((l) => l.trial.experiment_id)], ["state", ...ok.map((l) => l.trial.state)],
      ["best metric", ...ok.map((l) => fmtNum(l.trial.best_metric))], ["steps", ...ok.map((l) => l.trial.steps_completed)],
      ...names.map((n) => [n, ...ok.map((l) => fmtNum(flatHparams(l.trial.hparams)[n]))])];
    return diffOnly.checked ? rows.filter((r) => new Set(r.slice(1).map(String)).size > 1) : rows;
  };
  const drawTable = () => table.replaceChildren(h("table", {},
    h("thead", {}, h("tr", {}, h("th", {}, ""), ok.map((l, i) => h("th", { style: `color:${color(i)}` }, h("a", { href: trialHref(l.id) }, `trial ${l.id}`))))),
    h("tbody", {}, rowsOf().map((r) => h("tr", { dataset: { name: r[0] } }, h("th", {}, r[0]), r.slice(1).map((v) => h("td", {}, String(v))))))));
  diffOnly.onchange = drawTable;
  drawTable();

  // Curves: one chart per group and metric, every trial overlaid.
  const grid = h("div", { class: "charts-grid", id: "compare-charts" });
  const charts = [];
  const keys = [...new Set(ok.flatMap((l) => l.series.map((s) => `${s.group}\u0000${s.metric}`)))].sort();
  root.append(h("div", { class: "card" }, h("h2", {}, "Hyperparameters ", h("label", { class: "muted" }, diffOnly, " differences only")), table),
    h("h2", {}, "Metrics"), grid);
  for (const key of keys) {
    const [group, metric] = key.split("\u0000");
    const holder = h("div", {});
    const card = h("div", { class: "card", dataset: { metric: `${group}.${metric}` } });
    grid.append(card);
    const chart = new LineChart(holder, { title: `${group} · ${metric}`, height: 240 });
    card.append(curveControls(chart), holder);
    chart.setSeries(ok.flatMap((l, i) => l.series.filter((s) => s.group === group && s.metric === metric)
      .map((s) => ({ key: l.id, label: `trial ${l.id}`, color: color(i), steps: s.steps, values: s.values }))));
    charts.push(chart);
  }
  return () => charts.forEach((c) => c.destroy());
}
