// Trial: curves of every metric (live), hyperparameters, runs and restarts, checkpoints with
// download and "register" (as a new version of a model, made if missing), and the live log viewer.
import { download, followEvents, get, post } from "./api.js";
import { LineChart, curveControls, color } from "./charts.js";
import { Table, h, fmtNum, fmtTime, stateBadge, experimentHref, enc, perFrame } from "./dom.js";
import { flatHparams } from "./hpplots.js";
import { logViewer } from "./logs.js";

const GROUP_OF = { WorkloadCompleted: "training", ValidationReported: "validation" };

/** Groups a trial's series by metric name (training `loss` and validation `loss` together). */
export function byMetric(series) {
  const out = new Map();
  for (const s of series) {
    const name = s.metric;
    if (!out.has(name)) out.set(name, []);
    out.get(name).push(s);
  }
  return out;
}

export async function render(root, [id]) {
  const path = `/trials/${enc(id)}`;
  let trial = await get(path);
  const data = await get(`${path}/series?buckets=600`);
  const cleanups = [];
  const charts = new Map();
  const info = h("dl", { class: "kv", id: "trial-info" });
  const hparams = h("dl", { class: "kv", id: "trial-hparams" });
  const runs = new Table({ id: "runs-table", columns: [
    { key: "run_id", label: "Run" }, { key: "allocation_id", label: "Allocation" },
    { key: "agent_id", label: "Agent" }, { key: "placements", label: "Slots", render: (a) => Object.entries(a.placements || {}).map(([ag, s]) => `${ag}:${s.join(",")}`).join(" ") },
    { key: "state", label: "State" }, { key: "outcome", label: "Outcome" }, { key: "exit_code", label: "Exit code" },
    { key: "started_at", label: "Started", render: (a) => fmtTime(a.started_at) }, { key: "ended_at", label: "Ended", render: (a) => fmtTime(a.ended_at) },
  ] });
  const ckpts = new Table({ id: "trial-checkpoints", columns: [
    { key: "uuid", label: "UUID", render: (c) => h("code", {}, c.uuid) }, { key: "run_id", label: "Run" },
    { key: "steps_completed", label: "Steps" }, { key: "searcher_metric", label: "Metric", render: (c) => fmtNum(c.searcher_metric) },
    { key: "state", label: "State" }, { key: "reported_at", label: "Saved", render: (c) => fmtTime(c.reported_at) },
    { key: "dl", label: "", sort: false, render: (c) => [
      h("button", { class: "small ckpt-download", onclick: () => download(`/checkpoints/${enc(c.uuid)}/download`, `${c.uuid}.tar.gz`) }, "download"),
      c.state === "COMPLETED" ? h("button", { class: "small ckpt-register", dataset: { uuid: c.uuid }, onclick: () => registering(c.uuid) }, "register") : "",
    ] },
  ] });
  const registerForm = registerCheckpointForm();
  const registering = (uuid) => registerForm.open(uuid);
  const stateEl = h("span", { id: "trial-state" });
  const killBtn = h("button", { class: "small", id: "kill-trial", onclick: async () => { try { await post(`${path}/kill`, {}); await reload(); } catch (err) { msg.textContent = err.message; } } }, "kill");
  const msg = h("span", { class: "error", role: "alert" });
  const live = h("span", { class: "live off", id: "live-status" }, "live");
  const chartsGrid = h("div", { class: "charts-grid", id: "trial-charts" });
  const logsEl = h("div", { id: "trial-logs" });

  function drawInfo() {
    stateEl.replaceChildren(stateBadge(trial.state));
    const kv = [["Experiment", h("a", { href: experimentHref(trial.experiment_id) }, trial.experiment_id)],
      ["State", trial.state], ["Steps", trial.steps_completed], ["Best metric", fmtNum(trial.best_metric)],
      ["Restarts", trial.restarts], ["Progress", trial.progress === null ? "–" : `${Math.round(100 * trial.progress)}%`],
      ["Latest checkpoint", trial.latest_checkpoint || "–"], ["Seed", trial.trial_seed],
      ["Started", fmtTime(trial.started_at)], ["Ended", fmtTime(trial.ended_at)]];
    info.replaceChildren(...kv.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "")]));
    hparams.replaceChildren(...Object.entries(flatHparams(trial.hparams)).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, fmtNum(v))]));
    runs.setRows(trial.allocations || []);
    ckpts.setRows(trial.checkpoints || []);
  }

  function chartFor(name) {
    if (charts.has(name)) return charts.get(name);
    const el = h("div", { class: "card", dataset: { metric: name } });
    const holder = h("div", {});
    chartsGrid.append(el);
    const chart = new LineChart(holder, { title: name, height: 240 });
    el.append(curveControls(chart), holder);
    charts.set(name, chart);
    cleanups.push(() => chart.destroy());
    return chart;
  }
  const groupColor = (g) => (g === "training" ? color(0) : g === "validation" ? color(1) : color(2 + g.length));
  for (const [name, list] of byMetric(data.series)) {
    chartFor(name).setSeries(list.map((s) => ({ key: s.group, label: s.group, color: groupColor(s.group), steps: s.steps, values: s.values })));
  }
  const dirty = new Set();
  const redraw = perFrame(() => { for (const n of dirty) charts.get(n).refresh(); dirty.clear(); });

  root.replaceChildren(
    h("div", { class: "row" }, h("h1", {}, `Trial ${trial.trial_id} `), stateEl, killBtn, msg, live),
    h("div", { class: "row" }, h("div", { class: "card grow" }, h("h2", {}, "Trial"), info), h("div", { class: "card grow" }, h("h2", {}, "Hyperparameters"), hparams)),
    h("h2", {}, "Metrics"), chartsGrid, data.series.length ? "" : h("p", { class: "muted", id: "no-metrics" }, "No metrics reported yet."),
    h("div", { class: "card" }, h("h2", {}, "Runs and restarts"), runs.el),
    h("div", { class: "card" }, h("h2", {}, "Checkpoints"), registerForm.el, ckpts.el),
    h("div", { class: "card" }, h("h2", {}, "Logs"), logsEl));
  drawInfo();
  cleanups.push(logViewer(logsEl, `${path}/logs`, `trial-${trial.trial_id}.log`));

  let timer = null;
  async function reload() { trial = await get(path); drawInfo(); }
  const reloadSoon = () => { if (!timer) timer = setTimeout(() => { timer = null; reload().catch(() => {}); }, 500); };
  const stream = followEvents({
    experimentId: trial.experiment_id, after: data.position,
    types: ["WorkloadCompleted", "ValidationReported", "MetricsReported", "TrialStateChanged", "TrialRestarted", "CheckpointSaved", "TrialStarted", "TrialExited", "SlotsAllocated"],
    onStatus: (on) => { live.className = `live ${on ? "on" : "off"}`; },
    onEvent: (evt) => {
      const p = evt.payload || {};
      if (p.trial_id !== trial.trial_id) return;
      const g = GROUP_OF[evt.type] || (evt.type === "MetricsReported" ? p.group : null);
      if (g) {
        for (const [name, value] of Object.entries(p.metrics || {})) {
          if (typeof value !== "number") continue;
          const chart = chartFor(name);
          if (!chart.series.has(g)) chart.series.set(g, { key: g, label: g, color: groupColor(g), steps: [], values: [] });
          if (chart.addPoint(g, g, p.steps_completed, value)) { dirty.add(name); redraw(); }
        }
        document.getElementById("no-metrics")?.remove();
        if (g === "validation") reloadSoon();
        return;
      }
      reloadSoon();
    },
  });
  cleanups.push(() => stream.close(), () => clearTimeout(timer));
  return () => cleanups.forEach((f) => f());
}

