// Experiment: overview, learning curves of every trial (live), trials, hyperparameter plots,
// checkpoints, logs and config; a history slider shows the overview and trials as they were at
// any past position of the log (GET ?at=POSITION), "now" returns to the live view. Breadcrumbs
// show its workspace and project; "Move" (for those who may) puts it in another project.
import { currentUser, download, followEvents, get, post } from "./api.js";
import { LineChart, curveControls } from "./charts.js";
import { Table, h, fmtNum, fmtTime, fmtDuration, stateBadge, tabs, toYaml, trialHref, enc, perFrame } from "./dom.js";
import { flatHparams, hparamNames } from "./hpplots.js";
import { logViewer } from "./logs.js";
import { breadcrumbs, mayMove, moveControl } from "./move.js";
import { permissions } from "./perms.js";
import { tensorboardButton } from "./tensorboard.js";

const METRIC_EVENTS = { WorkloadCompleted: "training", ValidationReported: "validation" };
const TERMINAL = new Set(["COMPLETED", "CANCELED", "ERROR"]);

function actionsFor(state, archived) {
  const a = [];
  if (state === "ACTIVE") a.push("pause");
  if (state === "PAUSED" || state === "STOPPING_ERROR") a.push("activate");
  if (state === "ACTIVE" || state === "PAUSED") a.push("cancel");
  if (["ACTIVE", "PAUSED", "STOPPING_CANCELED"].includes(state)) a.push("kill");
  if (TERMINAL.has(state)) a.push(archived ? "unarchive" : "archive");
  return a;
}

