// Small DOM helpers: element builder, formatting, sortable paged tables, tabs.

/** Builds an element: h("a", {href: "#/x", onclick}, "text", child...). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export const enc = encodeURIComponent;
export const trialHref = (id) => `#/trials/${enc(id)}`;
export const experimentHref = (id) => `#/experiments/${enc(id)}`;

export function fmtNum(v, digits = 4) {
  if (v === null || v === undefined || v === "") return "";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(3) : v.toPrecision(digits).replace(/\.?0+$/, "");
}

export function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function fmtDuration(fromIso, toIso) {
  if (!fromIso) return "";
  const s = Math.max(0, Math.round(((toIso ? new Date(toIso) : new Date()) - new Date(fromIso)) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export const stateBadge = (s) => h("span", { class: `state state-${s}` }, s);

/**
 * A sortable table, paged in the browser.
 * columns: [{key, label, value(row) -> sortable, render(row) -> node|string, sort: bool}]
 */
export class Table {
  constructor({ columns, rowKey, pageSize = 50, onRowClick, rowClass, id }) {
    Object.assign(this, { columns, rowKey, pageSize, onRowClick, rowClass });
    this.rows = [];
    this.sortKey = null;
    this.desc = false;
    this.page = 0;
    this.el = h("div", { class: "table-wrap", id });
  }
  setRows(rows) { this.rows = rows; this.render(); }
  setColumns(columns) { this.columns = columns; this.render(); }
  sorted() {
    if (!this.sortKey) return this.rows;
    const col = this.columns.find((c) => c.key === this.sortKey);
    const val = col.value || ((r) => r[col.key]);
    const sign = this.desc ? -1 : 1;
    return [...this.rows].sort((a, b) => {
      const x = val(a), y = val(b);
      if (x === y) return 0;
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : 1) * sign;
    });
  }
  render() {
    const rows = this.sorted();
    const pages = Math.max(1, Math.ceil(rows.length / this.pageSize));
    this.page = Math.min(this.page, pages - 1);
    const shown = rows.slice(this.page * this.pageSize, (this.page + 1) * this.pageSize);
    const head = h("tr", {}, this.columns.map((c) => {
      const cls = ["sortable", this.sortKey === c.key ? (this.desc ? "sorted-desc" : "sorted-asc") : ""].join(" ");
      return h("th", {
        class: c.sort === false ? "" : cls,
        onclick: c.sort === false ? null : () => {
          if (this.sortKey === c.key) this.desc = !this.desc; else { this.sortKey = c.key; this.desc = false; }
          this.render();
        },
      }, c.label);
    }));
    const body = shown.map((r) => h("tr", {
      class: this.rowClass ? this.rowClass(r) : "",
      dataset: { key: this.rowKey ? this.rowKey(r) : "" },
      onclick: this.onRowClick ? (e) => this.onRowClick(r, e) : null,
    }, this.columns.map((c) => h("td", {}, c.render ? c.render(r) : fmtNum(r[c.key])))));
    const pager = rows.length > this.pageSize ? h("div", { class: "pager" },
      h("button", { class: "small", disabled: this.page === 0, onclick: () => { this.page--; this.render(); } }, "‹ prev"),
      h("span", {}, `page ${this.page + 1} of ${pages} (${rows.length} rows)`),
      h("button", { class: "small", disabled: this.page >= pages - 1, onclick: () => { this.page++; this.render(); } }, "next ›"),
    ) : null;
    this.el.replaceChildren(h("table", {}, h("thead", {}, head), h("tbody", {}, body)), pager || "");
  }
}

/** Tabs: [{id, label, render(container)}]; renders lazily on first show. */
export function tabs(items, initial) {
  const bar = h("div", { class: "tabs", role: "tablist" });
  const body = h("div", {});
  const panes = new Map();
  function show(id) {
    for (const b of bar.children) b.classList.toggle("active", b.dataset.tab === id);
    for (const [key, pane] of panes) pane.hidden = key !== id;
    if (!panes.has(id)) {
      const pane = h("div", { "data-pane": id });
      panes.set(id, pane);
      body.append(pane);
      items.find((t) => t.id === id).render(pane);
    }
  }
  for (const t of items) bar.append(h("button", { dataset: { tab: t.id }, role: "tab", onclick: () => show(t.id) }, t.label));
  show(initial || items[0].id);
  return h("div", {}, bar, body);
}

/** A simple YAML rendering of JSON data (configs are plain mappings, lists and scalars). */
export function toYaml(value, indent = "") {
  const scalar = (v) => {
    if (v === null || v === undefined) return "null";
    if (typeof v === "string") return /^[\w./:@+-]+$/.test(v) && !/^(true|false|null|yes|no|[\d.eE+-]+)$/i.test(v) ? v : JSON.stringify(v);
    return String(v);
  };
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return value.map((v) => (v !== null && typeof v === "object"
      ? `${indent}- ${toYaml(v, indent + "  ").trimStart()}`
      : `${indent}- ${scalar(v)}`)).join("\n");
  }
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value);
    if (!keys.length) return "{}";
    return keys.map((k) => {
      const v = value[k];
      if (v !== null && typeof v === "object" && (Array.isArray(v) ? v.length : Object.keys(v).length)) {
        return `${indent}${k}:\n${toYaml(v, indent + "  ")}`;
      }
      return `${indent}${k}: ${v !== null && typeof v === "object" ? toYaml(v) : scalar(v)}`;
    }).join("\n");
  }
  return scalar(value);
}

/** Calls fn at most once per animation frame (for bursts of live events). */
export function perFrame(fn) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => { queued = false; fn(); });
  };
}

/**
 * Runs a page action: clears `msg`, awaits `fn`, and on failure shows the API's message there
 * (a 403 names the missing permission, a 409 the conflict). Returns fn's result, or undefined.
 */
export async function attempt(msg, fn) {
  msg.textContent = "";
  try { return await fn(); } catch (err) { msg.textContent = err.message || String(err); return undefined; }
}

/** A button that asks once more before it acts: the first click turns it into "confirm …". */
export function confirmButton(label, attrs, onConfirm) {
  const button = h("button", { class: "small", ...attrs }, label);
  let armed = false;
  button.addEventListener("click", () => {
    if (!armed) { armed = true; button.textContent = `confirm ${label}`; button.classList.add("danger"); return; }
    armed = false; button.textContent = label; button.classList.remove("danger");
    onConfirm();
  });
  return button;
}
