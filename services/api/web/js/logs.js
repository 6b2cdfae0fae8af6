// A log viewer: follows new lines live, filters by rank, level and text, downloads.
import { get, saveBlob } from "./api.js";
import { h } from "./dom.js";

const LEVEL = /\b(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)\b/;
const ORDER = { DEBUG: 0, INFO: 1, WARNING: 2, ERROR: 3, CRITICAL: 4 };
const MAX_KEPT = 20000;

export function levelOf(entry) {
  const m = LEVEL.exec(entry.line);
  if (m) return m[1] === "WARN" ? "WARNING" : m[1] === "FATAL" ? "CRITICAL" : m[1];
  return entry.stream === "stderr" ? "WARNING" : "INFO";
}

/**
 * Mounts a log viewer in `container`.
 * @param {string} path API path of the logs (trial or experiment), answering {logs, next_after_id}.
 * @param {string} filename name of the downloaded file.
 * @returns {() => void} stops following.
 */
export function logViewer(container, path, filename) {
  let entries = [], after = 0, timer = null, stopped = false;
  const rankSel = h("select", { class: "log-rank", "aria-label": "rank", onchange: draw }, h("option", { value: "" }, "all ranks"));
  const levelSel = h("select", { class: "log-level", "aria-label": "level", onchange: draw },
    h("option", { value: "" }, "any level"), Object.keys(ORDER).map((l) => h("option", { value: l }, `≥ ${l}`)));
  const text = h("input", { class: "log-text", placeholder: "filter text", "aria-label": "text filter", oninput: draw });
  const follow = h("input", { type: "checkbox", class: "log-follow", checked: true });
  const count = h("span", { class: "muted log-count" });
  const box = h("div", { class: "logs", role: "log" });
  const ranks = new Set();
  container.replaceChildren(
    h("div", { class: "filters" }, rankSel, levelSel, text,
      h("label", {}, follow, " follow"),
      h("button", { class: "small log-download", onclick: () => {
        const body = entries.map((e) => `${e.ts} ${e.trial_id ? `[${e.trial_id}] ` : ""}${e.rank != null ? `[rank=${e.rank}] ` : ""}${e.line}`).join("\n") + "\n";
        saveBlob(new Blob([body], { type: "text/plain" }), filename);
      } }, "download"), count),
    box);

  function visible() {
    const rank = rankSel.value, minLevel = levelSel.value, needle = text.value.toLowerCase();
    return entries.filter((e) =>
      (rank === "" || String(e.rank) === rank) &&
      (minLevel === "" || ORDER[e.level] >= ORDER[minLevel]) &&
      (!needle || e.line.toLowerCase().includes(needle)));
  }

  function draw() {
    const shown = visible();
    const tail = shown.slice(-3000);
    box.replaceChildren(...tail.map((e) => h("div", { class: e.level },
      h("span", { class: "meta" }, `${e.ts.slice(11, 19)} ${e.trial_id ? `${e.trial_id} ` : ""}${e.rank != null ? `r${e.rank} ` : ""}`), e.line)));
    count.textContent = `${shown.length} of ${entries.length} lines`;
    if (follow.checked) box.scrollTop = box.scrollHeight;
  }

  async function poll() {
    if (stopped) return;
    try {
      const data = await get(`${path}${path.includes("?") ? "&" : "?"}after_id=${after}&limit=5000`);
      if (data.logs.length) {
        for (const e of data.logs) {
          e.level = levelOf(e);
          entries.push(e);
          if (e.rank != null && !ranks.has(e.rank)) {
            ranks.add(e.rank);
            rankSel.append(h("option", { value: String(e.rank) }, `rank ${e.rank}`));
          }
        }
        if (entries.length > MAX_KEPT) entries = entries.slice(-MAX_KEPT);
        after = data.next_after_id;
        draw();
      } else if (!entries.length) draw();
    } catch (err) {
      count.textContent = `logs: ${err.message}`;
    }
    if (!stopped) timer = setTimeout(poll, follow.checked ? 700 : 3000);
  }
  poll();
  return () => { stopped = true; clearTimeout(timer); };
}
