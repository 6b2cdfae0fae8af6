"""The invariants a chaos run must keep, checked from the log and the API after the run.

Each check returns a :class:`Check`: its name, whether it held, and what was seen. The checks:

- ``completed``: the experiment ended COMPLETED (log and API agree).
- ``log``: ``python -m events.domain.check`` finds nothing (duplicate event ids, stream gaps, a trial
  with two live allocations, an allocation started twice, ...).
- ``requests``: every ``TrialRequested`` of the fault-free run with the same seed is in the log
  of the chaos run, with the same hyperparameters and trial seed.
- ``best``: the best trial by the searcher metric is the same request as in the fault-free run,
  and the API names the trial the log says is best.
- ``projections``: the tracker's tables rebuilt from position 0 (``services.tracker.projections
  .rebuild`` into a scratch database) equal the live ones.
- ``alive``: every supervised process is alive at the end (none given up on).
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import asyncpg

from tests.chaos.driver import ROOT, Local
from tests.helpers import wait_until_sync


@dataclass
class Check:
    """One invariant after a run: its name, whether it held, and what was seen."""

    name: str
    held: bool
    detail: str = ""


def completed(local: Local, exp_id: int) -> Check:
    """The experiment is COMPLETED in the API's view."""
    try:
        described = local.json("experiment", "describe", str(exp_id))
    except AssertionError as exc:
        return Check("completed", False, f"describe failed: {exc}")
    state = described.get("state")
    return Check("completed", state == "COMPLETED", f"state {state}")


