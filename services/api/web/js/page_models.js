// Models: the model registry's list, and one model's page with its versions, each linking to
// its checkpoint's trial and experiment (and downloading the checkpoint).
import { download, get } from "./api.js";
import { Table, h, enc, fmtTime, stateBadge, experimentHref, trialHref } from "./dom.js";

export const modelHref = (name) => `#/models/${enc(name)}`;

async function renderList(root) {
  const table = new Table({ id: "models-table", rowKey: (m) => m.name, columns: [
    { key: "name", label: "Name", render: (m) => h("a", { href: modelHref(m.name) }, m.name) },
    { key: "description", label: "Description", render: (m) => m.description },
    { key: "labels", label: "Labels", sort: false, render: (m) => (m.labels || []).join(", ") },
    { key: "num_versions", label: "Versions" },
    { key: "username", label: "Owner", render: (m) => m.username },
    { key: "archived", label: "Archived", render: (m) => (m.archived ? "yes" : "") },
    { key: "last_updated_time", label: "Updated", render: (m) => fmtTime(m.last_updated_time) },
  ] });
  const { models } = await get("/models?sort_by=last_updated_time&order_by=desc");
  root.replaceChildren(h("h1", {}, "Models"),
    models.length ? h("div", { class: "card" }, table.el)
      : h("p", { class: "muted", id: "no-models" }, "No models yet: register a checkpoint from a trial's page, or run cairn model create."));
  table.setRows(models);
}

async function renderModel(root, name) {
  const { model, model_versions: versions } = await get(`/models/${enc(name)}/versions`);
  const facts = h("dl", { class: "kv", id: "model-facts" }, ...[
    ["Name", model.name], ["Description", model.description || "–"], ["Owner", model.username],
    ["Workspace", model.workspace], ["Labels", (model.labels || []).join(", ") || "–"],
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
  root.replaceChildren(h("p", {}, h("a", { href: "#/models" }, "← Models")), h("h1", {}, `Model ${model.name}`),
    h("div", { class: "card" }, facts), msg,
    h("div", { class: "card" }, h("h2", {}, "Versions"),
      versions.length ? table.el : h("p", { class: "muted", id: "no-versions" }, "No versions yet.")));
  table.setRows(versions);
}

export async function render(root, params) {
  return params.length && params[0] ? renderModel(root, params[0]) : renderList(root);
}
