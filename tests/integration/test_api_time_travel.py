"""Time travel over real HTTP and a real store: ``?at=POSITION|TIMESTAMP`` on an experiment,
its trial list, a trial and the agents answers the state folded from the log up to that point,
which is what the present-state API answered back then."""

from __future__ import annotations

import asyncio
import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cairn.cli import main as cli_main
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    CheckpointSaved,
    ExperimentStateChanged,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
)
from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.helpers import cli_env
from tests.integration.test_api_queries import submit, user
from tests.integration.test_api_support import Api, allocate, running_api

PROJECTION_ONLY = ("progress", "status", "last_heartbeat", "at", "position")
"""Fields only the tracker's projections or the gateway's own tables know (null in the past),
and the point in the log an answer was read at."""


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints") as client:
        yield client


def comparable(value: Any) -> Any:
    """``value`` without the fields a past answer cannot know, recursively."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in PROJECTION_ONLY}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


async def first_run(store: EventStore) -> None:
    """Experiment 1 with trial 11 running, a validation and a checkpoint."""
    await submit(store, 1)
    allocation = await allocate(store, 11)
    await store.append(
        trial_stream(11),
        [
            TrialStarted(trial_id=11, allocation_id=allocation, run_id=1, agent_id="gpu01"),
            ValidationReported(trial_id=11, run_id=1, steps_completed=10, metrics={"loss": 0.5}),
            CheckpointSaved(trial_id=11, run_id=1, uuid="c-10", steps_completed=10),
        ],
    )


async def later(store: EventStore) -> None:
    """What happens after the moment the test travels back to: a better validation, a second
    trial, the trial and the experiment completing."""
    await store.append(
        trial_stream(11),
        [
            ValidationReported(trial_id=11, run_id=1, steps_completed=20, metrics={"loss": 0.25}),
            CheckpointSaved(trial_id=11, run_id=1, uuid="c-20", steps_completed=20),
            TrialStateChanged(trial_id=11, state="COMPLETED"),
        ],
    )
    await allocate(store, 12)
    await store.append(
        experiment_stream(1),
        [
            ExperimentStateChanged(experiment_id=1, state="STOPPING_COMPLETED"),
            ExperimentStateChanged(experiment_id=1, state="COMPLETED"),
        ],
    )


async def test_experiment_and_trials_at_a_past_position_are_what_they_were(
    api: Api, store: EventStore
) -> None:
    """After more happened, ``?at=P`` on the experiment, its trial list and its trial answers
    what the present-state API answered when P was the head, and differs from now."""
    await first_run(store)
    await catch_up(store)
    position = await store.head()
    then = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    then_trials = await api.ok("GET", "/api/v1/experiments/1/trials", token=api.admin)
    then_trial = await api.ok("GET", "/api/v1/trials/11", token=api.admin)
    assert then["state"] == "ACTIVE" and then["best_metric"] == 0.5

    await later(store)
    await catch_up(store)
    now = await api.ok("GET", "/api/v1/experiments/1", token=api.admin)
    assert (now["state"], now["num_trials"], now["best_metric"]) == ("COMPLETED", 2, 0.25)

    assert then["position"] == position and now["position"] > position
    assert then["submitted_position"] == now["submitted_position"] < position
    past = await api.ok("GET", f"/api/v1/experiments/1?at={position}", token=api.admin)
    assert past["at"] == position
    assert comparable(past) == comparable(then)
    assert comparable(past) != comparable(now)
    past_trials = await api.ok(
        "GET", f"/api/v1/experiments/1/trials?at={position}", token=api.admin
    )
    assert comparable(past_trials) == comparable(then_trials)
    past_trial = await api.ok("GET", f"/api/v1/trials/11?at={position}", token=api.admin)
    assert past_trial["at"] == position
    assert comparable(past_trial) == comparable(then_trial)
    assert past_trial["state"] == "ACTIVE" and [c["uuid"] for c in past_trial["checkpoints"]] == [
        "c-10"
    ]


async def test_a_timestamp_maps_to_the_last_position_recorded_at_or_before_it(
    api: Api, store: EventStore
) -> None:
    """``?at=`` an ISO 8601 time is the last position recorded at or before it."""
    await first_run(store)
    position = await store.head()
    recorded_at = (await store.read_all(after=position - 1, limit=1))[0].recorded_at
    await later(store)
    for text in (recorded_at.isoformat(), recorded_at.isoformat().replace("+00:00", "Z")):
        status, past = await api.call(
            "GET", "/api/v1/experiments/1", api.admin, params={"at": text}
        )
        assert status == 200, past
        assert past["at"] == position and past["state"] == "ACTIVE"


async def test_bad_early_and_foreign_at_answers(api: Api, store: EventStore) -> None:
    """A malformed ``at`` is a 400 naming the parameter; an ``at`` before the experiment (or
    the trial, or the agent) existed is a 404; another user's experiment is a 403 in the past
    as in the present."""
    await api.ok("GET", "/api/v1/agents", token=api.admin)
    await first_run(store)
    hostile = ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "x" * 3000)
    for bad in ("yesterday", "-1", "1.5", "2026-13-01T00:00:00Z", "9" * 30, "\x00", *hostile):
        for path in ("/api/v1/experiments/1", "/api/v1/trials/11", "/api/v1/agents"):
            status, body = await api.call("GET", path, api.admin, params={"at": bad})
            assert status == 400, (path, bad, body)
            assert body["error"]["path"] == "at" and "at must be" in body["error"]["message"]
    status, body = await api.call("GET", "/api/v1/experiments/1?at=0", api.admin)
    assert status == 404 and "at position 0" in body["error"]["message"]
    status, body = await api.call("GET", "/api/v1/experiments/1/trials?at=0", api.admin)
    assert status == 404
    submitted = await store.stream_version(experiment_stream(1))
    assert submitted == 2  # the submission, then trial 11's request
    first = (await store.read_stream(experiment_stream(1)))[0].position
    status, body = await api.call("GET", f"/api/v1/trials/11?at={first}", api.admin)
    assert status == 404 and "no trial 11 at position" in body["error"]["message"]
    status, body = await api.call("GET", "/api/v1/trials/11?at=1970-01-01T00:00:00Z", api.admin)
    assert status == 404
    bob = await user(api, store)
    status, _ = await api.call("GET", f"/api/v1/experiments/1?at={first}", bob)
    assert status == 403
    status, _ = await api.call("GET", f"/api/v1/trials/11?at={first}", bob)
    assert status == 403


async def test_agents_at_a_past_position(api: Api, store: EventStore) -> None:
    """The agent list at a past position shows the agents and slots as they were: a slot
    disabled later is enabled then, an agent registered later is absent, and the slot a run
    held is shown held."""
    await api.ok(
        "POST",
        "/api/v1/agents/gpu01/register",
        token=api.agent,
        json={"slots": [{"slot_id": "0"}, {"slot_id": "1"}], "hostname": "h1"},
    )
    before_any = 0
    await submit(store, 1)
    allocation = await allocate(store, 11, slots=("0",))
    await catch_up(store)
    position = await store.head()
    then = await api.ok("GET", "/api/v1/agents", token=api.admin)
    await api.ok("POST", "/api/v1/agents/gpu01/slots/1/disable", token=api.admin)
    await api.ok(
        "POST",
        "/api/v1/agents/gpu02/register",
        token=await api.agent_token("gpu02"),
        json={"slots": [{"slot_id": "0"}], "hostname": "h2"},
    )
    await catch_up(store)
    now = await api.ok("GET", "/api/v1/agents", token=api.admin)
    assert [a["agent_id"] for a in now["agents"]] == ["gpu01", "gpu02"]

    past = await api.ok("GET", f"/api/v1/agents?at={position}", token=api.admin)
    assert comparable(past) == comparable(then)
    [gpu01] = past["agents"]
    assert [(s["slot_id"], s["enabled"], s["allocation_id"]) for s in gpu01["slots"]] == [
        ("0", True, allocation),
        ("1", True, None),
    ]
    one = await api.ok("GET", f"/api/v1/agents/gpu01?at={position}", token=api.admin)
    assert one == gpu01
    status, _ = await api.call("GET", f"/api/v1/agents/gpu02?at={position}", api.admin)
    assert status == 404
    empty = await api.ok("GET", f"/api/v1/agents?at={before_any}", token=api.admin)
    assert empty == {"agents": []}


async def test_cli_at_flags(
    api: Api, store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cairn experiment describe --at``, ``experiment list-trials --at`` and ``agent list
    --at`` print the past state; a bad ``--at`` exits non-zero with the API's message."""
    await api.ok(
        "POST",
        "/api/v1/agents/gpu01/register",
        token=api.agent,
        json={"slots": [{"slot_id": "0"}], "hostname": "h1"},
    )
    await first_run(store)
    position = await store.head()
    await later(store)

    cli_env(monkeypatch, tmp_path / "home", api.url)

    def run(args: tuple[str, ...]) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = cli_main(list(args))
        return code, out.getvalue()

    async def cli(*args: str) -> tuple[int, str]:
        # The CLI's client blocks; the gateway serves it from this test's event loop.
        return await asyncio.to_thread(run, args)

    code, out = await cli("experiment", "describe", "1", "--at", str(position))
    assert code == 0, out
    assert "ACTIVE" in out and "COMPLETED" not in out and "as of position" in out
    code, out = await cli("experiment", "describe", "1")
    assert code == 0 and "COMPLETED" in out, out
    code, out = await cli("experiment", "list-trials", "1", "--at", str(position), "--json")
    assert code == 0, out
    assert '"trial_id": 11' in out and '"trial_id": 12' not in out
    code, out = await cli("agent", "list", "--at", "0", "--json")
    assert code == 0 and '"agents": []' in out, out
    code, out = await cli("agent", "list", "--at", str(position))
    assert code == 0 and "gpu01" in out, out
    code, out = await cli("experiment", "describe", "1", "--at", "soon")
    assert code != 0 and "at must be" in out, out
