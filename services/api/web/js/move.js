// The experiment page's place in the hierarchy (workspace / project / experiment) and its
// "Move" form: pick a workspace where the user may create experiments, then one of its projects
// that is not archived.
import { get, post } from "./api.js";
import { attempt, h, enc } from "./dom.js";
import { projectHref, workspaceHref } from "./page_experiments.js";

/** Workspaces / workspace / project / Experiment N, each linked. */
export function breadcrumbs(exp) {
  return [h("a", { href: "#/workspaces" }, "Workspaces"), " / ",
    h("a", { href: workspaceHref(exp.workspace_id) }, exp.workspace), " / ",
    h("a", { href: projectHref(exp.project_id) }, exp.project), " / ", `Experiment ${exp.id}`];
}

/** Whether the user may move `exp` out of its project (the API also checks the destination). */
export const mayMove = (exp, perms) => perms.in(exp.workspace, "delete_experiment", exp.owner) && !exp.archived;

/**
 * The Move button, and its form (hidden until the button is pressed) with the API's answer.
 *
 * @param {() => object} current the experiment as last read
 * @param {Permissions} perms the user's permissions
 * @param {() => Promise<void>} onMoved called after a move succeeded
 */
export function moveControl(current, perms, onMoved) {
  const msg = h("span", { class: "error", id: "move-error", role: "alert" });
  const workspace = h("select", { id: "move-workspace", "aria-label": "workspace" });
  const project = h("select", { id: "move-project", "aria-label": "project" });
  const submit = h("button", { type: "submit", id: "move-submit" }, "Move here");
  const form = h("form", { class: "filters", id: "move-form", hidden: true, onsubmit: (e) => {
    e.preventDefault();
    attempt(msg, async () => {
      await post(`/experiments/${enc(current().id)}/move`, { destination_project_id: Number(project.value) });
      form.hidden = true;
      await onMoved();
    });
  } }, "Move to", workspace, project, submit);

  async function fillProjects() {
    const { projects } = await get(`/workspaces/${enc(workspace.value)}/projects`);
    const open = projects.filter((p) => !p.archived);
    project.replaceChildren(...open.map((p) => h("option", { value: p.id, selected: p.id === current().project_id }, p.name)));
    submit.disabled = !open.length;
  }
  workspace.onchange = () => attempt(msg, fillProjects);

  const button = h("button", { class: "small", id: "experiment-move", onclick: () => attempt(msg, async () => {
    if (!form.hidden) { form.hidden = true; return; }
    const { workspaces } = await get("/workspaces");
    const open = workspaces.filter((w) => !w.archived && perms.in(w.name, "create_experiment"));
    workspace.replaceChildren(...open.map((w) => h("option", { value: w.id, selected: w.id === current().workspace_id }, w.name)));
    form.hidden = false;
    if (open.length) await fillProjects();
  }) }, "Move");
  return { button, el: h("div", { id: "move" }, form, msg) };
}
