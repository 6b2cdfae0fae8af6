// Experiments: a server-paged table with filters, sort, and the row actions (offered where the
// user may change the experiment). A project's page shows the same table for its project.
import { currentUser, followEvents, get, post } from "./api.js";
import { h, fmtNum, fmtTime, fmtDuration, stateBadge, experimentHref, enc } from "./dom.js";
import { permissions } from "./perms.js";

const STATES = ["ACTIVE", "PAUSED", "STOPPING_COMPLETED", "STOPPING_CANCELED", "STOPPING_KILLED",
  "STOPPING_ERROR", "COMPLETED", "CANCELED", "ERROR", "DELETING", "DELETED", "DELETE_FAILED"];
const TERMINAL = new Set(["COMPLETED", "CANCELED", "ERROR"]);
const PAGE = 25;

function actionsFor(e) {
  const a = [];
  if (e.unmanaged) return a; // its script starts and ends its runs
  if (e.state === "ACTIVE") a.push("pause");
  if (e.state === "PAUSED" || e.state === "STOPPING_ERROR") a.push("activate");
  if (e.state === "ACTIVE" || e.state === "PAUSED") a.push("cancel");
  if (["ACTIVE", "PAUSED", "STOPPING_CANCELED"].includes(e.state)) a.push("kill");
  if (TERMINAL.has(e.state)) a.push(e.archived ? "unarchive" : "archive");
  return a;
}

export const workspaceHref = (id) => `#/workspaces/${enc(id)}`;
export const projectHref = (id) => `#/projects/${enc(id)}`;

export async function render(root, _params, query) {
  const list = h("div", {});
  root.replaceChildren(h("h1", {}, "Experiments"), list);
  return experimentList(list, query);
}

/**
 * Fills `root` with the experiment table: filters, server paging, row actions, live refresh.
 * With `projectId`, only that project's experiments (and no Project column).
 *
 * @returns {Promise<() => void>} stops the live refresh
 */
