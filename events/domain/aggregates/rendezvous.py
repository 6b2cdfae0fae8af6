"""The rendezvous of a run whose gang spans several agents (a pure fold of the trial stream).

Each agent of the run's ``SlotsAllocated`` placements joins once (``RendezvousJoined``) with an
address and a free port of its machine. The nodes of the run are its agents in sorted id order
(the order the agents use to number ranks), node 0 is the chief and hosts the collective's store
at its address and port. Once every node has joined, each agent learns its node rank, the number
of nodes, the world size and where the chief listens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from events.domain.types import RendezvousJoined
from events.log.envelope import RecordedEvent


@dataclass(frozen=True)
class Member:
    """Where one agent of the gang can be reached."""

    agent_id: str
    address: str
    port: int


@dataclass
class Rendezvous:
    """The joins of one allocation, in the order they were recorded."""

    allocation_id: str
    placements: dict[str, list[str]]
    members: dict[str, Member] = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        """The run's agents in node-rank order (sorted ids; node 0 is the chief)."""
        return sorted(self.placements)

    @property
    def complete(self) -> bool:
        """True once every agent of the placements has joined."""
        return all(a in self.members for a in self.placements)

    @property
    def missing(self) -> list[str]:
        """The agents that have not joined yet."""
        return [a for a in self.nodes if a not in self.members]

    def answer(self, agent_id: str | None) -> dict[str, Any]:
        """What ``GET /allocations/{id}/rendezvous`` answers to ``agent_id``.

        The chief's address and port, the node rank and first global rank of ``agent_id`` (when
        it is one of the nodes), the number of nodes and the world size; the chief's endpoint only
        once the rendezvous is complete.
        """
        nodes = self.nodes
        out: dict[str, Any] = {
            "allocation_id": self.allocation_id,
            "complete": self.complete,
            "nodes": nodes,
            "joined": [a for a in nodes if a in self.members],
            "num_nodes": len(nodes),
            "world_size": sum(len(self.placements[a]) for a in nodes),
            "chief_address": None,
            "chief_port": None,
            "node_rank": None,
            "rank_offset": None,
            "local_size": None,
        }
        if self.complete and nodes:
            chief = self.members[nodes[0]]
            out["chief_address"], out["chief_port"] = chief.address, chief.port
        if agent_id is not None and agent_id in self.placements:
            rank = nodes.index(agent_id)
            out["node_rank"] = rank
            out["rank_offset"] = sum(len(self.placements[a]) for a in nodes[:rank])
            out["local_size"] = len(self.placements[agent_id])
        return out


def fold_rendezvous(
    allocation_id: str, placements: Mapping[str, list[str]], events: Iterable[RecordedEvent]
) -> Rendezvous:
    """The rendezvous of ``allocation_id`` from the trial's ``RendezvousJoined`` events (the
    first join of an agent counts; a repeated one changes nothing)."""
    view = Rendezvous(allocation_id, {a: list(s) for a, s in placements.items()})
    for recorded in events:
        if recorded.type != "RendezvousJoined":
            continue
        event = recorded.decode()
        if not isinstance(event, RendezvousJoined) or event.allocation_id != allocation_id:
            continue
        if event.agent_id in view.placements and event.agent_id not in view.members:
            view.members[event.agent_id] = Member(event.agent_id, event.address, event.port)
    return view
