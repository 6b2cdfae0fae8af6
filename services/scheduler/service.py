"""The scheduler service: folds the cluster from the log, plans, and appends its decisions.

It runs leader-only. Its decisions are appended in the same transaction that moves its
checkpoint, fenced by its lease epoch, so a crash never leaves a decision without its
checkpoint (or the reverse) and a deposed leader cannot write. It plans only on a state folded
up to the head of the log (which holds its own earlier decisions), and appends each stream's
decisions with the version that state saw: a plan overtaken by another writer loses with
``ConcurrencyError`` and the runner re-plans (see :mod:`events.log.consumer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from events.domain.types import TaskExited, TrialExited
from events.log.consumer import Consumer
from events.log.envelope import Event, RecordedEvent
from events.log.store import EventStore, Transaction
from services.api import read as api_read
from services.scheduler.planner import Report, Reports, Settings, plan, reap
from services.scheduler.state import STREAMS, TYPES, ClusterState

log = structlog.get_logger("scheduler")


class SchedulerConsumer(Consumer):
    """Applies cluster events to :class:`ClusterState` and appends the planner's decisions."""

    name = "scheduler"
    types = TYPES
    envelopes = STREAMS
    tick_always = True

    def __init__(self, store: EventStore, settings: Settings, agent_timeout: float = 15.0) -> None:
        self.store = store
        self.settings = settings
        self.agent_timeout = agent_timeout
        self.state = ClusterState()
        self.folded = 0
        self.decided = 0
        self.races = 0

    async def rebuild(self) -> None:
        """Refolds the state from the start of the log up to this consumer's checkpoint."""
        self.state = ClusterState()
        self.folded = 0
        await self.advance()

    async def advance(self) -> None:
        """Folds the log from where the state is up to the checkpoint (a standby follows the
        leader's checkpoint this way, so a takeover folds only the tail)."""
        checkpoint = await self.store.checkpoint(self.name)
        async for event in self.store.iter_all(self.folded, types=TYPES, envelopes=STREAMS):
            if event.position > checkpoint:
                break
            self.state.apply(event)
            self.folded = event.position
        self.folded = max(self.folded, checkpoint)

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        self.state.apply(event)

    async def on_rollback(self) -> None:
        await self.rebuild()

    async def on_lost_race(self) -> None:
        """Keeps the state: it holds only events of the log, and :meth:`ClusterState.apply`
        skips those it has folded when the page is read again (no refold from position 0)."""
        self.races += 1

    async def before_commit(self, tx: Transaction) -> None:
        beats = await _heartbeats(tx, self.state.position)
        decisions = plan(self.state, self.settings, beats.reports if beats else None)
        if beats is not None:
            decisions += reap(self.state, beats.last_beat, beats.now, self.agent_timeout)
        by_stream: dict[str, list[Event]] = {}
        for stream_id, event in decisions:
            by_stream.setdefault(stream_id, []).append(event)
        for stream_id, events in by_stream.items():
            expected = self.state.version(stream_id)
            await tx.append(stream_id, events, expected_version=expected)
        if decisions:
            self.decided += len(decisions)
            log.info(
                "decided",
                count=len(decisions),
                types=sorted({type(e).__name__ for _, e in decisions}),
            )


@dataclass(frozen=True)
class Heartbeats:
    """The database's clock, each agent's latest heartbeat time, and what the agents report."""

    now: float
    last_beat: dict[str, float]
    reports: Reports


async def _heartbeats(tx: Transaction, folded: int) -> Heartbeats | None:
    """The agents' heartbeats as of now (None before the API made their table).

    The gateway owns the heartbeats (telemetry, not facts of the log); they are read through
    its read API in this transaction. ``folded`` is the position of the last event folded into
    the state. The exits beyond it are read after the heartbeats, so any exit an agent reported
    before the heartbeat read here is among them (an agent drops a run from its heartbeats only
    once its exit is committed).
    """
    beats = await api_read.heartbeats(tx.conn)
    if beats is None:
        return None
    exits = await tx.read_types(["TrialExited", "TaskExited"], after=folded)
    agents = {
        agent_id: Report(
            incarnation=beat.incarnation, seq=beat.seq, running=beat.running, at=beat.at
        )
        for agent_id, beat in beats.agents.items()
    }
    return Heartbeats(
        now=beats.now,
        last_beat={agent_id: beat.at for agent_id, beat in beats.agents.items()},
        reports=Reports(
            agents=agents,
            exits_unfolded=frozenset(a for e in exits if (a := _exit_allocation(e)) is not None),
        ),
    )


def _exit_allocation(recorded: RecordedEvent) -> str | None:
    """The allocation a ``TrialExited`` or ``TaskExited`` ends (``None``: a task that ended
    before it was placed)."""
    if recorded.type == "TaskExited":
        return recorded.decode_as(TaskExited).allocation_id
    return recorded.decode_as(TrialExited).allocation_id
