// Workspaces: the list of those the user may see (create one, for those allowed), and one
// workspace's page: its projects (create, archive, delete), its own rename/archive/delete, and
// its members with their roles (grant and withdraw, for admins and its WorkspaceAdmins).
import { get, patch, post, del } from "./api.js";
import { Table, attempt, confirmButton, h, enc, fmtTime } from "./dom.js";
import { permissions } from "./perms.js";
import { projectHref, workspaceHref } from "./page_experiments.js";

const archivedTag = (archived) => (archived ? h("span", { class: "tag archived" }, "archived") : "");

async function renderList(root) {
  const perms = await permissions();
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const table = new Table({ id: "workspaces-table", rowKey: (w) => w.name, columns: [
    { key: "name", label: "Name", render: (w) => h("span", {}, h("a", { href: workspaceHref(w.id) }, w.name), " ", archivedTag(w.archived)) },
    { key: "num_projects", label: "Projects" },
    { key: "owner", label: "Owner", render: (w) => w.owner || "–" },
    { key: "created_at", label: "Created", render: (w) => fmtTime(w.created_at) },
  ] });
  const name = h("input", { id: "workspace-name", placeholder: "new workspace name", required: true, maxlength: 80, "aria-label": "workspace name" });
  const create = perms.cluster("create_workspace") ? h("form", { class: "filters", id: "workspace-create-form", onsubmit: (e) => {
    e.preventDefault();
    attempt(msg, async () => {
      const ws = await post("/workspaces", { name: name.value });
      location.hash = workspaceHref(ws.id);
    });
  } }, name, h("button", { type: "submit", id: "workspace-create" }, "Create workspace")) : "";
  const { workspaces } = await get("/workspaces");
  root.replaceChildren(h("h1", {}, "Workspaces"), create, msg, h("div", { class: "card" }, table.el));
  table.setRows(workspaces);
}

/** Rename, archive or unarchive, delete: what the caller may do to the workspace itself. */
function workspaceActions(ws, perms, msg, reload) {
  if (ws.immutable) return [];
  const out = [];
  if (perms.in(ws.name, "update_workspace")) {
    const name = h("input", { id: "workspace-new-name", value: ws.name, maxlength: 80, "aria-label": "new name", size: 18 });
    out.push(h("form", { class: "inline", onsubmit: (e) => {
      e.preventDefault();
      attempt(msg, async () => { await patch(`/workspaces/${ws.id}`, { name: name.value }); await reload(); });
    } }, name, h("button", { type: "submit", class: "small", id: "workspace-rename" }, "rename")));
    const verb = ws.archived ? "unarchive" : "archive";
    out.push(h("button", { class: "small", id: `workspace-${verb}`, onclick: () =>
      attempt(msg, async () => { await post(`/workspaces/${ws.id}/${verb}`, {}); await reload(); }) }, verb));
  }
  if (perms.in(ws.name, "delete_workspace")) {
    out.push(confirmButton("delete", { id: "workspace-delete" }, () => attempt(msg, async () => {
      await del(`/workspaces/${ws.id}`);
      location.hash = "#/workspaces";
    })));
  }
  return out;
}

function projectsCard(ws, perms, msg, reload) {
  const canUpdate = perms.in(ws.name, "update_project") && !ws.archived;
  const canDelete = perms.in(ws.name, "delete_project");
  const table = new Table({ id: "projects-table", rowKey: (p) => p.name, columns: [
    { key: "name", label: "Name", render: (p) => h("span", {}, h("a", { href: projectHref(p.id) }, p.name), " ", archivedTag(p.archived)) },
    { key: "description", label: "Description", render: (p) => p.description },
    { key: "owner", label: "Owner", render: (p) => p.owner || "–" },
    { key: "created_at", label: "Created", render: (p) => fmtTime(p.created_at) },
    { key: "actions", label: "", sort: false, render: (p) => (p.immutable ? "" : h("span", {},
      canUpdate ? h("button", { class: "small", dataset: { action: p.archived ? "unarchive" : "archive" }, onclick: () =>
        attempt(msg, async () => { await post(`/projects/${p.id}/${p.archived ? "unarchive" : "archive"}`, {}); await reload(); }) },
      p.archived ? "unarchive" : "archive") : "",
      canDelete ? confirmButton("delete", { dataset: { action: "delete" } }, () =>
        attempt(msg, async () => { await del(`/projects/${p.id}`); await reload(); })) : "")) },
  ] });
  const name = h("input", { id: "project-name", placeholder: "new project name", required: true, maxlength: 80, "aria-label": "project name" });
  const description = h("input", { id: "project-description", placeholder: "description (optional)", size: 30, "aria-label": "project description" });
  const create = perms.in(ws.name, "create_project") && !ws.archived ? h("form", { class: "filters", id: "project-create-form", onsubmit: (e) => {
    e.preventDefault();
    attempt(msg, async () => {
      await post(`/workspaces/${ws.id}/projects`, { name: name.value, description: description.value });
      name.value = ""; description.value = "";
      await reload();
    });
  } }, name, description, h("button", { type: "submit", id: "project-create" }, "Create project")) : "";
  return { el: h("div", { class: "card" }, h("h2", {}, "Projects"), create, table.el), table };
}

