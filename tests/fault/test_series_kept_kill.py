"""SIGKILL of the tracker mid-run, while a page of running trials' reports is written but not
committed: their kept chart buckets stay as committed before the page, and the restarted
tracker ends with buckets equal to a recomputation from the points and to a rebuild."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from cairn.local.servers import ServerProcess
from events.domain.names import trial_stream
from events.log.store import EventStore
from services.tracker import projections
from services.tracker.service import catch_up
from tests.fault.test_tracker_kill import run_tracker_to
from tests.helpers import spawn, wait_for_line
from tests.integration.test_series_kept import TRIALS, kept, recomputed, start
from tests.integration.test_series_rollups import reports
from tests.integration.test_tracker import snapshot


async def test_tracker_killed_mid_run_keeps_the_same_buckets(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    service_env: Callable[..., dict[str, str]],
) -> None:
    """Buckets kept for running trials survive a SIGKILL between a page's writes and its commit
    unchanged; the restarted tracker's buckets equal the points' and a rebuild's."""
    await start(store)
    for trial in TRIALS:
        await store.append(trial_stream(trial), reports(trial, 1, range(1, 400)))
    await catch_up(store)
    committed = await kept(store)
    assert {r["trial_id"] for r in committed} == set(TRIALS)
    # The next reports: appends for two trials, a rollback (run 2 past step 200) for the third.
    await store.append(trial_stream(21), reports(21, 1, range(400, 700)))
    await store.append(trial_stream(22), reports(22, 2, range(200, 500)))
    await store.append(trial_stream(23), reports(23, 1, range(400, 2200)))
    head = await store.head()
    args = ("--db", db_url, "--nats", nats_server.url)
    tracker = spawn("services.tracker", *args, env=service_env("tracker.page_applied=120"))
    try:
        await asyncio.to_thread(wait_for_line, tracker, "FAULT-POINT tracker.page_applied")
        # The page's buckets are written in the open transaction: the fault happened mid-page.
        assert await store.fetchval(
            """SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
               WHERE c.relname = 'tr_series_rollups' AND l.mode = 'RowExclusiveLock'
                 AND l.granted"""
        )
        tracker.send_signal(signal.SIGKILL)
        tracker.wait(10)
    finally:
        if tracker.poll() is None:
            tracker.kill()
            tracker.wait(10)
    assert await kept(store) == committed

    await run_tracker_to(store, args, service_env(), head, timeout=120)
    after = await kept(store)
    assert after != committed
    assert after == await recomputed(store)
    live = await snapshot(store)
    await projections.rebuild(store)
    assert await snapshot(store) == live
