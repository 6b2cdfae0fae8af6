// Webhooks: the ones the user may see with how their deliveries went (the last answer or error),
// a form that creates one (its signing key shown once), and test and delete buttons on those
// the user may edit.
import { api, get, post } from "./api.js";
import { Table, h, fmtTime } from "./dom.js";

const TRIGGERS = [
  ["EXPERIMENT_STATE_CHANGE:COMPLETED", "experiment completed"],
  ["EXPERIMENT_STATE_CHANGE:ERROR", "experiment errored"],
  ["TRIAL_STATE_CHANGE:COMPLETED", "trial completed"],
  ["TRIAL_STATE_CHANGE:ERROR", "trial errored"],
  ["TASK_STATE_CHANGE:TERMINATED", "task ended"],
  ["CUSTOM:", "alert (specific mode)"],
];

const triggerText = (t) => (t.trigger_type === "CUSTOM" ? "alert"
  : `${t.trigger_type.replace("_STATE_CHANGE", "").toLowerCase()} ${t.condition.state}`);

function lastOutcome(d) {
  if (!d.last_attempt_at) return h("span", { class: "muted" }, d.pending ? "pending" : "never sent");
  if (d.last_error) return h("span", { class: "error webhook-last-error", title: d.last_error }, d.last_error);
  return h("span", { class: "webhook-last-status" }, `answered ${d.last_status}`);
}

function createForm(msg, reload, workspaces) {
  const name = h("input", { id: "webhook-name", placeholder: "name", size: 14, required: true, "aria-label": "name" });
  const url = h("input", { id: "webhook-url", placeholder: "https://…", size: 36, required: true, "aria-label": "URL" });
  const type = h("select", { id: "webhook-type", "aria-label": "type" },
    h("option", { value: "default" }, "JSON"), h("option", { value: "slack" }, "Slack"));
  const scope = h("select", { id: "webhook-workspace", "aria-label": "workspace" },
    h("option", { value: "" }, "global"), ...workspaces.map((w) => h("option", { value: String(w.id) }, w.name)));
  const mode = h("select", { id: "webhook-mode", "aria-label": "mode" },
    h("option", { value: "workspace" }, "every experiment"), h("option", { value: "specific" }, "experiments that name it"));
  const trigger = h("select", { id: "webhook-trigger", "aria-label": "trigger" },
    ...TRIGGERS.map(([v, label]) => h("option", { value: v }, label)));
  const key = h("p", { id: "webhook-key", class: "muted" });
  const button = h("button", { type: "submit", id: "create-webhook" }, "Create webhook");
  const form = h("form", { class: "filters", id: "webhook-form", onsubmit: async (e) => {
    e.preventDefault();
    msg.textContent = ""; key.textContent = "";
    const [kind, state] = trigger.value.split(":");
    const body = { name: name.value.trim(), url: url.value.trim(), webhook_type: type.value, mode: mode.value,
      triggers: [{ trigger_type: kind, condition: state ? { state } : {} }] };
    if (scope.value) body.workspace = scope.value;
    button.disabled = true;
    try {
      const made = await post("/webhooks", body);
      key.textContent = `Webhook ${made.name} created; its deliveries are signed with key ${made.signing_key}`;
      name.value = ""; url.value = "";
      await reload();
    } catch (err) { msg.textContent = err.message; }
    finally { button.disabled = false; }
  } }, name, url, type, scope, mode, trigger, button);
  return [form, key];
}

export async function render(root) {
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const tested = h("p", { id: "webhook-tested", role: "status" });
  const list = h("div", { id: "webhooks-list" });
  const table = new Table({ id: "webhooks-table", rowKey: (w) => String(w.id), columns: [
    { key: "id", label: "ID" },
    { key: "name", label: "Name", render: (w) => w.name },
    { key: "workspace", label: "Workspace", render: (w) => w.workspace || "global" },
    { key: "url", label: "URL", render: (w) => h("code", {}, w.url) },
    { key: "webhook_type", label: "Type", render: (w) => (w.webhook_type === "slack" ? "Slack" : "JSON") },
    { key: "triggers", label: "Triggers", sort: false, render: (w) => w.triggers.map(triggerText).join(", ") },
    { key: "delivered", label: "Delivered", value: (w) => w.delivery.delivered, render: (w) => w.delivery.delivered },
    { key: "failed", label: "Failed", value: (w) => w.delivery.failed, render: (w) => w.delivery.failed },
    { key: "pending", label: "Pending", value: (w) => w.delivery.pending, render: (w) => w.delivery.pending },
    { key: "last", label: "Last", sort: false, render: (w) => lastOutcome(w.delivery) },
    { key: "last_attempt_at", label: "Last attempt", value: (w) => w.delivery.last_attempt_at || "",
      render: (w) => fmtTime(w.delivery.last_attempt_at) },
    { key: "actions", label: "", sort: false, render: (w) => (w.editable ? h("span", {},
      h("button", { class: "small webhook-test", onclick: async () => {
        msg.textContent = ""; tested.textContent = "";
        try {
          const r = await post(`/webhooks/${w.id}/test`, {});
          tested.textContent = r.ok ? `Test delivery to ${w.name}: answered ${r.status}` : `Test delivery to ${w.name} failed: ${r.error}`;
        } catch (err) { msg.textContent = err.message; }
      } }, "test"), " ",
      h("button", { class: "small webhook-delete", onclick: async () => {
        if (!window.confirm(`Delete webhook ${w.name}?`)) return;
        msg.textContent = "";
        try { await api("DELETE", `/webhooks/${w.id}`); await load(); } catch (err) { msg.textContent = err.message; }
      } }, "delete")) : "") },
  ] });

  async function load() {
    const { webhooks } = await get("/webhooks");
    list.replaceChildren(webhooks.length ? table.el
      : h("p", { class: "muted", id: "no-webhooks" }, "No webhooks yet."));
    table.setRows(webhooks);
  }

  const { workspaces } = await get("/workspaces");
  const [form, key] = createForm(msg, load, workspaces);
  root.replaceChildren(h("h1", {}, "Webhooks"), form, key, msg, tested, h("div", { class: "card" }, list));
  await load();
  const timer = setInterval(() => load().catch(() => {}), 5000);
  return () => clearInterval(timer);
}
