// A project: where it is (workspace / project), its rename, archive and delete for those
// allowed, and its experiments in the experiment list's table.
import { get, patch, post, del } from "./api.js";
import { attempt, confirmButton, h, enc } from "./dom.js";
import { permissions } from "./perms.js";
import { experimentList, workspaceHref } from "./page_experiments.js";

function projectActions(project, perms, msg, reload) {
  if (project.immutable) return [];
  const out = [];
  if (perms.in(project.workspace, "update_project")) {
    const name = h("input", { id: "project-new-name", value: project.name, maxlength: 80, size: 18, "aria-label": "new name" });
    const description = h("input", { id: "project-new-description", value: project.description, size: 30, "aria-label": "new description" });
    out.push(h("form", { class: "inline", onsubmit: (e) => {
      e.preventDefault();
      attempt(msg, async () => { await patch(`/projects/${project.id}`, { name: name.value, description: description.value }); await reload(); });
    } }, name, description, h("button", { type: "submit", class: "small", id: "project-edit" }, "save")));
    const verb = project.archived ? "unarchive" : "archive";
    out.push(h("button", { class: "small", id: `project-${verb}`, onclick: () =>
      attempt(msg, async () => { await post(`/projects/${project.id}/${verb}`, {}); await reload(); }) }, verb));
  }
  if (perms.in(project.workspace, "delete_project")) {
    out.push(confirmButton("delete", { id: "project-delete" }, () => attempt(msg, async () => {
      await del(`/projects/${project.id}`);
      location.hash = workspaceHref(project.workspace_id);
    })));
  }
  return out;
}

export async function render(root, [ref], query) {
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const crumbs = h("p", { class: "crumbs", id: "breadcrumbs" });
  const head = h("div", { class: "row" });
  const about = h("p", { class: "muted", id: "project-description-text" });
  const list = h("div", {});

  async function reload() {
    const [project, perms] = await Promise.all([get(`/projects/${enc(ref)}`), permissions()]);
    crumbs.replaceChildren(h("a", { href: "#/workspaces" }, "Workspaces"), " / ",
      h("a", { href: workspaceHref(project.workspace_id) }, project.workspace), " / ", project.name);
    head.replaceChildren(h("h1", { id: "project-title" }, `Project ${project.name} `),
      project.archived ? h("span", { class: "tag archived" }, "archived") : "",
      h("span", { class: "actions", id: "project-actions" }, projectActions(project, perms, msg, reload)));
    about.textContent = project.description;
    return project;
  }
  const project = await reload();
  root.replaceChildren(crumbs, head, about, msg, h("div", { class: "card" }, h("h2", {}, "Experiments"), list));
  return experimentList(list, query, { projectId: project.id });
}
