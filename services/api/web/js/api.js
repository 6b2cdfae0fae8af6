// The REST API and the live event stream, with the logged-in user's bearer token.

const TOKEN_KEY = "cairn.token";
const USER_KEY = "cairn.user";

/** An API error: the HTTP status and the server's message. */
export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function token() { return localStorage.getItem(TOKEN_KEY); }
export function currentUser() {
  try { return JSON.parse(localStorage.getItem(USER_KEY) || "null"); } catch { return null; }
}

function authHeaders() {
  const t = token();
  return t ? { Authorization: `Bearer ${t}` } : {};
}

/** Calls `/api/v1${path}` and returns its JSON; throws ApiError on an error status. */
export async function api(method, path, body) {
  const init = { method, headers: { ...authHeaders() } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(`/api/v1${path}`, init);
  let data = null;
  try { data = await resp.json(); } catch { data = null; }
  if (!resp.ok) {
    const message = (data && data.error && data.error.message) || resp.statusText;
    if (resp.status === 401 && path !== "/auth/login") {
      localStorage.removeItem(TOKEN_KEY);
      window.dispatchEvent(new CustomEvent("cairn:logged-out"));
    }
    throw new ApiError(resp.status, message);
  }
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body = {}) => api("POST", path, body);
export const patch = (path, body = {}) => api("PATCH", path, body);
export const del = (path) => api("DELETE", path);

/** Fetches a binary download with the token and hands it to the browser as a file. */
export async function download(path, filename) {
  const resp = await fetch(`/api/v1${path}`, { headers: authHeaders() });
  if (!resp.ok) throw new ApiError(resp.status, `download failed (${resp.status})`);
  saveBlob(await resp.blob(), filename);
}

export function saveBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url; a.download = filename;
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export async function login(username, password) {
  const data = await api("POST", "/auth/login", { username, password });
  localStorage.setItem(TOKEN_KEY, data.token);
  localStorage.setItem(USER_KEY, JSON.stringify(data.user));
  return data.user;
}

export async function logout() {
  try { await post("/auth/logout"); } catch { /* the token may already be gone */ }
  localStorage.removeItem(TOKEN_KEY);
  localStorage.removeItem(USER_KEY);
}

/**
 * Follows `/api/v1/events/stream` (Server-Sent Events read through fetch, which can send the
 * bearer token), reconnecting after a dropped connection with `Last-Event-ID` set to the last
 * position seen, so nothing is missed or repeated.
 *
 * @param {object} opts { experimentId, types: string[], after: number, onEvent(evt),
 *   onStatus(connected: boolean) }
 * @returns {{close(): void, position(): number}}
 */
export function followEvents({ experimentId, types, after = 0, onEvent, onStatus = () => {} }) {
  let last = after;
  let closed = false;
  let controller = null;
  let delay = 250;
  const params = new URLSearchParams();
  if (experimentId !== undefined && experimentId !== null) params.set("experiment_id", experimentId);
  if (types && types.length) params.set("types", types.join(","));

  async function connect() {
    while (!closed) {
      controller = new AbortController();
      try {
        const headers = { ...authHeaders(), Accept: "text/event-stream" };
        if (last > 0) headers["Last-Event-ID"] = String(last);
        const resp = await fetch(`/api/v1/events/stream?${params}`, { headers, signal: controller.signal });
        if (!resp.ok) throw new ApiError(resp.status, `event stream: ${resp.status}`);
        onStatus(true);
        delay = 250;
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            dispatch(block);
          }
        }
      } catch (err) {
        if (closed) return;
        if (err instanceof ApiError && (err.status === 401 || err.status === 403 || err.status === 404)) {
          onStatus(false);
          return;
        }
      }
      if (closed) return;
      onStatus(false);
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  }

  function dispatch(block) {
    let id = null, data = "";
    for (const line of block.split("\n")) {
      if (line.startsWith("id: ")) id = Number(line.slice(4));
      else if (line.startsWith("data: ")) data += line.slice(6);
    }
    if (id === null || !data || id <= last) return;
    last = id;
    try { onEvent(JSON.parse(data)); } catch (err) { console.warn("event handler failed", err); }
  }

  connect();
  return {
    close() { closed = true; if (controller) controller.abort(); },
    position() { return last; },
  };
}
