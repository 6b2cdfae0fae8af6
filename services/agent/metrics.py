"""An agent's own metrics and readiness, served on its ``--metrics-address``.

The cluster's view of an agent (its heartbeat age as the gateway sees it, lost or active) is on
the gateway's ``/metrics``; this is the agent's side: how long since the gateway last took its
heartbeat, whether it is registered and connected to the bus, and what it runs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from services.observability import health

if TYPE_CHECKING:
    from services.agent.agent import Agent

MISSED_BEATS = 3
"""Heartbeat intervals without an acknowledged heartbeat after which the agent is not ready."""


class AgentMetrics:
    """The gauges of one agent process, set from the agent at each scrape."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.started = time.monotonic()
        self.registry = CollectorRegistry()
        self.heartbeat_age = Gauge(
            "cairn_agent_heartbeat_ack_age_seconds",
            "Seconds since the gateway last took this agent's heartbeat (since start if never)",
            registry=self.registry,
        )
        self.registered = Gauge(
            "cairn_agent_registered", "1 once the agent has registered", registry=self.registry
        )
        self.slots = Gauge("cairn_agent_slots", "Slots this agent offers", registry=self.registry)
        self.runs = Gauge(
            "cairn_agent_runs", "Runs this agent is starting or running", registry=self.registry
        )
        self.ready = Gauge(
            "cairn_ready", "1 while the process's readiness checks pass", registry=self.registry
        )

    def age(self) -> float:
        """Seconds since the last acknowledged heartbeat (or since this object was made)."""
        last = self.agent.last_heartbeat
        return time.monotonic() - (self.started if last is None else last)

    async def checks(self) -> dict[str, str]:
        """Registered, connected to the bus, and heard by the gateway within
        :data:`MISSED_BEATS` heartbeat intervals."""
        limit = MISSED_BEATS * self.agent.config.heartbeat
        checks = {
            "registered": health.OK if self.agent.registered else "not registered yet",
            "bus": health.OK if self.agent.bus_connected else "NATS is disconnected",
            "heartbeat": health.OK
            if self.agent.last_heartbeat is not None and self.age() <= limit
            else f"no heartbeat taken by the gateway in the last {limit:g} s",
        }
        self.ready.set(all(result == health.OK for result in checks.values()))
        return checks

    async def exposition(self) -> bytes:
        """Sets the gauges from the agent and returns the text format."""
        await self.checks()
        self.heartbeat_age.set(self.age())
        self.registered.set(1 if self.agent.registered else 0)
        self.slots.set(len(self.agent.slots))
        self.runs.set(len(self.agent.running()))
        return generate_latest(self.registry)
