// User groups (admins): create one with its first members, add and remove members, delete.
// A group's roles are granted on a workspace's page.
import { get, patch, post, del } from "./api.js";
import { Table, attempt, confirmButton, h, enc } from "./dom.js";

const splitNames = (text) => text.split(",").map((n) => n.trim()).filter(Boolean);

export async function render(root) {
  const msg = h("p", { class: "error", id: "action-error", role: "alert" });
  const users = h("datalist", { id: "group-user-names" });
  const name = h("input", { id: "group-name", placeholder: "new group name", required: true, maxlength: 80, "aria-label": "group name" });
  const members = h("input", { id: "group-members", placeholder: "members, comma-separated (optional)", size: 32, "aria-label": "members" });
  const create = h("form", { class: "filters", id: "group-create-form", onsubmit: (e) => {
    e.preventDefault();
    attempt(msg, async () => {
      await post("/groups", { name: name.value, add_users: splitNames(members.value) });
      name.value = ""; members.value = "";
      await load();
    });
  } }, name, members, h("button", { type: "submit", id: "group-create" }, "Create group"));

  const change = (group, body) => attempt(msg, async () => { await patch(`/groups/${enc(group.id)}`, body); await load(); });
  const table = new Table({ id: "groups-table", rowKey: (g) => g.name, columns: [
    { key: "name", label: "Name" },
    { key: "members", label: "Members", value: (g) => g.members.length, render: (g) => h("span", { class: "members" },
      g.members.length ? g.members.map((m) => h("span", { class: "member", dataset: { member: m } }, m,
        h("button", { class: "small link", title: `remove ${m}`, "aria-label": `remove ${m}`, dataset: { action: "remove-member" },
          onclick: () => change(g, { remove_users: [m] }) }, "×")))
        : h("span", { class: "muted" }, "no members")) },
    { key: "add", label: "", sort: false, render: (g) => {
      const who = h("input", { class: "add-member", list: "group-user-names", placeholder: "username", size: 12, "aria-label": `add to ${g.name}` });
      return h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); change(g, { add_users: splitNames(who.value) }); } },
        who, h("button", { type: "submit", class: "small", dataset: { action: "add-member" } }, "add"));
    } },
    { key: "delete", label: "", sort: false, render: (g) => confirmButton("delete", { dataset: { action: "delete" } }, () =>
      attempt(msg, async () => { await del(`/groups/${enc(g.id)}`); await load(); })) },
  ] });

  async function load() {
    const { groups } = await get("/groups");
    table.setRows(groups);
  }
  const { users: list } = await get("/users");
  users.replaceChildren(...list.map((u) => h("option", { value: u.username })));
  root.replaceChildren(h("h1", {}, "Groups"),
    h("p", { class: "muted" }, "Grant a group a role on a workspace's page; every member then holds it there."),
    create, users, msg, h("div", { class: "card" }, table.el));
  await load();
}
