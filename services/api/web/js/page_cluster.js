// Cluster: agents and slots (who holds each), resource pools, the queue, slot use.
import { currentUser, followEvents, get, post } from "./api.js";
import { LineChart } from "./charts.js";
import { h, fmtTime, trialHref, experimentHref, enc } from "./dom.js";

export async function render(root) {
  const user = currentUser() || {};
  const agentsEl = h("div", { class: "table-wrap", id: "agents-table" });
  const poolsEl = h("div", { class: "table-wrap", id: "pools-table" });
  const queueEl = h("div", { class: "table-wrap", id: "queue-table" });
  const usageEl = h("div", { id: "utilisation" });
  const msg = h("p", { class: "error", role: "alert" });
  root.replaceChildren(h("h1", {}, "Cluster"), msg,
    h("div", { class: "card" }, h("h2", {}, "Agents and slots"), agentsEl),
    h("div", { class: "row" }, h("div", { class: "card grow" }, h("h2", {}, "Resource pools"), poolsEl),
      h("div", { class: "card grow" }, h("h2", {}, "Queue"), queueEl)),
    h("div", { class: "card" }, h("h2", {}, "Slots in use, last hour"), usageEl));
  const usage = new LineChart(usageEl, { height: 200, xLabel: "minutes ago" });

  async function load() {
    const [agents, holders, queue, util] = await Promise.all([get("/agents"), get("/cluster/allocations"), get("/cluster/queue"), get("/cluster/utilisation?minutes=60")]);
    const byAlloc = new Map(holders.allocations.map((a) => [a.allocation_id, a]));
    const holder = (allocation) => {
      if (!allocation) return "idle";
      const a = byAlloc.get(allocation);
      if (!a) return allocation;
      return a.trial_id ? h("a", { href: trialHref(a.trial_id) }, `trial ${a.trial_id}`) : `${a.owner}'s trial`;
    };
    const list = agents.agents || [];
    agentsEl.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ["Agent", "Pool", "Host", "State", "Heartbeat", "Slot", "Device", "Enabled", "Held by", ""].map((c) => h("th", {}, c)))),
      h("tbody", {}, list.flatMap((ag) => (ag.slots.length ? ag.slots : [null]).map((s, i) => h("tr", { dataset: { agent: ag.agent_id } },
        h("td", {}, i === 0 ? ag.agent_id : ""), h("td", {}, i === 0 ? ag.resource_pool || "default" : ""), h("td", {}, i === 0 ? ag.hostname : ""),
        h("td", {}, i === 0 ? ag.state : ""), h("td", {}, i === 0 ? fmtTime(ag.last_heartbeat) : ""),
        h("td", {}, s ? s.slot_id : "–"), h("td", {}, s ? s.device : ""), h("td", {}, s ? (s.enabled ? (s.draining ? "draining" : "yes") : "no") : ""),
        h("td", {}, s ? holder(s.allocation_id) : ""),
        h("td", {}, s && user.admin ? h("button", { class: "small", onclick: () => toggle(ag.agent_id, s) }, s.enabled ? "disable" : "enable") : "")))))),
    list.length ? "" : h("p", { class: "muted" }, "No agents registered."));
    const pools = new Map();
    for (const ag of list) {
      const p = pools.get(ag.resource_pool || "default") || { agents: 0, slots: 0, enabled: 0, busy: 0 };
      p.agents++; p.slots += ag.slots.length; p.enabled += ag.slots.filter((s) => s.enabled).length; p.busy += ag.slots.filter((s) => s.allocation_id).length;
      pools.set(ag.resource_pool || "default", p);
    }
    for (const q of queue.queue) { const p = pools.get(q.resource_pool); if (p) p.queued = (p.queued || 0) + 1; }
    poolsEl.replaceChildren(h("table", {}, h("thead", {}, h("tr", {}, ["Pool", "Agents", "Slots", "Enabled", "Busy", "Queued"].map((c) => h("th", {}, c)))),
      h("tbody", {}, [...pools].map(([name, p]) => h("tr", {}, [name, p.agents, p.slots, p.enabled, p.busy, p.queued || 0].map((v) => h("td", {}, v)))))));
    queueEl.replaceChildren(queue.queue.length ? h("table", {}, h("thead", {}, h("tr", {}, ["#", "Trial", "Experiment", "User", "Priority", "Slots", "Pool", "Waiting since"].map((c) => h("th", {}, c)))),
      h("tbody", {}, queue.queue.map((q) => h("tr", {}, h("td", {}, q.position), h("td", {}, q.trial_id ? h("a", { href: trialHref(q.trial_id) }, q.trial_id) : "–"),
        h("td", {}, q.experiment_id ? h("a", { href: experimentHref(q.experiment_id) }, `${q.experiment_id} ${q.name || ""}`) : "–"),
        h("td", {}, q.owner), h("td", {}, q.priority), h("td", {}, q.slots), h("td", {}, q.resource_pool), h("td", {}, fmtTime(q.requested_at))))))
      : h("p", { class: "muted" }, "Nothing is waiting."));
    const n = util.busy.length;
    usage.setSeries([
      { key: "busy", label: "busy slots", steps: util.busy.map((_, i) => i - n + 1), values: util.busy },
      { key: "total", label: "slots", color: "#9aa5b1", steps: util.busy.map((_, i) => i - n + 1), values: util.busy.map(() => util.total_slots) },
    ]);
  }
  async function toggle(agentId, slot) {
    try { await post(`/agents/${enc(agentId)}/slots/${enc(slot.slot_id)}/${slot.enabled ? "disable" : "enable"}`, {}); await load(); }
    catch (err) { msg.textContent = err.message; }
  }
  await load();
  const safeLoad = () => load().catch((err) => { msg.textContent = err.message; });
  const timer = setInterval(safeLoad, 5000);
  let stream = null;
  if (user.admin) {
    const { position } = await get("/projections/position");
    let t = null;
    stream = followEvents({ after: position, types: ["SlotsAllocated", "SlotsReleased", "AgentRegistered", "TrialRequested", "TrialExited"],
      onEvent: () => { if (!t) t = setTimeout(() => { t = null; safeLoad(); }, 400); } });
  }
  return () => { clearInterval(timer); if (stream) stream.close(); };
}