/**
 * The "Register checkpoint" form: registers the chosen checkpoint as the next version of the
 * model named (creating the model when there is none of that name), and links to the model.
 */
function registerCheckpointForm() {
  const names = h("datalist", { id: "register-model-names" });
  const model = h("input", { id: "register-model", list: "register-model-names", placeholder: "model name", required: true, size: 28, "aria-label": "model name" });
  const which = h("code", { id: "register-uuid" });
  const result = h("span", { id: "register-result", role: "status" });
  const submit = h("button", { type: "submit", id: "register-submit" }, "Register");
  let uuid = null;
  const form = h("form", { class: "filters", id: "register-form", hidden: true, onsubmit: async (e) => {
    e.preventDefault();
    const name = model.value.trim();
    result.className = ""; result.textContent = "";
    submit.disabled = true;
    try {
      const { models } = await get("/models");
      if (!models.some((m) => m.name === name)) await post("/models", { name });
      const version = await post(`/models/${encodeURIComponent(name)}/versions`, { checkpoint_uuid: uuid });
      result.replaceChildren(`registered as version ${version.version} of `, h("a", { href: `#/models/${encodeURIComponent(name)}` }, name));
    } catch (err) { result.className = "error"; result.textContent = err.message; }
    finally { submit.disabled = false; }
  } }, "Register checkpoint", which, "as a version of", model, names, submit, result);
  return {
    el: form,
    async open(chosen) {
      uuid = chosen;
      which.textContent = chosen;
      result.textContent = "";
      form.hidden = false;
      model.focus();
      try { const { models } = await get("/models"); names.replaceChildren(...models.map((m) => h("option", { value: m.name }))); }
      catch { /* the names are only suggestions */ }
    },
  };
}
