"""Invariants of a log, checked by reading it from position 0.

``python -m events.domain.check DSN`` prints every finding and exits 1 if there is one. Tests (fault and
end-to-end) call :func:`check_log` after a run. The invariants:

- ``duplicate-event-id``: an event id appears twice.
- ``stream-gap``: a stream's versions are not 1, 2, 3, ... in position order.
- ``undecodable``: an event does not decode (upcast + validate) into its current model.
- ``allocated-twice``: two ``SlotsAllocated`` carry the same allocation id.
- ``started-twice``: two ``TrialStarted`` carry the same allocation id.
- ``slot-held-twice``: a slot is allocated while another live allocation holds it (an allocation
  is live from ``SlotsAllocated`` until its ``TrialExited`` or ``SlotsReleased``; a task's from
  ``TaskAllocated`` until its ``TaskExited``). ``allocated-twice`` and ``started-twice`` cover
  tasks' allocations too.
- ``trial-overlap``: a trial is allocated while an earlier allocation of it is still live.
- ``checkpoint-claimed-twice``: a checkpoint uuid recorded by a second ``CheckpointSaved``.
- ``duplicate-state``: a state change to the state the aggregate is already in.
- ``illegal-transition``: a state change the state machine (:mod:`events.domain.lifecycle`) refuses, or
  an ``ExperimentContinued`` of an experiment that has not ended.
- ``custom-call-settled-twice``: a custom searcher's call answered (or failed) a second time.
- ``custom-call-skipped``: a custom searcher's call settled before the calls below it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import AsyncIterable, Callable, Iterable
from dataclasses import dataclass, field

from events.domain.aggregates import ExperimentView, TrialView, apply_experiment, apply_trial
from events.domain.types import ExperimentStateChanged, TrialStateChanged
from events.log.envelope import RecordedEvent
from events.log.errors import EventsError
from events.log.store import EventStore


@dataclass(frozen=True)
class Finding:
    """One broken invariant: its kind, the position where it shows, and what was seen."""

    kind: str
    position: int
    detail: str

    def __str__(self) -> str:
        return f"{self.kind} at position {self.position}: {self.detail}"


@dataclass
class _Allocation:
    trial_id: str
    slots: list[tuple[str, str]]
    position: int


@dataclass
class LogChecker:
    """Accumulates findings over events fed in position order (see :meth:`feed`)."""

    findings: list[Finding] = field(default_factory=list)
    events: int = 0
    _ids: set[str] = field(default_factory=set)
    _versions: dict[str, int] = field(default_factory=dict)
    _allocated: set[str] = field(default_factory=set)
    _started: set[str] = field(default_factory=set)
    _live: dict[str, _Allocation] = field(default_factory=dict)
    _holder: dict[tuple[str, str], str] = field(default_factory=dict)
    _trial_live: dict[str, str] = field(default_factory=dict)
    _experiments: dict[str, ExperimentView] = field(default_factory=dict)
    _trials: dict[str, TrialView] = field(default_factory=dict)
    """Each stream's aggregate, by the same folds every consumer applies."""
    _checkpoints: dict[str, str] = field(default_factory=dict)
    """Checkpoint uuid -> the trial that recorded it first."""
    _custom_calls: dict[str, int] = field(default_factory=dict)
    """Experiment stream -> calls of its custom searcher settled so far."""

    def _find(self, kind: str, event: RecordedEvent, detail: str) -> None:
        self.findings.append(Finding(kind, event.position, detail))

    def feed(self, event: RecordedEvent) -> None:
        """Checks one event against everything seen before it."""
        self.events += 1
        event_id = str(event.event_id)
        if event_id in self._ids:
            self._find("duplicate-event-id", event, f"event id {event_id} ({event.type})")
        self._ids.add(event_id)
        expected = self._versions.get(event.stream_id, 0) + 1
        if event.stream_version != expected:
            self._find(
                "stream-gap",
                event,
                f"{event.stream_id} has version {event.stream_version} where {expected} was due",
            )
        self._versions[event.stream_id] = max(expected - 1, event.stream_version)
        try:
            payload = event.decode().model_dump(mode="json")
        except (EventsError, ValueError) as exc:
            self._find("undecodable", event, f"{event.type} v{event.schema_version}: {exc}")
            return
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, event, payload)

    def _allocated_event(self, event: RecordedEvent, p: dict[str, object]) -> None:
        allocation_id = str(p["allocation_id"])
        trial_id = str(p["trial_id"]) if "trial_id" in p else f"task {p['task_id']}"
        if allocation_id in self._allocated:
            self._find("allocated-twice", event, f"allocation {allocation_id} of trial {trial_id}")
        self._allocated.add(allocation_id)
        earlier = self._trial_live.get(trial_id)
        if earlier is not None:
            self._find(
                "trial-overlap",
                event,
                f"trial {trial_id} allocated {allocation_id} while {earlier} is live",
            )
        placements = p["placements"]
        assert isinstance(placements, dict)
        slots = [(str(agent), str(slot)) for agent, ids in placements.items() for slot in ids]
        for slot in slots:
            holder = self._holder.get(slot)
            if holder is not None:
                self._find(
                    "slot-held-twice",
                    event,
                    f"slot {slot[1]} of agent {slot[0]} given to {allocation_id} "
                    f"while {holder} holds it",
                )
        for slot in slots:
            self._holder[slot] = allocation_id
        self._live[allocation_id] = _Allocation(trial_id, slots, event.position)
        self._trial_live[trial_id] = allocation_id

    def _started_event(self, event: RecordedEvent, p: dict[str, object]) -> None:
        allocation_id = str(p["allocation_id"])
        if allocation_id in self._started:
            self._find("started-twice", event, f"allocation {allocation_id}")
        self._started.add(allocation_id)

    def _ended_event(self, _event: RecordedEvent, p: dict[str, object]) -> None:
        if p.get("allocation_id") is None:
            return  # a task canceled before it was placed
        allocation = self._live.pop(str(p["allocation_id"]), None)
        if allocation is None:
            return
        for slot in allocation.slots:
            if self._holder.get(slot) == p["allocation_id"]:
                del self._holder[slot]
        if self._trial_live.get(allocation.trial_id) == p["allocation_id"]:
            del self._trial_live[allocation.trial_id]

    def _checkpoint_event(self, event: RecordedEvent, p: dict[str, object]) -> None:
        uuid, trial_id = str(p["uuid"]), str(p["trial_id"])
        owner = self._checkpoints.get(uuid)
        if owner is None:
            self._checkpoints[uuid] = trial_id
        else:
            self._find(
                "checkpoint-claimed-twice",
                event,
                f"checkpoint {uuid} of trial {owner} recorded again by trial {trial_id}",
            )

    def _experiment(self, event: RecordedEvent) -> ExperimentView:
        view = self._experiments.get(event.stream_id)
        if view is None:
            view = self._experiments[event.stream_id] = ExperimentView(0)
        return view

    def _submitted_event(self, event: RecordedEvent, _p: dict[str, object]) -> None:
        apply_experiment(self._experiment(event), event)

    def _experiment_state_event(self, event: RecordedEvent, _p: dict[str, object]) -> None:
        change = event.decode_as(ExperimentStateChanged)
        experiment = self._experiment(event)
        self._state_change(
            event,
            "experiment",
            experiment.state,
            change,
            lambda: apply_experiment(experiment, event, change),
        )

    def _trial_state_event(self, event: RecordedEvent, _p: dict[str, object]) -> None:
        change = event.decode_as(TrialStateChanged)
        trial = self._trials.get(event.stream_id)
        if trial is None:
            trial = self._trials[event.stream_id] = TrialView(0)
        self._state_change(
            event, "trial", trial.state, change, lambda: apply_trial(trial, event, change)
        )

    def _state_change(
        self,
        event: RecordedEvent,
        kind: str,
        current: str,
        change: ExperimentStateChanged | TrialStateChanged,
        apply: Callable[[], bool],
    ) -> None:
        """Checks a state change against the aggregate's fold (which applies it, if legal)."""
        if change.state == current:
            if change.reason != "requeue":
                self._find("duplicate-state", event, f"{event.stream_id} already {current}")
            return
        if not apply():
            self._find(
                "illegal-transition",
                event,
                f"{event.stream_id}: {kind} cannot go from {current} to {change.state}",
            )

    def _continued_event(self, event: RecordedEvent, _p: dict[str, object]) -> None:
        experiment = self._experiment(event)
        current = experiment.state
        if not apply_experiment(experiment, event):
            self._find("illegal-transition", event, f"{event.stream_id}: continued while {current}")

    def _custom_call_event(self, event: RecordedEvent, p: dict[str, object]) -> None:
        settled = self._custom_calls.get(event.stream_id, 0)
        call = p["call"]
        assert isinstance(call, int)
        if call <= settled:
            self._find(
                "custom-call-settled-twice",
                event,
                f"{event.stream_id}: call {call} settled again ({event.type})",
            )
            return
        if call > settled + 1:
            self._find(
                "custom-call-skipped",
                event,
                f"{event.stream_id}: call {call} settled after only {settled} calls",
            )
        self._custom_calls[event.stream_id] = call

    def summary(self) -> str:
        """One line per kind of finding, or a line saying the log is clean."""
        if not self.findings:
            return f"{self.events} events checked: 0 findings"
        counts = Counter(f.kind for f in self.findings)
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
        return f"{self.events} events checked: {len(self.findings)} findings ({kinds})"