/** Who holds which role here; for those who may assign roles, grant and withdraw. */
async function membersCard(ws, perms, msg) {
  const card = h("div", { class: "card", id: "members" }, h("h2", {}, "Members"));
  if (!perms.in(ws.name, "assign_roles")) {
    const mine = perms.summary.assignments.filter((a) => a.workspace_id === ws.id || a.workspace_id === null);
    card.append(h("p", { class: "muted", id: "my-roles" }, mine.length
      ? `Your roles here: ${mine.map((a) => `${a.role}${a.workspace_id === null ? " (cluster-wide)" : ""}${a.group_name ? ` (through group ${a.group_name})` : ""}`).join(", ")}`
      : "You hold no role here."));
    return card;
  }
  const [{ roles }, { groups }, users] = await Promise.all([get("/roles"), get("/groups"),
    perms.admin ? get("/users").then((d) => d.users) : Promise.resolve([])]);
  const table = new Table({ id: "members-table", rowKey: (a) => `${a.username ? "user" : "group"}:${a.username || a.group_name}:${a.role}`, columns: [
    { key: "who", label: "Member", value: (a) => a.username || a.group_name, render: (a) => a.username || a.group_name },
    { key: "kind", label: "Kind", value: (a) => (a.username ? "user" : "group"), render: (a) => (a.username ? "user" : "group") },
    { key: "role", label: "Role" },
    { key: "withdraw", label: "", sort: false, render: (a) => h("button", { class: "small", dataset: { action: "withdraw" }, onclick: () =>
      attempt(msg, async () => { await post("/roles/remove-assignments", assignment(a.role, a.username ? "user" : "group", a.username || a.group_name)); await load(); }) }, "withdraw") },
  ] });
  const assignment = (role, kind, who) => ({ role_name: role, workspace: String(ws.id), [kind === "user" ? "username" : "group_name"]: who });
  const kind = h("select", { id: "grant-kind", "aria-label": "user or group" }, h("option", { value: "user" }, "user"), h("option", { value: "group" }, "group"));
  const names = h("datalist", { id: "grant-names" });
  const fillNames = () => names.replaceChildren(...(kind.value === "user" ? users.map((u) => u.username) : groups.map((g) => g.name)).map((n) => h("option", { value: n })));
  kind.onchange = fillNames;
  fillNames();
  const who = h("input", { id: "grant-who", list: "grant-names", placeholder: "username or group", required: true, "aria-label": "who" });
  const role = h("select", { id: "grant-role", "aria-label": "role" },
    roles.filter((r) => !r.cluster_only).map((r) => h("option", { value: r.name, title: r.description, selected: r.name === "Viewer" }, r.name)));
  const form = h("form", { class: "filters", id: "grant-form", onsubmit: (e) => {
    e.preventDefault();
    attempt(msg, async () => { await post("/roles/add-assignments", assignment(role.value, kind.value, who.value.trim())); who.value = ""; await load(); });
  } }, "Grant", role, "to", kind, who, names, h("button", { type: "submit", id: "grant-submit" }, "Grant"));

  async function load() {
    const { assignments } = await get("/roles/assignments");
    table.setRows(assignments.filter((a) => a.workspace_id === ws.id));
  }
  card.append(form, table.el);
  await load();
  return card;
}

async function renderWorkspace(root, named) {
  let ref = named; // the id once known: a rename keeps the page
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const head = h("div", { class: "row" });
  const projects = h("div", {});
  const members = h("div", {});
  const crumbs = h("p", { class: "crumbs", id: "breadcrumbs" }, h("a", { href: "#/workspaces" }, "Workspaces"));
  root.replaceChildren(crumbs, head, msg, projects, members);

  async function reload() {
    const [ws, perms] = await Promise.all([get(`/workspaces/${enc(ref)}`), permissions()]);
    ref = String(ws.id);
    const { projects: list } = await get(`/workspaces/${ws.id}/projects`);
    crumbs.replaceChildren(h("a", { href: "#/workspaces" }, "Workspaces"), " / ", ws.name);
    head.replaceChildren(h("h1", { id: "workspace-title" }, `Workspace ${ws.name} `), archivedTag(ws.archived),
      h("span", { class: "actions", id: "workspace-actions" }, workspaceActions(ws, perms, msg, reload)));
    const card = projectsCard(ws, perms, msg, reload);
    card.table.setRows(list);
    projects.replaceChildren(card.el);
    members.replaceChildren(await membersCard(ws, perms, msg));
  }
  await reload();
}

export async function render(root, params) {
  return params.length && params[0] ? renderWorkspace(root, params[0]) : renderList(root);
}
