// "Open TensorBoard": starts a TensorBoard over experiments or trials through the API (or reuses
// a live one of the user's over exactly the same ones), waits until it serves, and opens it.
//
// The tab is opened in the click itself (a window opened after the wait would be taken for a
// popup and blocked), shows that TensorBoard is starting, and is sent to the task's proxy path
// once it serves; the browser's session cookie (path /proxy/) lets it in, so no token is ever
// in a URL. Where the browser refused the tab, the status line offers the link instead.
import { currentUser, get, post } from "./api.js";
import { h, enc } from "./dom.js";

const POLL_MS = 1000;
const WAIT_MS = 10 * 60 * 1000;

const sameIds = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);

/** Whether a task shows exactly the experiments (every trial) and trials asked for. */
function shows(task, experimentIds, trialIds) {
  const sources = task.tensorboard_sources || [];
  const whole = sources.filter((s) => s.trial_ids === null).map((s) => s.experiment_id).sort((a, b) => a - b);
  const trials = sources.flatMap((s) => s.trial_ids || []).sort((a, b) => a - b);
  return sameIds(whole, experimentIds) && sameIds(trials, trialIds);
}

async function startOrReuse(experimentIds, trialIds) {
  const { tasks } = await get("/tasks");
  const me = (currentUser() || {}).username;
  const live = tasks.filter((t) => t.kind === "tensorboard" && t.owner === me && t.state !== "TERMINATED" && !t.kill_requested);
  const reused = live.reverse().find((t) => shows(t, experimentIds, trialIds));
  return reused || post("/tensorboards", { experiment_ids: experimentIds, trial_ids: trialIds });
}

async function untilReady(taskId) {
  const deadline = Date.now() + WAIT_MS;
  for (;;) {
    const task = await get(`/tasks/${enc(taskId)}`);
    if (task.ready) return task;
    if (task.state === "TERMINATED") throw new Error(`TensorBoard ${taskId} ended before serving (${task.outcome}: ${task.message})`);
    if (Date.now() > deadline) throw new Error(`TensorBoard ${taskId} is still ${task.state.toLowerCase()}`);
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}

/**
 * The "Open TensorBoard" button and its status line.
 * @param {() => {experiments: number[], trials: number[]}} what the ids to show, read at each click
 */
export function tensorboardButton(what) {
  const status = h("span", { class: "muted tensorboard-status", id: "tensorboard-status", role: "status" });
  const button = h("button", { class: "small", id: "open-tensorboard", onclick: async () => {
    const { experiments = [], trials = [] } = what();
    const experimentIds = [...new Set(experiments.map(Number))].sort((a, b) => a - b);
    const trialIds = [...new Set(trials.map(Number))].sort((a, b) => a - b);
    const tab = window.open("", "_blank");
    if (tab) {
      tab.opener = null;
      tab.document.title = "Starting TensorBoard";
      tab.document.body.textContent = "Starting TensorBoard…";
    }
    button.disabled = true;
    status.className = "muted tensorboard-status";
    status.replaceChildren("starting TensorBoard…");
    try {
      const task = await untilReady((await startOrReuse(experimentIds, trialIds)).id);
      const href = task.proxy_path;
      status.replaceChildren(h("a", { id: "tensorboard-link", href, target: "_blank", rel: "noopener", dataset: { task: task.id } },
        `TensorBoard ${task.id}`), " serving");
      if (tab) tab.location.replace(href);
    } catch (err) {
      if (tab) tab.close();
      status.className = "error tensorboard-status";
      status.replaceChildren(`TensorBoard: ${err.message}`);
    } finally { button.disabled = false; }
  } }, "Open TensorBoard");
  return h("span", { class: "tensorboard" }, button, " ", status);
}