_HANDLERS = {
    "SlotsAllocated": LogChecker._allocated_event,
    "TrialStarted": LogChecker._started_event,
    "CheckpointSaved": LogChecker._checkpoint_event,
    "TrialExited": LogChecker._ended_event,
    "SlotsReleased": LogChecker._ended_event,
    "TaskAllocated": LogChecker._allocated_event,
    "TaskStarted": LogChecker._started_event,
    "TaskExited": LogChecker._ended_event,
    "ExperimentSubmitted": LogChecker._submitted_event,
    "ExperimentStateChanged": LogChecker._experiment_state_event,
    "TrialStateChanged": LogChecker._trial_state_event,
    "ExperimentContinued": LogChecker._continued_event,
    "CustomSearcherAnswered": LogChecker._custom_call_event,
    "CustomSearcherFailed": LogChecker._custom_call_event,
}


def check_events(events: Iterable[RecordedEvent]) -> list[Finding]:
    """Every broken invariant in ``events`` (a whole log, in position order)."""
    checker = LogChecker()
    for event in events:
        checker.feed(event)
    return checker.findings


async def check_stream(events: AsyncIterable[RecordedEvent]) -> LogChecker:
    """Feeds an asynchronous sequence of events to a new checker and returns it."""
    checker = LogChecker()
    async for event in events:
        checker.feed(event)
    return checker


async def check_log(store: EventStore) -> list[Finding]:
    """Every broken invariant in the whole log of ``store``."""
    return (await check_stream(store.iter_all(0))).findings


async def _main(dsn: str, limit: int) -> int:
    store = await EventStore.connect(dsn, max_size=2)
    try:
        checker = await check_stream(store.iter_all(0))
    finally:
        await store.close()
    for finding in checker.findings[:limit]:
        print(finding)
    if len(checker.findings) > limit:
        print(f"... and {len(checker.findings) - limit} more")
    print(checker.summary())
    return 1 if checker.findings else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m events.domain.check DSN``: prints the findings; exit status 1 if there are any."""
    parser = argparse.ArgumentParser(
        prog="python -m events.domain.check",
        description="Check the invariants of a cairn event log.",
    )
    parser.add_argument("dsn", help="PostgreSQL DSN of the cluster's database")
    parser.add_argument("--limit", type=int, default=100, help="findings to print at most")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_main(args.dsn, args.limit))
    except EventsError as exc:
        print(f"cannot read the log: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
