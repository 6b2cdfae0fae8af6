// The single page: a hash router over the views, login, error pages, and the user menu.
import { ApiError, currentUser, login, logout, token } from "./api.js";
import { h } from "./dom.js";

const app = document.getElementById("app");
let cleanup = null;

const ROUTES = [
  [/^\/experiments\/?$/, "experiments", () => import("./page_experiments.js")],
  [/^\/experiments\/([^/]+)$/, "experiments", () => import("./page_experiment.js")],
  [/^\/workspaces\/?$/, "workspaces", () => import("./page_workspaces.js")],
  [/^\/workspaces\/([^/]+)$/, "workspaces", () => import("./page_workspaces.js")],
  [/^\/projects\/([^/]+)$/, "workspaces", () => import("./page_project.js")],
  [/^\/groups\/?$/, "groups", () => import("./page_groups.js")],
  [/^\/account\/?$/, "account", () => import("./page_account.js")],
  [/^\/trials\/([^/]+)$/, "experiments", () => import("./page_trial.js")],
  [/^\/compare\/?$/, "compare", () => import("./page_compare.js")],
  [/^\/cluster\/?$/, "cluster", () => import("./page_cluster.js")],
  [/^\/tasks\/?$/, "tasks", () => import("./page_tasks.js")],
  [/^\/tasks\/([^/]+)$/, "tasks", () => import("./page_tasks.js")],
  [/^\/models\/?$/, "models", () => import("./page_models.js")],
  [/^\/models\/(.+)$/, "models", () => import("./page_models.js")],
  [/^\/webhooks\/?$/, "webhooks", () => import("./page_webhooks.js")],
];

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/experiments";
  const [path, query = ""] = raw.split("?");
  return { path, query: new URLSearchParams(query) };
}

/** The user menu: the user's name, a link to their permissions and tokens, and log out. */
function showUser() {
  const el = document.getElementById("whoami");
  const user = currentUser();
  el.replaceChildren();
  for (const a of document.querySelectorAll("[data-admin-only]")) a.hidden = !(token() && user && user.admin);
  if (!(token() && user)) return;
  const menu = h("div", { class: "menu", id: "user-menu", role: "menu", hidden: true },
    h("p", { class: "muted" }, "Logged in as ", h("b", {}, user.username), user.admin ? " (admin)" : ""),
    h("a", { href: "#/account", id: "menu-account", role: "menuitem" }, "Permissions and tokens"),
    h("button", { class: "small", id: "logout", role: "menuitem", onclick: async () => { await logout(); location.hash = "#/login"; render(); } }, "Log out"));
  const button = h("button", { class: "small", id: "user-menu-button", "aria-haspopup": "menu",
    onclick: (e) => { e.stopPropagation(); menu.hidden = !menu.hidden; } }, `${user.username}${user.admin ? " (admin)" : ""} ▾`);
  el.append(button, menu);
}
document.addEventListener("click", (e) => {
  const menu = document.getElementById("user-menu");
  if (menu && !menu.hidden && !menu.contains(e.target)) menu.hidden = true;
});

/** Shows an error as a page: not allowed, not found, or the message. */
export function errorPage(root, err) {
  if (err instanceof ApiError && err.status === 403) {
    root.replaceChildren(h("div", { class: "notice card", id: "page-error", dataset: { status: "403" } },
      h("p", { class: "error" }, "Not allowed"), h("p", { class: "muted" }, err.message)));
  } else if (err instanceof ApiError && err.status === 404) {
    root.replaceChildren(h("div", { class: "notice card", id: "page-error", dataset: { status: "404" } },
      h("p", { class: "error" }, "Not found"), h("p", { class: "muted" }, err.message)));
  } else {
    console.warn(err);
    root.replaceChildren(h("div", { class: "notice card", id: "page-error" },
      h("p", { class: "error" }, "Something went wrong"), h("p", { class: "muted" }, String(err.message || err))));
  }
}

function loginPage(root, next) {
  const user = h("input", { id: "username", name: "username", autocomplete: "username", required: true });
  const pass = h("input", { id: "password", name: "password", type: "password", autocomplete: "current-password" });
  const msg = h("p", { class: "error", id: "login-error", role: "alert" });
  const form = h("form", { class: "card login", id: "login-form",
    onsubmit: async (e) => {
      e.preventDefault();
      msg.textContent = "";
      try {
        await login(user.value, pass.value);
        location.hash = next || "#/experiments";
        render();
      } catch (err) {
        msg.textContent = err instanceof ApiError && err.status === 401 ? "Wrong username or password." : `Login failed: ${err.message}`;
      }
    } },
  h("h1", {}, "Log in to cairn"),
  h("label", { for: "username" }, "Username"), user,
  h("label", { for: "password" }, "Password"), pass,
  h("button", { type: "submit" }, "Log in"), msg);
  root.replaceChildren(form);
  user.focus();
}

async function render() {
  if (cleanup) { try { cleanup(); } catch (err) { console.warn(err); } cleanup = null; }
  showUser();
  const { path, query } = parseHash();
  if (path === "/login" || !token()) {
    const next = path === "/login" ? query.get("next") : `#${path}${query.toString() ? `?${query}` : ""}`;
    loginPage(app, next);
    return;
  }
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.remove("active");
  const route = ROUTES.find(([re]) => re.test(path));
  if (!route) { errorPage(app, new ApiError(404, `no page ${path}`)); return; }
  const [re, nav, load] = route;
  document.querySelector(`[data-nav="${nav}"]`)?.classList.add("active");
  const params = path.match(re).slice(1).map(decodeURIComponent);
  const root = h("div", { id: "page" });
  app.replaceChildren(root);
  const renderedFor = location.hash;
  try {
    const page = await load();
    const result = await page.render(root, params, query);
    if (location.hash !== renderedFor) { if (result) result(); return; }
    cleanup = result || null;
  } catch (err) {
    errorPage(root, err);
  }
}

window.addEventListener("hashchange", render);
window.addEventListener("cairn:logged-out", () => {
  const { path } = parseHash();
  if (path !== "/login") location.hash = `#/login?next=${encodeURIComponent(location.hash)}`;
});
render();