def log_invariants(local: Local) -> Check:
    """``python -m events.domain.check DSN`` reports 0 findings."""
    done = subprocess.run(
        [sys.executable, "-m", "events.domain.check", local.dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    held = done.returncode == 0 and "0 findings" in done.stdout
    detail = lines[-1] if held else "; ".join(lines[-6:])
    return Check("log", held, detail)


@dataclass(frozen=True)
class Requested:
    """A ``TrialRequested`` as the log recorded it."""

    request_id: str
    trial_id: str
    hparams: dict[str, Any]
    trial_seed: int


def requests_of(local: Local, exp_id: int) -> dict[str, Requested]:
    """The experiment's ``TrialRequested`` events by request id."""
    rows = local.query(
        "SELECT payload FROM events WHERE type = 'TrialRequested' AND stream_id = $1"
        " ORDER BY position",
        f"experiment-{exp_id}",
    )
    out: dict[str, Requested] = {}
    for (payload,) in rows:
        req = Requested(
            str(payload["request_id"]),
            str(payload["trial_id"]),
            dict(payload["hparams"]),
            int(payload["trial_seed"]),
        )
        out.setdefault(req.request_id, req)
    return out


def same_requests(local: Local, exp_id: int, baseline: dict[str, Requested]) -> Check:
    """Every request of the fault-free run is present with the same hyperparameters and seed."""
    found = requests_of(local, exp_id)
    missing = sorted(set(baseline) - set(found))
    changed = sorted(
        r
        for r in set(baseline) & set(found)
        if (baseline[r].hparams, baseline[r].trial_seed) != (found[r].hparams, found[r].trial_seed)
    )
    held = not missing and not changed
    extra = len(set(found) - set(baseline))
    detail = f"{len(found)} requested ({extra} beyond the fault-free {len(baseline)})"
    if missing:
        detail += f"; missing {missing}"
    if changed:
        detail += f"; other hyperparameters for {changed}"
    return Check("requests", held, detail)


def best_request(local: Local, exp_id: int, metric: str = "validation_loss") -> str | None:
    """The request whose trial reported the smallest ``metric`` in the log (ties: first)."""
    requests = requests_of(local, exp_id)
    by_trial = {r.trial_id: r.request_id for r in requests.values()}
    rows = local.query(
        "SELECT payload->>'trial_id', (payload->'metrics'->>$2)::float8 FROM events"
        " WHERE type = 'ValidationReported' AND payload->>'trial_id' = ANY($1::text[])"
        " ORDER BY position",
        list(by_trial),
        metric,
    )
    best: tuple[float, str] | None = None
    for trial_id, value in rows:
        if value is None or math.isnan(value):
            continue
        if best is None or value < best[0]:
            best = (value, str(trial_id))
    return None if best is None else by_trial[best[1]]


def same_best(local: Local, exp_id: int, baseline_best: str | None) -> Check:
    """The best trial is the fault-free run's best request, and the API agrees with the log."""
    best = best_request(local, exp_id)
    requests = requests_of(local, exp_id)
    try:
        api_best = local.json("experiment", "describe", str(exp_id)).get("best_trial_id")
    except AssertionError as exc:
        return Check("best", False, f"describe failed: {exc}")
    log_best = requests[best].trial_id if best is not None else None
    held = best is not None and best == baseline_best and str(api_best) == log_best
    detail = f"{best} (fault-free {baseline_best}); API best trial {api_best}, log {log_best}"
    return Check("best", held, detail)


async def _snapshot(conn: asyncpg.Connection) -> dict[str, list[dict[str, Any]]]:
    from services.tracker.schema import PRIMARY_KEYS, TABLES

    out = {}
    for table in TABLES:
        order = ", ".join(PRIMARY_KEYS[table])
        rows = await conn.fetch(f"SELECT * FROM {table} ORDER BY {order}")
        out[table] = [dict(r) for r in rows]
    return out


async def _rebuilt_equal(dsn: str, scratch_db: str) -> tuple[bool, str]:
    from events.log.store import EventStore
    from services.tracker.projections import NAME, rebuild

    live = await asyncpg.connect(dsn)
    try:
        async with live.transaction(isolation="repeatable_read"):
            position = await live.fetchval("SELECT position FROM checkpoints WHERE name = $1", NAME)
            tables = await _snapshot(live)
            events = await live.fetch(
                "SELECT * FROM events WHERE position <= $1 ORDER BY position", position
            )
        admin = dsn.rsplit("/", 1)[0] + "/postgres"
        sys_conn = await asyncpg.connect(admin)
        try:
            await sys_conn.execute(f'DROP DATABASE IF EXISTS "{scratch_db}"')
            await sys_conn.execute(f'CREATE DATABASE "{scratch_db}"')
        finally:
            await sys_conn.close()
    finally:
        await live.close()
    scratch_dsn = dsn.rsplit("/", 1)[0] + f"/{scratch_db}"
    store = await EventStore.connect(scratch_dsn)  # creates the log's tables
    try:
        if events:
            copier = await asyncpg.connect(scratch_dsn)  # no codecs: rows go back as read
            try:
                await copier.copy_records_to_table(
                    "events", records=[tuple(e) for e in events], columns=list(events[0].keys())
                )
            finally:
                await copier.close()
        applied = await rebuild(store)
    finally:
        await store.close()
    conn = await asyncpg.connect(scratch_dsn)  # read as the live tables were: no codecs
    try:
        rebuilt = await _snapshot(conn)
    finally:
        await conn.close()
        sys_conn = await asyncpg.connect(admin)
        try:
            await sys_conn.execute(f'DROP DATABASE IF EXISTS "{scratch_db}"')
        finally:
            await sys_conn.close()
    differ = [t for t in tables if tables[t] != rebuilt[t]]
    rows = sum(len(v) for v in tables.values())
    if differ:
        first = differ[0]
        diff = [(a, b) for a, b in zip(tables[first], rebuilt[first], strict=False) if a != b][
            :1
        ] or [(len(tables[first]), len(rebuilt[first]))]
        return False, f"differ at position {position}: {differ}; first: {diff[0]}"
    return True, f"{rows} rows in {len(tables)} tables equal after replaying {applied} events"


def projections_rebuild(local: Local, scratch_db: str = "chaos_rebuild") -> Check:
    """The tracker's tables, rebuilt from position 0 into a scratch database, equal the live ones
    (taken at the live tracker's checkpoint, once it has caught up with the log)."""
    caught_up = """SELECT c.position >= (SELECT coalesce(max(position), 0) FROM events)
                   FROM checkpoints c WHERE c.name = 'tracker-projections'"""
    try:
        wait_until_sync(lambda: local.try_value(caught_up), 60, every=0.2)
    except AssertionError:
        return Check("projections", False, "the tracker did not catch up with the log in 60s")
    held, detail = asyncio.run(_rebuilt_equal(local.dsn, scratch_db))
    return Check("projections", held, detail)


def all_alive(local: Local) -> Check:
    """Every supervised process is alive (none marked failed)."""
    procs = local.processes()
    down = sorted(name for name, p in procs.items() if p["state"] != "alive")
    restarts = sum(p["restarts"] for p in procs.values())
    return Check("alive", not down, f"not alive: {down}" if down else f"{restarts} restarts")
