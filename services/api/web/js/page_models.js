// Models: the model registry's list (with each model's workspace), and one model's page with
// its versions, each linking to its checkpoint's trial and experiment (and downloading the
// checkpoint), and a "Move" form that moves the model to another workspace.
import { download, get, post } from "./api.js";
import { Table, attempt, h, enc, fmtTime, stateBadge, experimentHref, trialHref } from "./dom.js";
import { workspaceHref } from "./page_experiments.js";
import { permissions } from "./perms.js";

export const modelHref = (name) => `#/models/${enc(name)}`;

async function renderList(root) {
  const table = new Table({ id: "models-table", rowKey: (m) => m.name, columns: [
    { key: "name", label: "Name", render: (m) => h("a", { href: modelHref(m.name) }, m.name) },
    { key: "description", label: "Description", render: (m) => m.description },
    { key: "labels", label: "Labels", sort: false, render: (m) => (m.labels || []).join(", ") },
    { key: "num_versions", label: "Versions" },
    { key: "username", label: "Owner", render: (m) => m.username },
    { key: "workspace", label: "Workspace", render: (m) => h("a", { href: workspaceHref(m.workspace_id) }, m.workspace) },
    { key: "archived", label: "Archived", render: (m) => (m.archived ? "yes" : "") },
    { key: "last_updated_time", label: "Updated", render: (m) => fmtTime(m.last_updated_time) },
  ] });
  const { models } = await get("/models?sort_by=last_updated_time&order_by=desc");
  root.replaceChildren(h("h1", {}, "Models"),
    models.length ? h("div", { class: "card" }, table.el)
      : h("p", { class: "muted", id: "no-models" }, "No models yet: register a checkpoint from a trial's page, or run cairn model create."));
  table.setRows(models);
}

/**
 * The model's "Move" button and its form: a workspace where the user may create models (the
 * API also checks that they may take the model out of its own).
 */
function moveControl(model, perms, onMoved) {
  const msg = h("span", { class: "error", id: "model-move-error", role: "alert" });
  const workspace = h("select", { id: "model-move-workspace", "aria-label": "workspace" });
  const submit = h("button", { type: "submit", id: "model-move-submit" }, "Move here");
  const form = h("form", { class: "filters", id: "model-move-form", hidden: true, onsubmit: (e) => {
    e.preventDefault();
    attempt(msg, async () => {
      await post(`/models/${enc(model.id)}/move`, { destination_workspace_id: Number(workspace.value) });
      form.hidden = true;
      await onMoved();
    });
  } }, "Move to", workspace, submit);
  const button = h("button", { class: "small", id: "model-move", onclick: () => attempt(msg, async () => {
    if (!form.hidden) { form.hidden = true; return; }
    const { workspaces } = await get("/workspaces");
    const open = workspaces.filter((w) => !w.archived && w.id !== model.workspace_id && perms.in(w.name, "create_model_registry"));
    workspace.replaceChildren(...open.map((w) => h("option", { value: w.id }, w.name)));
    submit.disabled = !open.length;
    form.hidden = false;
  }) }, "Move");
  button.hidden = !perms.in(model.workspace, "delete_model_registry", model.username);
  return { button, el: h("div", { id: "model-move-box" }, form, msg) };
}

async function renderModel(root, name) {
  const [{ model, model_versions: versions }, perms] = await Promise.all([
    get(`/models/${enc(name)}/versions`), permissions()]);
  const facts = h("dl", { class: "kv", id: "model-facts" }, ...[
    ["Name", model.name], ["Description", model.description || "–"], ["Owner", model.username],
    ["Workspace", h("a", { id: "model-workspace", href: workspaceHref(model.workspace_id) }, model.workspace)],
    ["Labels", (model.labels || []).join(", ") || "–"],
    ["Archived", model.archived ? "yes" : "no"], ["Versions", model.num_versions],
    ["Created", fmtTime(model.creation_time)], ["Updated", fmtTime(model.last_updated_time)],
  ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  const msg = h("p", { class: "error", role: "alert" });
  const table = new Table({ id: "model-versions", rowKey: (v) => String(v.version), columns: [
    { key: "version", label: "Version" },
    { key: "name", label: "Name", render: (v) => v.name },
    { key: "uuid", label: "Checkpoint", value: (v) => v.checkpoint.uuid, render: (v) => h("code", {}, v.checkpoint.uuid) },
    { key: "experiment", label: "Experiment", value: (v) => v.checkpoint.experiment_id,
      render: (v) => h("a", { href: experimentHref(v.checkpoint.experiment_id) }, v.checkpoint.experiment_id) },
    { key: "trial", label: "Trial", value: (v) => v.checkpoint.trial_id,
      render: (v) => h("a", { class: "version-trial", href: trialHref(v.checkpoint.trial_id) }, v.checkpoint.trial_id) },
    { key: "state", label: "State", value: (v) => v.checkpoint.state, render: (v) => (v.checkpoint.state ? stateBadge(v.checkpoint.state) : "") },
    { key: "username", label: "By", render: (v) => v.username },
    { key: "creation_time", label: "Registered", render: (v) => fmtTime(v.creation_time) },
    { key: "dl", label: "", sort: false, render: (v) => h("button", { class: "small version-download", onclick: async () => {
      msg.textContent = "";
      try { await download(`/checkpoints/${enc(v.checkpoint.uuid)}/download`, `${v.checkpoint.uuid}.tar.gz`); }
      catch (err) { msg.textContent = err.message; }
    } }, "download") },
  ] });
  const move = moveControl(model, perms, () => renderModel(root, String(model.id)));
  root.replaceChildren(h("p", {}, h("a", { href: "#/models" }, "← Models")),
    h("div", { class: "row" }, h("h1", {}, `Model ${model.name}`), move.button), move.el,
    h("div", { class: "card" }, facts), msg,
    h("div", { class: "card" }, h("h2", {}, "Versions"),
      versions.length ? table.el : h("p", { class: "muted", id: "no-versions" }, "No versions yet.")));
  table.setRows(versions);
}

export async function render(root, params) {
  return params.length && params[0] ? renderModel(root, params[0]) : renderList(root);
}
