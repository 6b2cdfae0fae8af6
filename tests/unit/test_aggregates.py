"""The typed folds of :mod:`events.domain.aggregates` over every stored shape of every event type."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from events.domain import aggregates, lifecycle
from events.domain.names import trial_stream
from events.log.envelope import RecordedEvent
from events.log.store import row_to_event
from services.scheduler.state import ClusterState
from tests.golden import history
from tests.unit.test_registry import all_versions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"
MOMENT = datetime(2026, 1, 1, tzinfo=UTC)


def stored(event_type: str, version: int, payload: dict[str, Any], position: int) -> RecordedEvent:
    """A stored row of ``payload`` read back as the store reads it (upcast at the boundary)."""
    experiment_id = payload.get("experiment_id", 7)
    stream = (
        f"agent-{payload['agent_id']}"
        if "agent_id" in payload
        and event_type.startswith(("Agent", "Slots"))
        and "trial_id" not in payload
        else f"experiment-{experiment_id}"
        if event_type.startswith(("Experiment", "Checkpoints", "TrialRequested"))
        else f"trial-{payload.get('trial_id', 1)}"
    )
    return row_to_event(
        {
            "position": position,
            "stream_id": stream,
            "stream_version": position,
            "event_id": uuid.UUID(int=position),
            "type": event_type,
            "schema_version": version,
            "payload": payload,
            "metadata": {},
            "recorded_at": MOMENT,
        }
    )


def every_fixture() -> list[RecordedEvent]:
    """One stored event per (type, schema version) fixture, in a stable order."""
    out = []
    for position, (event_type, version) in enumerate(sorted(all_versions()), 1):
        payload = json.loads((FIXTURES / f"{event_type}.v{version}.json").read_text())
        out.append(stored(event_type, version, payload, position))
    return out


def test_every_fixture_exists_for_the_replay() -> None:
    """The replay below covers every (type, schema version) the registry knows."""
    assert len(every_fixture()) == len(list(all_versions()))


@pytest.mark.parametrize("event", every_fixture(), ids=lambda e: f"{e.type}.v{e.schema_version}")
def test_every_fixture_replays_through_every_fold(event: RecordedEvent) -> None:
    """Each stored shape, upcast at the read boundary, folds through the experiment, trial,
    allocation, trial summary, agent and cluster folds and the scheduler's state without
    error, alone and after an experiment submission."""
    submitted = [e for e in every_fixture() if e.type == "ExperimentSubmitted"][-1]
    for events in ([event], [submitted, event]):
        experiment = aggregates.fold_experiment(7, events)
        assert experiment.state in lifecycle.STATES
        trial = aggregates.fold_trial(1, events)
        assert trial.state in lifecycle.STATES
        aggregates.fold_allocation("1.1", events)
        for trial_id in experiment.trials:
            summary = aggregates.fold_trial_summary(experiment, trial_id, events)
            assert summary["state"] in lifecycle.STATES
        aggregates.fold_agent("gpu01", events)
        aggregates.fold_cluster(events).agent_list()
        cluster = ClusterState()
        for recorded in events:
            cluster.apply(recorded)


@pytest.mark.parametrize("name", history.NAMES)
def test_golden_histories_fold_as_the_lifecycle_and_scheduler_do(name: str) -> None:
    """On each log recorded from a real run, the aggregates give every experiment and trial the
    state the lifecycle fold recorded, the trial summaries the scheduler's restarts, and the
    cluster fold the scheduler's agents (lost or not, slot count)."""
    events = history.decoded(history.load(name))
    recorded = json.loads(history.state_path(name).read_text())
    streams: dict[str, list[RecordedEvent]] = {}
    for e in events:
        streams.setdefault(e.stream_id, []).append(e)
    for ident, life in recorded["lifecycle"]["experiments"].items():
        stream = streams[f"experiment-{ident}"]
        view = aggregates.fold_experiment(int(ident), stream)
        assert view.state == life["state"], (name, ident)
        for trial_id in view.trials:
            trial_events = streams.get(trial_stream(trial_id), [])
            summary = aggregates.fold_trial_summary(view, trial_id, trial_events)
            assert summary["state"] == recorded["lifecycle"]["trials"][str(trial_id)]["state"]
            scheduled = recorded["scheduler"]["trials"][str(trial_id)]
            assert (summary["restarts"], summary["run_id"]) == (
                scheduled["restarts"],
                scheduled["runs"],
            )
            assert aggregates.fold_trial(trial_id, trial_events).state == summary["state"]
    agents = {a["agent_id"]: a for a in aggregates.fold_cluster(events).agent_list()}
    assert {
        agent_id: {"lost": a["state"] == "lost", "slots": len(a["slots"])}
        for agent_id, a in agents.items()
    } == recorded["scheduler"]["agents"]
    assert all(s["allocation_id"] is None for a in agents.values() for s in a["slots"])


def test_replaying_all_fixtures_in_one_log_folds_every_aggregate() -> None:
    """All fixtures as one log: each fold takes every event in turn, and the experiment fold
    sees the submission (its old and new shapes both decode to today's model)."""
    events = every_fixture()
    experiments = {e.payload.get("experiment_id") for e in events if "experiment_id" in e.payload}
    for experiment_id in experiments:
        if isinstance(experiment_id, int):
            aggregates.fold_experiment(experiment_id, events)
    view = aggregates.fold_experiment(7, [e for e in events if e.stream_id == "experiment-7"])
    assert view.exists
    cluster = aggregates.fold_cluster(events)
    assert all(a["state"] in ("active", "lost") for a in cluster.agent_list())


def test_state_changes_apply_like_the_projection() -> None:
    """The experiment and trial folds apply legal state changes as the tracker's projection
    does, with the end time of a terminal state."""
    submitted = json.loads((FIXTURES / "ExperimentSubmitted.v2.json").read_text())
    experiment_id = submitted["experiment_id"]
    change = {"experiment_id": experiment_id, "state": "STOPPING_COMPLETED"}
    events = [
        stored("ExperimentSubmitted", 2, submitted, 1),
        stored("ExperimentStateChanged", 1, change, 2),
        stored("ExperimentStateChanged", 1, {**change, "state": "COMPLETED"}, 3),
    ]
    view = aggregates.fold_experiment(experiment_id, events)
    assert (view.state, view.ended_at) == ("COMPLETED", MOMENT)
    trial = [stored("TrialStateChanged", 1, {"trial_id": 1, "state": "COMPLETED"}, 4)]
    assert aggregates.fold_trial(1, trial).state == "COMPLETED"
