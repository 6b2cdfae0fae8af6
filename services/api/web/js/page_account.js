// The logged-in user's account: their roles and what they may do (cluster-wide and in each
// workspace they see), and their tokens, each revocable (revoking this session's logs out).
import { del, get, logout } from "./api.js";
import { Table, attempt, confirmButton, h, fmtTime } from "./dom.js";
import { permissions } from "./perms.js";

const list = (items) => (items.length ? items.join(", ") : h("span", { class: "muted" }, "none"));

function permissionsCard(perms) {
  const { summary } = perms;
  const grants = new Table({ id: "my-assignments", rowKey: (a) => `${a.role}:${a.workspace_id ?? ""}:${a.group_name ?? ""}`, columns: [
    { key: "role", label: "Role" },
    { key: "workspace", label: "Where", render: (a) => (a.workspace_id === null ? "cluster-wide" : h("a", { href: `#/workspaces/${a.workspace_id}` }, a.workspace)) },
    { key: "group_name", label: "Through group", render: (a) => a.group_name || "" },
  ] });
  grants.setRows(summary.assignments);
  const workspaces = new Table({ id: "my-workspace-permissions", rowKey: ([w]) => w, columns: [
    { key: "workspace", label: "Workspace", value: ([w]) => w, render: ([w]) => w },
    { key: "permissions", label: "Permissions", sort: false, render: ([, ps]) => h("span", { class: "wrap" }, ps.join(", ")) },
  ] });
  workspaces.setRows(Object.entries(summary.workspaces));
  return h("div", { class: "card", id: "my-permissions" }, h("h2", {}, "Roles and permissions"),
    h("dl", { class: "kv" },
      h("dt", {}, "User"), h("dd", { id: "account-username" }, summary.username),
      h("dt", {}, "Administrator"), h("dd", {}, summary.admin ? "yes (every permission everywhere)" : "no"),
      h("dt", {}, "Cluster-wide"), h("dd", { id: "cluster-permissions", class: "wrap" }, list(summary.cluster))),
    h("h2", {}, "Roles"), summary.assignments.length ? grants.el : h("p", { class: "muted", id: "no-roles" }, "No role granted."),
    h("h2", {}, "In each workspace you see"), workspaces.el);
}

function tokensCard(perms) {
  const msg = h("p", { class: "error", id: "token-error", role: "alert" });
  let everyone = false;
  const table = new Table({ id: "tokens-table", rowKey: (t) => String(t.id), columns: [
    { key: "id", label: "ID" },
    { key: "username", label: "User" },
    { key: "created_at", label: "Created", render: (t) => fmtTime(t.created_at) },
    { key: "expires_at", label: "Expires", render: (t) => (t.expires_at ? fmtTime(t.expires_at) : "never") },
    { key: "current", label: "", render: (t) => (t.current ? h("span", { class: "tag" }, "this session") : "") },
    { key: "revoke", label: "", sort: false, render: (t) => confirmButton("revoke", { dataset: { action: "revoke" } }, () => attempt(msg, async () => {
      await del(`/tokens/${t.id}`);
      if (t.current) { await logout(); location.hash = "#/login"; return; }
      await load();
    })) },
  ] });
  async function load() {
    const { tokens } = await get(`/tokens${everyone ? "?all=true" : ""}`);
    table.setRows(tokens);
  }
  const all = perms.admin ? h("label", {}, h("input", { type: "checkbox", id: "tokens-all", onchange: (e) => {
    everyone = e.target.checked;
    attempt(msg, load);
  } }), " every user's") : "";
  return { el: h("div", { class: "card", id: "my-tokens" }, h("h2", {}, "Tokens"),
    h("p", { class: "muted" }, "Each login makes a token; revoke one to end that session at once."), all, msg, table.el), load };
}

export async function render(root) {
  const perms = await permissions();
  const tokens = tokensCard(perms);
  root.replaceChildren(h("h1", {}, "Account"), permissionsCard(perms), tokens.el);
  await tokens.load();
}
