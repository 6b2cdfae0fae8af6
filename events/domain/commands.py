"""Commands for agents, derived from logged events (the log is their outbox).

A command is a pure function of one recorded event, with a deterministic id, so the relay can
republish it after a crash and NATS deduplicates it; agents execute each id at most once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from events.log.bus import COMMANDS_PREFIX
from events.log.envelope import RecordedEvent


@dataclass(frozen=True)
class Command:
    """One command for one agent."""

    agent_id: str
    command_id: str
    kind: str
    allocation_id: str
    trial_id: int | None
    position: int
    task_id: str | None = None

    @property
    def subject(self) -> str:
        """The NATS subject of the agent's command queue."""
        return agent_subject(self.agent_id)

    def payload(self) -> bytes:
        """The JSON body sent to the agent."""
        body: dict[str, object] = {
            "command_id": self.command_id,
            "kind": self.kind,
            "allocation_id": self.allocation_id,
            "trial_id": self.trial_id,
            "position": self.position,
        }
        if self.task_id is not None:
            body["task_id"] = self.task_id
        return json.dumps(body).encode()


def agent_subject(agent_id: str) -> str:
    """``cairn.cmd.agent.<agent_id>`` with NATS-unsafe characters replaced."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in agent_id)
    return f"{COMMANDS_PREFIX}.agent.{safe}"


_SIGNALS = {"PreemptionRequested": "preempt", "KillRequested": "kill"}
_TASK_COMMANDS = {"TaskAllocated": "start", "TaskKillRequested": "kill"}


def derive(event: RecordedEvent) -> list[Command]:
    """Commands implied by ``event``: a ``start`` per agent of a ``SlotsAllocated`` or
    ``TaskAllocated``, and a ``preempt``/``kill`` per agent named in a
    ``PreemptionRequested``/``KillRequested``/``TaskKillRequested``."""
    payload = event.payload
    task_kind = _TASK_COMMANDS.get(event.type)
    if task_kind is not None:
        alloc = payload.get("allocation_id")
        agents = payload["placements"] if task_kind == "start" else payload.get("agent_ids", [])
        if not alloc:
            return []
        return [
            Command(
                agent,
                f"{task_kind}:{alloc}:{agent}",
                task_kind,
                str(alloc),
                None,
                event.position,
                task_id=str(payload["task_id"]),
            )
            for agent in sorted(agents)
        ]
    if event.type == "SlotsAllocated":
        alloc = str(payload["allocation_id"])
        return [
            Command(
                agent,
                f"start:{alloc}:{agent}",
                "start",
                alloc,
                int(payload["trial_id"]),
                event.position,
            )
            for agent in sorted(payload["placements"])
        ]
    kind = _SIGNALS.get(event.type)
    if kind is not None:
        alloc = str(payload["allocation_id"])
        return [
            Command(
                agent,
                f"{kind}:{alloc}:{agent}",
                kind,
                alloc,
                int(payload["trial_id"]),
                event.position,
            )
            for agent in sorted(payload.get("agent_ids", []))
        ]
    return []