export async function render(root, [id]) {
  const expPath = `/experiments/${enc(id)}`;
  const width = Math.max(400, root.clientWidth || 1000);
  let group = "validation";
  // The experiment and its searcher metric's curves (the server's default metric) together.
  let [exp, series, perms] = await Promise.all([
    get(expPath),
    get(`${expPath}/series?group=${group}&buckets=${Math.round(width / 3)}`).catch((err) => {
      if (err.status === 403 || err.status === 404) throw err;
      return null;
    }),
    permissions(),
  ]);
  let metric = series ? series.metric : exp.searcher_metric;
  if (series && !series.trials.length && series.metrics.training && series.metrics.training.length && !(series.metrics.validation || []).length) {
    group = "training"; metric = series.metrics.training[0];
    series = await get(`${expPath}/series?group=${group}&metric=${enc(metric)}&buckets=${Math.round(width / 3)}`);
  }
  const cleanups = [];
  let highlighted = null;
  let selected = new Set();
  let brushed = null;

  // Header and overview.
  const title = h("h1", {}, `Experiment ${exp.id}: ${exp.name || ""} `);
  const stateEl = h("span", { id: "experiment-state" });
  const actionsEl = h("span", { id: "experiment-actions" });
  const actionMsg = h("span", { class: "error", id: "action-error", role: "alert" });
  const live = h("span", { class: "live off", id: "live-status" }, "live");
  const crumbs = h("p", { class: "crumbs", id: "breadcrumbs" });
  const move = moveControl(() => exp, perms, () => reload());
  let at = null; // the log position shown; null: the present, kept live
  const slider = h("input", { type: "range", id: "history-slider", "aria-label": "history", step: 1,
    min: exp.submitted_position || 0, max: exp.position || 0, value: exp.position || 0 });
  const historyLabel = h("span", { class: "muted", id: "history-label" }, "now");
  const nowBtn = h("button", { class: "small", id: "history-now", disabled: true, onclick: () => goLive() }, "now");
  slider.oninput = () => { historyLabel.textContent = `log position ${slider.value}`; };
  slider.onchange = () => travel(Number(slider.value));
  function extendHistory(position) {
    if (!(position > Number(slider.max))) return;
    slider.max = position;
    if (at === null) slider.value = position;
  }
  const overview = h("dl", { class: "kv", id: "overview" });
  const configEl = h("pre", { class: "yaml", id: "config-yaml" }, toYaml(exp.config));

  function warningsEl(warnings) {
    if (!warnings || !warnings.length) return "";
    return h("ul", { class: "warnings", id: "config-warnings" },
      ...warnings.map((w) => h("li", {}, h("code", {}, w.path), ` ${w.message}`)));
  }

  function drawHeader() {
    crumbs.replaceChildren(...breadcrumbs(exp));
    move.button.hidden = at !== null || !mayMove(exp, perms);
    stateEl.replaceChildren(stateBadge(exp.state), exp.archived ? " archived" : "",
      exp.unmanaged ? h("span", { class: "tag unmanaged", title: `unmanaged: reported by a script outside the cluster (external id ${exp.external_id || ""})` }, " unmanaged") : "");
    const mayAct = at === null && !exp.unmanaged && perms.in(exp.workspace, "update_experiment", exp.owner);
    actionsEl.replaceChildren(...(mayAct ? actionsFor(exp.state, exp.archived) : []).map((a) =>
      h("button", { class: "small", dataset: { action: a }, onclick: () => act(a) }, a)));
    const restarts = exp.trials.reduce((n, t) => n + (t.restarts || 0), 0);
    const best = exp.trials.find((t) => t.trial_id === exp.best_trial_id);
    const kv = [
      ["User", exp.owner], ["Searcher", `${exp.searcher_name || ""} · ${exp.searcher_metric || ""} (${exp.smaller_is_better ? "smaller" : "larger"} is better)`],
      ["Trials", `${exp.trials.length}${exp.max_trials ? ` of ${exp.max_trials}` : ""} · ${exp.trials.filter((t) => t.state === "ACTIVE").length} active`],
      ["Best trial", exp.best_trial_id ? h("a", { href: trialHref(exp.best_trial_id) }, exp.best_trial_id) : "–"],
      ["Best metric", fmtNum(exp.best_metric)],
      ["Best checkpoint", best && best.latest_checkpoint ? h("code", {}, best.latest_checkpoint) : "–"],
      ["Restarts", restarts], ["Progress", exp.progress === null || exp.progress === undefined ? "–" : `${Math.round(100 * exp.progress)}%`],
      ["Pool", exp.resource_pool || "default"], ["Started", fmtTime(exp.submitted_at)], ["Duration", fmtDuration(exp.submitted_at, exp.ended_at)],
    ];
    overview.replaceChildren(...kv.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }
  async function act(action) {
    actionMsg.textContent = "";
    try { await post(`${expPath}/${action}`, {}); await reload(); }
    catch (err) { actionMsg.textContent = `${action}: ${err.message}`; }
  }

  // Learning curves.
  const chartEl = h("div", { id: "learning-curves" });
  const chart = new LineChart(chartEl, { height: 340, onHighlight: (key) => { highlighted = key; trialsTable.render(); } });
  cleanups.push(() => chart.destroy());
  const metricSel = h("select", { id: "curve-metric", "aria-label": "metric" });
  function fillMetrics(names) {
    const opts = [];
    for (const [g, list] of Object.entries(names || {})) for (const m of list) opts.push([g, m]);
    if (!opts.some(([g, m]) => g === group && m === metric) && metric) opts.unshift([group, metric]);
    metricSel.replaceChildren(...opts.map(([g, m]) => h("option", { value: `${g}\u0000${m}`, selected: g === group && m === metric }, `${g} · ${m}`)));
  }
  fillMetrics(series ? series.metrics : {});
  metricSel.onchange = async () => {
    [group, metric] = metricSel.value.split("\u0000");
    const data = await get(`${expPath}/series?group=${enc(group)}&metric=${enc(metric)}&buckets=${Math.round(width / 3)}`);
    chart.setSeries(toChart(data.trials));
  };
  const toChart = (list) => list.map((s) => ({ key: s.trial_id, label: `trial ${s.trial_id}`, steps: s.steps, values: s.values }));
  const redraw = perFrame(() => chart.refresh());

  // Trials.
  let trialsTable;
  function trialColumns() {
    const names = hparamNames(exp.trials);
    return [
      { key: "pick", label: "", sort: false, render: (t) => h("input", { type: "checkbox", "aria-label": `select ${t.trial_id}`, class: "pick", checked: selected.has(t.trial_id),
        onclick: (e) => { e.stopPropagation(); if (e.target.checked) selected.add(t.trial_id); else selected.delete(t.trial_id); drawCompare(); } }) },
      { key: "trial_id", label: "Trial", value: (t) => t.seq ?? t.trial_id, render: (t) => h("a", { href: trialHref(t.trial_id), onclick: (e) => e.stopPropagation() }, t.trial_id) },
      { key: "state", label: "State", render: (t) => stateBadge(t.state || "") },
      { key: "steps_completed", label: "Steps" },
      { key: "best_metric", label: `Best ${exp.searcher_metric || ""}`, render: (t) => fmtNum(t.best_metric) },
      { key: "restarts", label: "Restarts" },
      ...names.map((n) => ({ key: `hp:${n}`, label: n, value: (t) => flatHparams(t.hparams)[n], render: (t) => fmtNum(flatHparams(t.hparams)[n]) })),
    ];
  }
  trialsTable = new Table({ id: "trials-table", columns: trialColumns(), rowKey: (t) => t.trial_id, pageSize: 50,
    rowClass: (t) => [t.trial_id === highlighted ? "highlight" : "", brushed && !brushed.has(t.trial_id) ? "dim" : ""].join(" "),
    onRowClick: (t) => { highlighted = highlighted === t.trial_id ? null : t.trial_id; chart.highlight(highlighted); trialsTable.render(); } });
  trialsTable.sortKey = "trial_id";
  const compareBtn = h("button", { id: "compare-selected", onclick: () => { location.hash = `#/compare?trials=${[...selected].map(enc).join(",")}`; } });
  function drawCompare() {
    compareBtn.textContent = `Compare selected (${selected.size})`;
    compareBtn.disabled = selected.size < 2 || selected.size > 10;
  }
  drawCompare();

  root.replaceChildren(
    crumbs,
    h("div", { class: "row" }, title, stateEl, actionsEl, move.button, actionMsg, live),
    move.el,
    h("div", { class: "row", id: "experiment-tensorboard" }, tensorboardButton(() => ({ experiments: [exp.id] }))),
    h("div", { class: "row history", id: "history" }, h("span", { class: "muted" }, "History"), slider, historyLabel, nowBtn),
    h("div", { class: "row" },
      h("div", { class: "card grow" }, h("h2", {}, "Overview"), overview),
      h("div", { class: "card grow" }, h("h2", {}, "Config"), warningsEl(exp.warnings), configEl)),
    h("div", { class: "card" }, h("h2", {}, "Learning curves"), curveControls(chart, [metricSel]), chartEl),
    tabs([
      { id: "trials", label: "Trials", render: (pane) => pane.append(h("div", { class: "filters" }, compareBtn, h("span", { class: "muted" }, "click a row to highlight its curve")), trialsTable.el) },
      { id: "hparams", label: "Hyperparameters", render: async (pane) => {
        const { mountHpPlots } = await import("./hpplots.js");
        pane.dataset.smallerIsBetter = String(exp.smaller_is_better);
        const stop = await mountHpPlots(pane, exp.trials, exp.searcher_metric || "metric", {
          onSelect: (ids) => { brushed = ids ? new Set(ids) : null; trialsTable.render(); } });
        cleanups.push(stop);
      } },
      ...((exp.lineage || []).length ? [{ id: "lineage", label: "Lineage", render: (pane) => lineage(pane) }] : []),
      { id: "checkpoints", label: "Checkpoints", render: (pane) => checkpoints(pane) },
      { id: "logs", label: "Logs", render: (pane) => cleanups.push(logViewer(pane, `${expPath}/logs`, `experiment-${exp.id}.log`)) },
    ], "trials"));
  drawHeader();
  trialsTable.render();
  if (series) chart.setSeries(toChart(series.trials));

  // Trials the search cloned from others (PBT): parent, round, warm-start checkpoint, change.
  function lineage(pane) {
    const change = (c) => Object.entries(c || {}).map(([k, v]) =>
      `${k} ${fmtNum(v && v.from)} → ${fmtNum(v && v.to)}`).join(", ") || "(same hyperparameters)";
    const table = new Table({ id: "lineage-table", columns: [
      { key: "trial_id", label: "Trial", render: (r) => h("a", { href: trialHref(r.trial_id) }, r.trial_id) },
      { key: "parent_trial_id", label: "Parent", render: (r) => r.parent_trial_id ? h("a", { href: trialHref(r.parent_trial_id) }, r.parent_trial_id) : "" },
      { key: "round", label: "Round" },
      { key: "warm_start_checkpoint", label: "Warm start", render: (r) => r.warm_start_checkpoint ? h("code", {}, `${r.warm_start_checkpoint.slice(0, 8)} @${r.warm_start_steps}`) : "" },
      { key: "change", label: "Change", sort: false, render: (r) => change(r.change) },
    ] });
    table.setRows(exp.lineage);
    pane.replaceChildren(table.el);
  }

  async function checkpoints(pane) {
    const data = await get(`${expPath}/checkpoints?limit=200`);
    const table = new Table({ id: "checkpoints-table", columns: [
      { key: "uuid", label: "UUID", render: (c) => h("code", {}, c.uuid) },
      { key: "trial_id", label: "Trial", render: (c) => h("a", { href: trialHref(c.trial_id) }, c.trial_id) },
      { key: "steps_completed", label: "Steps" },
      { key: "searcher_metric", label: exp.searcher_metric || "metric", render: (c) => fmtNum(c.searcher_metric) },
      { key: "state", label: "State" },
      { key: "reported_at", label: "Saved", render: (c) => fmtTime(c.reported_at) },
      { key: "dl", label: "", sort: false, render: (c) => h("button", { class: "small", onclick: () => download(`/checkpoints/${enc(c.uuid)}/download`, `${c.uuid}.tar.gz`) }, "download") },
    ] });
    table.setRows(data.checkpoints);
    pane.replaceChildren(table.el, data.checkpoints.length ? "" : h("p", { class: "muted" }, "No checkpoints yet."));
  }

  function show(next) {
    exp = next;
    drawHeader();
    trialsTable.columns = trialColumns();
    trialsTable.setRows(exp.trials);
  }
  let reloading = null;
  async function reload() {
    if (at !== null) return null; // a past state stays as it was
    if (reloading) return reloading;
    reloading = (async () => {
      try {
        const next = await get(expPath);
        extendHistory(next.position);
        if (at === null) show(next);
      } finally { reloading = null; }
    })();
    return reloading;
  }
  async function travel(position) {
    if (position >= Number(slider.max)) return goLive();
    at = position;
    historyLabel.textContent = `loading position ${position}…`;
    try {
      const past = await get(`${expPath}?at=${position}`);
      if (at !== position) return; // moved again meanwhile
      show(past);
      historyLabel.textContent = `as it was at log position ${position}`;
      nowBtn.disabled = false;
    } catch (err) {
      if (at === position) historyLabel.textContent = `position ${position}: ${err.message}`;
    }
  }
  async function goLive() {
    at = null;
    slider.value = slider.max;
    historyLabel.textContent = "now";
    nowBtn.disabled = true;
    await reload();
  }
  trialsTable.setRows(exp.trials);
  let reloadTimer = null;
  const reloadSoon = () => { if (!reloadTimer) reloadTimer = setTimeout(() => { reloadTimer = null; reload(); }, 500); };

  const stream = followEvents({
    experimentId: exp.id, after: series ? series.position : 0,
    types: ["WorkloadCompleted", "ValidationReported", "MetricsReported", "TrialRequested", "TrialStateChanged",
      "ExperimentStateChanged", "ExperimentArchived", "TrialRestarted", "CheckpointSaved", "TrialStarted", "TrialExited"],
    onStatus: (on) => { live.className = `live ${on ? "on" : "off"}`; },
    onEvent: (evt) => {
      extendHistory(evt.position);
      const p = evt.payload || {};
      const g = METRIC_EVENTS[evt.type] || (evt.type === "MetricsReported" ? p.group : null);
      if (g) {
        if (g === group && typeof p.metrics?.[metric] === "number") {
          if (chart.addPoint(p.trial_id, `trial ${p.trial_id}`, p.steps_completed, p.metrics[metric])) redraw();
        }
        if (g === "validation") reloadSoon();
        return;
      }
      reloadSoon();
    },
  });
  cleanups.push(() => stream.close(), () => clearTimeout(reloadTimer));
  return () => cleanups.forEach((f) => f());
}
