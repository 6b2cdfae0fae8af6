"""The cluster's gauges, read from the database at each scrape of the gateway's ``/metrics``.

They are views of what the tracker projected and the gateway recorded, so they stay true while
any other service is down (a dead scheduler's queue keeps growing here, a killed agent's
heartbeat age keeps rising); a stale projection shows as the tracker's consumer lag. A read that
fails sets ``cairn_cluster_gauges_up`` to 0 and leaves the last values in place.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Gauge

from events.log.errors import EventsError
from events.log.store import EventStore
from services.api import read as api_read
from services.observability.process import LagGauges
from services.tracker import read as tracker_read

READ_TIMEOUT = 5.0
"""Seconds a scrape's reads may take before the scrape answers with ``up`` 0."""


class ClusterGauges:
    """Queues, slots, allocations, agents, consumer lag and webhook backlog of the cluster."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge(
            "cairn_cluster_gauges_up",
            "1 when the last scrape read the cluster's state from the database",
            registry=registry,
        )
        self.waiting = Gauge(
            "cairn_queue_waiting_trials",
            "Trials waiting for slots",
            ["pool"],
            registry=registry,
        )
        self.oldest_wait = Gauge(
            "cairn_queue_oldest_wait_seconds",
            "How long the longest-waiting trial of a pool has waited for slots",
            ["pool"],
            registry=registry,
        )
        self.slots = Gauge(
            "cairn_slots",
            "Slots by pool and state (used, free, unavailable)",
            ["pool", "state"],
            registry=registry,
        )
        self.allocations = Gauge(
            "cairn_allocations", "Allocations by state", ["state"], registry=registry
        )
        self.agents = Gauge(
            "cairn_agents", "Agents by pool and state (active, lost)", ["pool", "state"],
            registry=registry,
        )  # fmt: skip
        self.heartbeat_age = Gauge(
            "cairn_agent_heartbeat_age_seconds",
            "Seconds since the gateway last took a heartbeat of the agent",
            ["agent"],
            registry=registry,
        )
        self.webhook_pending = Gauge(
            "cairn_webhook_deliveries_pending",
            "Webhook deliveries queued or being retried",
            registry=registry,
        )
        self.webhook_oldest = Gauge(
            "cairn_webhook_oldest_pending_seconds",
            "How long the oldest pending webhook delivery has been queued",
            registry=registry,
        )
        self.webhook_behind = Gauge(
            "cairn_webhook_events_behind",
            "Events from the oldest undelivered one to the log's head (0: all delivered)",
            registry=registry,
        )
        self.lag = LagGauges(registry)

    async def refresh(self, store: EventStore) -> None:
        """Reads the cluster's state and sets every gauge (``up`` 0 if the read failed)."""
        try:
            await asyncio.wait_for(self._read(store), READ_TIMEOUT)
        except (EventsError, TimeoutError):
            self.up.set(0)
            return
        self.up.set(1)

    async def _read(self, store: EventStore) -> None:
        head, checkpoints = await store.consumer_positions()
        async with store.connection() as conn:
            queue = await tracker_read.gauges.queue_by_pool(conn)
            slots = await tracker_read.gauges.slots_by_pool(conn)
            allocations = await tracker_read.gauges.allocations_by_state(conn)
            agents = await tracker_read.gauges.agents(conn)
            backlog = await tracker_read.gauges.webhook_backlog(conn)
            beats = await api_read.heartbeats(conn)
        self.lag.update(head, checkpoints, None)
        _reset(self.waiting, self.oldest_wait, self.slots, self.allocations, self.agents)
        for pool in queue:
            self.waiting.labels(pool=pool["pool"]).set(pool["waiting"])
            self.oldest_wait.labels(pool=pool["pool"]).set(pool["oldest_wait_seconds"])
        for row in slots:
            self.slots.labels(pool=row["pool"], state="used").set(row["used"])
            self.slots.labels(pool=row["pool"], state="free").set(row["free"])
            self.slots.labels(pool=row["pool"], state="unavailable").set(row["unavailable"])
        for count in allocations:
            self.allocations.labels(state=count["state"]).set(count["count"])
        counted: dict[tuple[str, str], int] = {}
        for agent in agents:
            key = (agent["pool"], agent["state"])
            counted[key] = counted.get(key, 0) + 1
        for (name, state), n in counted.items():
            self.agents.labels(pool=name, state=state).set(n)
        self.heartbeat_age.clear()
        if beats is not None:
            known = {agent["agent_id"] for agent in agents}
            for agent_id, beat in beats.agents.items():
                if agent_id in known:
                    self.heartbeat_age.labels(agent=agent_id).set(max(beats.now - beat.at, 0.0))
        self.webhook_pending.set(backlog["pending"])
        self.webhook_oldest.set(backlog["oldest_queued_seconds"] or 0.0)
        oldest = backlog["oldest_position"]
        self.webhook_behind.set(0 if oldest is None else max(head - int(oldest) + 1, 0))


def _reset(*families: Gauge) -> None:
    for family in families:
        family.clear()