export async function experimentList(root, query, { projectId = null } = {}) {
  const user = currentUser() || {};
  const perms = await permissions();
  const f = {
    state: query.get("state") || "", owner: query.get("owner") || "", name: query.get("name") || "",
    archived: query.get("archived") || "false", order: query.get("order") || "-id", offset: Number(query.get("offset") || 0),
  };
  let sortKey = null, desc = false;
  const status = h("span", { class: "muted", id: "experiments-status" });
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const table = h("div", { class: "table-wrap", id: "experiments-table" });
  const pager = h("div", { class: "pager" });
  let rows = [], total = 0;

  const stateSel = h("select", { id: "filter-state", onchange: (e) => { f.state = e.target.value; f.offset = 0; load(); } },
    h("option", { value: "" }, "any state"), STATES.map((s) => h("option", { value: s, selected: f.state === s }, s)));
  const nameIn = h("input", { id: "filter-name", placeholder: "name contains", value: f.name,
    oninput: debounce((e) => { f.name = e.target.value; f.offset = 0; load(); }, 250) });
  const ownerIn = user.admin ? h("input", { id: "filter-owner", placeholder: "user", value: f.owner,
    oninput: debounce((e) => { f.owner = e.target.value; f.offset = 0; load(); }, 250) }) : null;
  const archSel = h("select", { id: "filter-archived", onchange: (e) => { f.archived = e.target.value; f.offset = 0; load(); } },
    [["false", "not archived"], ["true", "archived"], ["all", "archived or not"]].map(([v, l]) => h("option", { value: v, selected: f.archived === v }, l)));

  root.replaceChildren(
    h("div", { class: "filters" }, stateSel, nameIn, ownerIn, archSel, status),
    msg, table, pager);

  const columns = [
    { key: "id", label: "ID", render: (e) => h("a", { href: experimentHref(e.id) }, e.id) },
    { key: "name", label: "Name", render: (e) => h("span", {}, h("a", { href: experimentHref(e.id) }, e.name || ""),
      e.unmanaged ? h("span", { class: "tag unmanaged", title: "reported by a script outside the cluster (core_v2)" }, " unmanaged") : "") },
    projectId === null ? { key: "project", label: "Project", value: (e) => `${e.workspace}/${e.project}`, render: (e) => h("span", {},
      h("a", { href: workspaceHref(e.workspace_id) }, e.workspace), " / ", h("a", { href: projectHref(e.project_id) }, e.project)) } : null,
    { key: "state", label: "State", render: (e) => stateBadge(e.state) },
    { key: "progress", label: "Progress", render: (e) => e.progress === null ? "" : `${Math.round(100 * e.progress)}%` },
    { key: "searcher_name", label: "Searcher" },
    { key: "searcher_metric", label: "Metric" },
    { key: "best_metric", label: "Best", render: (e) => fmtNum(e.best_metric) },
    { key: "num_trials", label: "Trials (running/total)", render: (e) => h("span", { title: e.max_trials ? `at most ${e.max_trials}` : "" }, `${e.running_trials ?? 0}/${e.num_trials}`) },
    { key: "owner", label: "User" },
    { key: "submitted_at", label: "Started", render: (e) => fmtTime(e.submitted_at) },
    { key: "duration", label: "Duration", value: (e) => (e.ended_at ? new Date(e.ended_at) : new Date()) - new Date(e.submitted_at), render: (e) => fmtDuration(e.submitted_at, e.ended_at) },
    { key: "resource_pool", label: "Pool" },
    { key: "actions", label: "", sort: false, render: (e) => h("span", {},
      (perms.in(e.workspace, "update_experiment", e.owner) ? actionsFor(e) : []).map((a) =>
        h("button", { class: "small", dataset: { action: a, id: e.id }, onclick: () => act(e.id, a) }, a))) },
  ].filter(Boolean);

  async function act(id, action) {
    msg.textContent = "";
    try { await post(`/experiments/${enc(id)}/${action}`, {}); await load(); }
    catch (err) { msg.textContent = `${action} ${id}: ${err.message}`; }
  }

  function draw() {
    let shown = rows;
    if (sortKey) {
      const col = columns.find((c) => c.key === sortKey);
      const val = col.value || ((r) => r[sortKey]);
      shown = [...rows].sort((a, b) => { const x = val(a), y = val(b); return x === y ? 0 : (x === null ? 1 : y === null ? -1 : (x < y ? -1 : 1) * (desc ? -1 : 1)); });
    }
    const head = h("tr", {}, columns.map((c) => h("th", {
      class: c.sort === false ? "" : `sortable ${sortKey === c.key || (!sortKey && c.key === "id") ? ((sortKey ? desc : f.order === "-id") ? "sorted-desc" : "sorted-asc") : ""}`,
      onclick: c.sort === false ? null : () => {
        if (c.key === "id") { sortKey = null; f.order = f.order === "-id" ? "id" : "-id"; f.offset = 0; load(); return; }
        if (sortKey === c.key) desc = !desc; else { sortKey = c.key; desc = false; }
        draw();
      } }, c.label)));
    table.replaceChildren(h("table", {}, h("thead", {}, head), h("tbody", {},
      shown.map((e) => h("tr", { dataset: { id: e.id } }, columns.map((c) => h("td", {}, c.render ? c.render(e) : (e[c.key] ?? "")))))),
    rows.length ? "" : h("p", { class: "muted" }, "No experiments match.")));
    const pages = Math.max(1, Math.ceil(total / PAGE));
    const page = Math.floor(f.offset / PAGE);
    pager.replaceChildren(
      h("button", { class: "small", disabled: page === 0, onclick: () => { f.offset -= PAGE; load(); } }, "‹ prev"),
      h("span", {}, `page ${page + 1} of ${pages} · ${total} experiments`),
      h("button", { class: "small", disabled: page >= pages - 1, onclick: () => { f.offset += PAGE; load(); } }, "next ›"));
  }

  let loading = null;
  async function load() {
    const p = new URLSearchParams({ limit: PAGE, offset: f.offset, order_by: f.order, archived: f.archived });
    if (f.state) p.set("state", f.state);
    if (f.name) p.set("name", f.name);
    if (f.owner) p.set("owner", f.owner);
    if (projectId !== null) p.set("project_id", projectId);
    const mine = (loading = get(`/experiments?${p}`));
    let data;
    try { data = await mine; } catch (err) { if (mine === loading) status.textContent = err.message; return; }
    if (mine !== loading) return;
    rows = data.experiments; total = data.pagination.total;
    status.textContent = "";
    draw();
  }
  await load();

  // Live: admins follow the log's experiment events; users (whose stream must name one
  // experiment) re-read their page every few seconds.
  let stop;
  if (user.admin) {
    const { position } = await get("/projections/position");
    const refresh = debounce(load, 300);
    const stream = followEvents({ after: position,
      types: ["ExperimentSubmitted", "ExperimentStateChanged", "ExperimentArchived", "ExperimentMoved", "TrialRequested", "ValidationReported", "TrialStateChanged"],
      onEvent: refresh });
    stop = () => stream.close();
  } else {
    const timer = setInterval(load, 3000);
    stop = () => clearInterval(timer);
  }
  return stop;
}

export function debounce(fn, ms) {
  let t = null;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}
