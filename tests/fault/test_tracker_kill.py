"""SIGKILL of the tracker while a batched page is written but not committed: nothing of that page
is visible, and the restarted tracker ends with tables equal to a rebuild from the log."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from cairn.local.servers import ServerProcess
from events.domain.config import parse_config
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    ExperimentSubmitted,
    TrialRequested,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.store import EventStore
from services.tracker import projections, schema
from tests.helpers import spawn, wait_for_line, wait_until
from tests.integration.test_api_support import CONFIG
from tests.integration.test_tracker import snapshot

POINTS = 1200
"""Metric reports in the log: more than one page of the consumer (500)."""


async def seed(store: EventStore) -> None:
    """An experiment, two trials, and POINTS training reports with a validation every 100."""
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    await store.append(experiment_stream(1), [ExperimentSubmitted(experiment_id=1, config=config)])
    await store.append(
        experiment_stream(1),
        [
            TrialRequested(
                experiment_id=1, trial_id=t, seq=t, request_id=f"r{t}", hparams={}, trial_seed=1
            )
            for t in (1, 2)
        ],
    )
    for trial in (1, 2):
        events: list[WorkloadCompleted | ValidationReported] = []
        for step in range(1, POINTS // 2 + 1):
            metrics = {"loss": 1 / step}
            events.append(
                WorkloadCompleted(trial_id=trial, run_id=1, steps_completed=step, metrics=metrics)
            )
            if step % 100 == 0:
                events.append(
                    ValidationReported(
                        trial_id=trial, run_id=1, steps_completed=step, metrics=metrics
                    )
                )
        await store.append(trial_stream(trial), events)


async def run_tracker_to(
    store: EventStore, args: tuple[str, ...], env: dict[str, str], head: int, timeout: float
) -> None:
    """Starts a tracker process, waits until its projections' checkpoint reaches ``head``, then
    stops it with SIGTERM."""
    tracker = spawn("services.tracker", *args, env=env)
    try:
        await asyncio.to_thread(wait_for_line, tracker, "ready")

        async def caught_up() -> bool:
            return await store.checkpoint(projections.NAME) >= head

        await wait_until(caught_up, timeout=timeout)
    finally:
        tracker.send_signal(signal.SIGTERM)
        tracker.wait(10)


async def test_tracker_killed_mid_page_loses_nothing_and_applies_nothing_twice(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    service_env: Callable[..., dict[str, str]],
) -> None:
    """A tracker SIGKILLed after writing a batched page, before its commit, leaves neither rows
    nor checkpoint behind; restarted, it projects the whole log exactly as a rebuild does."""
    await schema.migrate(store)
    await seed(store)
    head = await store.head()
    args = ("--db", db_url, "--nats", nats_server.url)
    tracker = spawn("services.tracker", *args, env=service_env("tracker.page_applied=120"))
    try:
        await asyncio.to_thread(wait_for_line, tracker, "FAULT-POINT tracker.page_applied")
        # The page's rows are written in the open transaction: the fault happened mid-page.
        assert await store.fetchval(
            """SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
               WHERE c.relname = 'tr_metrics' AND l.mode = 'RowExclusiveLock' AND l.granted"""
        )
        tracker.send_signal(signal.SIGKILL)
        tracker.wait(10)
    finally:
        if tracker.poll() is None:
            tracker.kill()
            tracker.wait(10)
    assert await store.fetchval("SELECT count(*) FROM tr_metrics") == 0
    assert await store.checkpoint(projections.NAME) == 0

    await run_tracker_to(store, args, service_env(), head, timeout=60)
    live = await snapshot(store)
    assert sum(1 for r in live["tr_metrics"] if r["group"] == "training") == POINTS
    await projections.rebuild(store)
    assert await snapshot(store) == live
