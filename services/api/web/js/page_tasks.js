// Tasks: every task the user may see (their own, those of the workspaces where a role lets them
// see tasks; an admin: everyone's) with its workspace and state, filtered by workspace
// (?workspace=ID), a kill button while it has not ended (where the user may kill it), an "Open"
// link to a served task with a page (a notebook, a TensorBoard) once it is ready (a shell has
// none: its row names the CLI verb that attaches to it), a form that launches a notebook in a
// workspace, and one task's page with its output followed live. TensorBoards are started from an
// experiment's page or the compare page.
//
// "Open" is a plain link to the task's proxy path in a new tab: the browser sends the session
// cookie the login set (path /proxy/, HttpOnly), so no token ever appears in the URL. It is
// offered on the user's own tasks only: the proxy refuses another user's task to a browser
// (its pages are their owner's code on this origin).
import { currentUser, get, post } from "./api.js";
import { logViewer } from "./logs.js";
import { h, enc, fmtTime, stateBadge, trialHref } from "./dom.js";
import { workspaceHref } from "./page_experiments.js";
import { permissions } from "./perms.js";

const taskHref = (id) => `#/tasks/${enc(id)}`;
const poolOf = (t) => (t.config && t.config.resources && t.config.resources.resource_pool) || "default";
/** The task's workspace, linked (a workspace deleted since has no name: a dash). */
const workspaceOf = (t) => t.workspace ? h("a", { href: workspaceHref(t.workspace_id) }, t.workspace) : "–";

/** Where a served task's page is, below its proxy path (a notebook: JupyterLab's; a
 * TensorBoard: the path itself). A shell has no page: a terminal is reached with the CLI. */
const SERVED_PAGE = { notebook: "lab", tensorboard: "" };

function openLink(task) {
  if (!task.ready || !task.proxy_path || task.state === "TERMINATED") return "";
  if ((currentUser() || {}).username !== task.owner) return "";
  if (task.kind === "shell") {
    return h("code", { class: "task-attach", title: "attach a terminal from the CLI" }, `cairn shell open ${task.id}`);
  }
  if (!(task.kind in SERVED_PAGE)) return "";
  return h("a", { class: "task-open", href: `${task.proxy_path}${SERVED_PAGE[task.kind]}`,
    target: "_blank", rel: "noopener" }, "Open");
}

/** The notebook launcher: its workspace (those where the user may start tasks), slots (none by
 * default), an optional idle timeout and description. */
function launchForm(msg, reload, perms) {
  const where = perms.workspacesWith("create_nsc");
  const workspace = h("select", { id: "notebook-workspace", "aria-label": "workspace" },
    where.map((w) => h("option", { value: w, selected: w === "Uncategorized" }, w)));
  const slots = h("input", { id: "notebook-slots", type: "number", min: "0", step: "1", value: "0" });
  const idle = h("input", { id: "notebook-idle-timeout", placeholder: "idle timeout, e.g. 30m", size: 18,
    "aria-label": "idle timeout" });
  const description = h("input", { id: "notebook-description", placeholder: "description (optional)", size: 24,
    "aria-label": "description" });
  const button = h("button", { type: "submit", id: "launch-notebook" }, "Launch notebook");
  return h("form", { class: "filters", id: "notebook-launcher", onsubmit: async (e) => {
    e.preventDefault();
    msg.textContent = "";
    const config = { resources: { slots: Number(slots.value || 0) } };
    if (idle.value.trim()) config.idle_timeout = idle.value.trim();
    if (description.value.trim()) config.description = description.value.trim();
    button.disabled = true;
    try {
      await post("/notebooks", { config, workspace: workspace.value || null });
      idle.value = ""; description.value = "";
      await reload();
    } catch (err) { msg.textContent = err.message; }
    finally { button.disabled = false; }
  } }, description, h("label", { for: "notebook-workspace" }, "in"), workspace,
  h("label", { for: "notebook-slots" }, "slots"), slots, idle, button);
}

/** What a TensorBoard shows: its experiments (every trial) and trials, linked. */
function shows(task) {
  return h("span", { id: "task-shows" }, (task.tensorboard_sources || []).flatMap((s, i) => [i ? "; " : "",
    h("a", { href: `#/experiments/${enc(s.experiment_id)}` }, `experiment ${s.experiment_id}`),
    s.trial_ids === null ? "" : [" trials ", s.trial_ids.flatMap((id, j) => [j ? ", " : "", h("a", { href: trialHref(id) }, id)])]]));
}

function killButton(task, msg, reload, perms) {
  if (task.state === "TERMINATED" || !perms.in(task.workspace, "update_nsc", task.owner)) return "";
  return h("button", { class: "small task-kill", dataset: { task: task.id }, disabled: task.kill_requested,
    onclick: async () => {
      msg.textContent = "";
      try { await post(`/tasks/${enc(task.id)}/kill`, {}); await reload(); }
      catch (err) { msg.textContent = err.message; }
    } }, task.kill_requested ? "killing" : "kill");
}

async function renderList(root, query) {
  const perms = await permissions();
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const table = h("div", { class: "table-wrap", id: "tasks-table" });
  const launcher = h("div", {});
  const { workspaces } = await get("/workspaces");
  let workspaceId = (query && query.get("workspace")) || "";
  const filter = h("select", { id: "filter-workspace", "aria-label": "workspace", onchange: (e) => {
    workspaceId = e.target.value;
    const q = workspaceId ? `?workspace=${enc(workspaceId)}` : "";
    history.replaceState(null, "", `#/tasks${q}`);
    load().catch((err) => { msg.textContent = err.message; });
  } }, h("option", { value: "" }, "every workspace"),
  workspaces.map((w) => h("option", { value: String(w.id), selected: String(w.id) === workspaceId }, w.name)));
  root.replaceChildren(h("h1", {}, "Tasks"), launcher, h("div", { class: "filters" }, filter), msg,
    h("div", { class: "card" }, table));

  async function load() {
    const { tasks } = await get(workspaceId ? `/tasks?workspace_id=${enc(workspaceId)}` : "/tasks");
    const rows = [...tasks].reverse(); // newest first
    table.replaceChildren(rows.length ? h("table", {},
      h("thead", {}, h("tr", {}, ["ID", "Type", "Description", "State", "Outcome", "User", "Workspace", "Pool", "Submitted", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, rows.map((t) => h("tr", { dataset: { task: t.id, state: t.state, workspace: t.workspace } },
        h("td", {}, h("a", { href: taskHref(t.id) }, t.id)), h("td", {}, t.kind), h("td", {}, t.description),
        h("td", {}, stateBadge(t.state)), h("td", {}, t.outcome || ""), h("td", {}, t.owner),
        h("td", { class: "task-workspace" }, workspaceOf(t)), h("td", {}, poolOf(t)),
        h("td", {}, fmtTime(t.requested_at)), h("td", { class: "actions" }, openLink(t), killButton(t, msg, load, perms))))))
      : h("p", { class: "muted" }, workspaceId ? "No tasks you may see in this workspace."
        : "No tasks yet: launch a notebook, open a TensorBoard from an experiment, run a command with cairn cmd run, or start a shell with cairn shell start."));
  }
  launcher.replaceChildren(launchForm(msg, load, perms));
  await load();
  const timer = setInterval(() => load().catch((err) => { msg.textContent = err.message; }), 3000);
  return () => clearInterval(timer);
}

async function renderTask(root, taskId) {
  const perms = await permissions();
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const facts = h("dl", { class: "kv", id: "task-facts" });
  const actions = h("div", { id: "task-actions" });
  const logs = h("div", { id: "task-logs" });
  root.replaceChildren(h("p", {}, h("a", { href: "#/tasks" }, "← Tasks")), h("h1", {}, `Task ${taskId}`), msg,
    h("div", { class: "card" }, facts, actions), h("div", { class: "card" }, h("h2", {}, "Output"), logs));

  async function load() {
    const t = await get(`/tasks/${enc(taskId)}`);
    facts.dataset.state = t.state;
    facts.replaceChildren(...[
      ["Type", t.kind], ["User", t.owner], ["Workspace", workspaceOf(t)], ["State", stateBadge(t.state)],
      t.kind === "tensorboard" ? ["Shows", shows(t)] : ["Command", (t.argv || []).join(" ")],
      ["Description", t.description], ["Pool", poolOf(t)], ["Agent", t.agent_id || "–"],
      ["Outcome", t.outcome || "–"], ["Exit code", t.exit_code ?? "–"], ["Message", t.message || "–"],
      ["Submitted", fmtTime(t.requested_at)], ["Started", fmtTime(t.started_at)], ["Ended", fmtTime(t.ended_at)],
    ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    actions.replaceChildren(openLink(t), killButton(t, msg, load, perms));
    return t;
  }
  await load();
  const stopLogs = logViewer(logs, `/tasks/${enc(taskId)}/logs`, `task-${taskId}.log`);
  const timer = setInterval(() => load().catch((err) => { msg.textContent = err.message; }), 3000);
  return () => { clearInterval(timer); stopLogs(); };
}

export async function render(root, params, query) {
  return params.length && params[0] ? renderTask(root, params[0]) : renderList(root, query);
}
