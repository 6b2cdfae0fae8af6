"""Event store throughput: appends (batches of 1 and 100) and replay/fold over 1M events.

Every cairn figure stands beside a raw asyncpg baseline on the same database and server, against
a table of the same shape (``CREATE TABLE raw_events (LIKE events INCLUDING ALL)``) for appends
and against the very same ``events`` rows for replay. Ratios are cairn / baseline (higher is
better; 1.0 is as fast as hand-written driver code doing less).
"""

from __future__ import annotations

import gc
import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from bench.common import BenchContext, Measure, Report, Stopwatch, per_second, progress, timed
from events.domain.aggregates import ExperimentView, TrialView, apply_experiment, apply_trial
from events.domain.names import trial_of_stream
from events.domain.types import (
    CheckpointSaved,
    ExperimentSubmitted,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
    TrialStarted,
    ValidationReported,
    WorkloadCompleted,
)
from events.log.envelope import Event, RecordedEvent
from events.log.registry import encode
from events.log.store import EventStore
from services.runtime import tune_gc

REPLAY_TARGET = 0.5
"""The goal for decode+fold: at least this fraction of a raw paged read's rate."""
PAGE = 5000  # the page size of EventStore.iter_all; every paged read here uses it
EVENTS_PER_STREAM = 100
TRIALS_PER_EXPERIMENT = EVENTS_PER_STREAM - 1  # the experiment stream: 1 submit + 99 requests
COPY_CHUNK_STEPS = 5  # steps (one event of every stream) per COPY while loading

_COLUMNS = (
    "position, stream_id, stream_version, event_id, type, schema_version, payload, metadata, "
    "recorded_at"
)
INSERT_COLUMNS = (
    "event_id",
    "stream_id",
    "stream_version",
    "type",
    "schema_version",
    "payload",
    "metadata",
)
"""The ``events`` columns a bulk load writes (the rest take their defaults)."""
_RAW_INSERT_ONE = """INSERT INTO raw_events (event_id, stream_id, stream_version, type,
                                             schema_version, payload, metadata)
                     VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb)"""
_RAW_INSERT_UNNEST = """INSERT INTO raw_events (event_id, stream_id, stream_version, type,
                                                schema_version, payload, metadata)
    SELECT e, $2, v, t, s, p::jsonb, m::jsonb
    FROM unnest($1::uuid[], $3::bigint[], $4::text[], $5::int[], $6::text[], $7::text[])
         AS u(e, v, t, s, p, m)"""
_RAW_VERSION = "SELECT coalesce(max(stream_version), 0) FROM raw_events WHERE stream_id = $1"
_RAW_PAGE = f"SELECT {_COLUMNS} FROM events WHERE position > $1 ORDER BY position LIMIT $2"
_RAW_SCAN = f"SELECT {_COLUMNS} FROM events ORDER BY position"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


async def _json_codec(conn: asyncpg.Connection) -> None:
    """The same jsonb codec as cairn's pool (``events.log.db``): jsonb arrives as Python values."""
    await conn.set_type_codec(
        "jsonb", encoder=_dumps, decoder=json.loads, schema="pg_catalog", format="text"
    )


# --------------------------------------------------------------------------------------------
# workload: realistic trial-stream events


def _metrics(rng: random.Random, step: int) -> dict[str, float]:
    loss = 2.0 / (1 + step / 1000) + rng.random() * 0.05
    return {"loss": round(loss, 6), "accuracy": round(1 - loss / 2.5, 6), "lr": 0.001}


def _training_event(rng: random.Random, trial_id: int, k: int) -> Event:
    """One of the frequent in-run events of a trial (workloads, validations, checkpoints)."""
    steps = 100 * (k + 1)
    match k % 4:
        case 0 | 1:
            return WorkloadCompleted(
                trial_id=trial_id, run_id=1, steps_completed=steps, metrics=_metrics(rng, steps)
            )
        case 2:
            return ValidationReported(
                trial_id=trial_id, run_id=1, steps_completed=steps, metrics=_metrics(rng, steps)
            )
        case _:
            return CheckpointSaved(
                trial_id=trial_id,
                run_id=1,
                uuid=str(uuid.UUID(int=rng.getrandbits(128))),
                steps_completed=steps,
                resources={"model.pt": 4_194_304 + k, "optimizer.pt": 8_388_608},
                metadata={"framework": "torch", "steps_completed": steps},
            )


def _trial_payload(rng: random.Random, exp: int, trial: int, step: int) -> tuple[str, int, str]:
    """(type, schema_version, payload JSON) of event ``step`` (0-based) of a trial stream.

    A trial stream: allocation, start, 96 training events, exit, release. Odd trials' exits are
    stored as the historic v1 payload, so replay also runs the TrialExited v1 -> v2 upcaster.
    """
    trial_id = exp * 1000 + trial
    alloc = f"alloc-{exp}-{trial}-1"
    placements = {f"agent-{trial % 8}": [f"slot-{trial % 4}"]}
    event: Event
    if step == 0:
        event = SlotsAllocated(trial_id=trial_id, allocation_id=alloc, placements=placements)
    elif step == 1:
        event = TrialStarted(
            trial_id=trial_id, allocation_id=alloc, run_id=1, agent_id=f"agent-{trial % 8}"
        )
    elif step == EVENTS_PER_STREAM - 2:
        if trial % 2:
            # As cairn first stored it: the trial named "<experiment>.<n>", ``failed`` a bool.
            legacy = f"{exp}.{trial}"
            v1 = {"trial_id": legacy, "run_id": 1, "allocation_id": alloc, "failed": False}
            return "TrialExited", 1, _dumps(v1)
        event = TrialExited(trial_id=trial_id, run_id=1, allocation_id=alloc, outcome="completed")
    elif step == EVENTS_PER_STREAM - 1:
        event = SlotsReleased(trial_id=trial_id, allocation_id=alloc, placements=placements)
    else:
        event = _training_event(rng, trial_id, step - 2)
    return event.event_type, event.schema_version, event.model_dump_json()


def _experiment_payload(rng: random.Random, exp: int, step: int) -> tuple[str, int, str]:
    """(type, schema_version, payload JSON) of event ``step`` of an experiment stream."""
    event: Event
    if step == 0:
        event = ExperimentSubmitted(
            experiment_id=exp,
            config={
                "name": f"bench-{exp}",
                "searcher": {"name": "random", "metric": "loss", "max_trials": 99},
                "hyperparameters": {"lr": {"type": "log", "minval": -5, "maxval": -1}},
                "resources": {"slots_per_trial": 1},
            },
            code_ref=f"sha256:{rng.getrandbits(256):064x}",
        )
    else:
        event = TrialRequested(
            experiment_id=exp,
            trial_id=exp * 1000 + step,
            seq=step,
            request_id=str(uuid.UUID(int=rng.getrandbits(128))),
            hparams={"lr": 10 ** rng.uniform(-5, -1), "batch_size": 32, "layers": 4},
            trial_seed=rng.getrandbits(31),
        )
    return event.event_type, event.schema_version, event.model_dump_json()


@dataclass
class ReplayStats:
    """What the replay fold counts beside its views, and the best validation loss seen."""

    events: int = 0
    validations: int = 0
    exits: int = 0
    best_loss: float | None = None
    last_position: int = 0


class ReplayFold:
    """The log folded as the services fold it: each event decoded once, then applied in place by
    the real aggregates (``apply_experiment`` to an :class:`ExperimentView` per experiment
    stream, ``apply_trial`` to a :class:`TrialView` per trial stream), with a few counts."""

    def __init__(self) -> None:
        self.stats = ReplayStats()
        self.experiments: dict[str, ExperimentView] = {}
        self.trials: dict[str, TrialView] = {}

    def apply(self, recorded: RecordedEvent) -> None:
        """Decodes ``recorded`` (upcasting old versions) and applies it to its stream's view."""
        stats = self.stats
        stats.events += 1
        stats.last_position = recorded.position
        event = recorded.decode()
        stream = recorded.stream_id
        if stream.startswith("trial-"):
            trial = self.trials.get(stream)
            if trial is None:
                trial = self.trials[stream] = TrialView(trial_of_stream(stream) or 0)
            apply_trial(trial, recorded, event)
        elif stream.startswith("experiment-"):
            experiment = self.experiments.get(stream)
            if experiment is None:
                experiment = ExperimentView(int(stream.partition("-")[2]))
                self.experiments[stream] = experiment
            apply_experiment(experiment, recorded, event)
        if isinstance(event, ValidationReported):
            stats.validations += 1
            loss = event.metrics.get("loss")
            if isinstance(loss, float) and (stats.best_loss is None or loss < stats.best_loss):
                stats.best_loss = loss
        elif isinstance(event, TrialExited):
            stats.exits += 1


def _rate(report: Report, key: str, watch: Stopwatch, count: int) -> float:
    """Prints and records (in ``details["timings"]``) one timed run; returns events/s."""
    rate = per_second(count, watch.seconds)
    progress(f"  {rate:,.0f} events/s ({watch.summary(count)})")
    report.details.setdefault("timings", {})[key] = {
        "events": count,
        "seconds": round(watch.seconds, 3),
        "cpu_seconds_client": round(watch.cpu_seconds, 3),
        "us_per_event": round(1e6 * watch.seconds / count, 3),
        "cpu_us_per_event_client": round(1e6 * watch.cpu_seconds / count, 3),
    }
    return rate


# --------------------------------------------------------------------------------------------
# 1. appends


async def _appends(ctx: BenchContext, report: Report) -> None:
    dsn = await ctx.create_database("bench_append")
    store = await EventStore.connect(dsn, max_size=2)
    raw = await asyncpg.connect(dsn)
    try:
        await raw.execute("CREATE TABLE raw_events (LIKE events INCLUDING ALL)")
        rng = random.Random(1)
        n_single = ctx.scaled(3000)
        n_batches = ctx.scaled(1000)
        singles: list[Event] = [
            ValidationReported(
                trial_id=1 + k % 100,
                run_id=1,
                steps_completed=100 * k,
                metrics=_metrics(rng, k),
            )
            for k in range(n_single)
        ]
        batches: list[list[Event]] = [
            [_training_event(rng, 201 + b % 100, 100 * (b // 100) + i) for i in range(100)]
            for b in range(n_batches)
        ]
        # warm up both paths (connections, prepared statements, first pages of the indexes)
        for k in range(20):
            await store.append("warmup-1", [singles[k]], expected_version=k)
            await raw.execute(_RAW_INSERT_ONE, uuid.uuid4(), "warmup-1", k + 1, "x", 1, "{}", "{}")

        # batch of 1 -------------------------------------------------------------------------
        progress(f"append batch=1: cairn, {n_single:,} appends (own transaction each)")
        versions: dict[str, int] = {}
        with timed() as t:
            for k, event in enumerate(singles):
                stream = f"trial-{1 + k % 100}"
                recorded = await store.append(
                    stream, [event], expected_version=versions.get(stream, 0)
                )
                versions[stream] = recorded[-1].stream_version
        cairn_single = _rate(report, "append batch=1: cairn", t, n_single)

        payloads = [encode(e) for e in singles]
        progress(f"append batch=1: raw INSERT, {n_single:,} rows (own transaction each)")
        with timed() as t:
            for k, payload in enumerate(payloads):
                await raw.execute(
                    _RAW_INSERT_ONE,
                    uuid.uuid4(),
                    f"raw1-1.{k % 100}",
                    k // 100 + 1,
                    "ValidationReported",
                    1,
                    _dumps(payload),
                    "{}",
                )
        raw_single = _rate(report, "append batch=1: raw INSERT", t, n_single)

        # reference: the statements cairn sends, from raw asyncpg on a bare connection
        progress(
            f"append batch=1: raw, the 7-statement append sequence cairn used before (reference), {n_single:,}"
        )
        with timed() as t:
            for k, payload in enumerate(payloads):
                stream = f"raws-1.{k % 100}"
                async with raw.transaction():
                    await raw.execute("SET LOCAL lock_timeout = '10s'")
                    await raw.execute("LOCK TABLE raw_events IN EXCLUSIVE MODE")
                    current = await raw.fetchval(_RAW_VERSION, stream)
                    await raw.fetch(
                        f"{_RAW_INSERT_ONE} RETURNING {_COLUMNS}",
                        uuid.uuid4(),
                        stream,
                        current + 1,
                        "ValidationReported",
                        1,
                        _dumps(payload),
                        "{}",
                    )
                    await raw.execute("SELECT pg_notify($1, $2)", "bench_raw", stream)
        raw_seq = _rate(report, "append batch=1: raw, cairn's statements", t, n_single)
        report.measures += [
            Measure(
                "append, batch=1",
                cairn_single,
                raw_single,
                "raw INSERT/txn",
                count=n_single,
                notes="cairn: append(expected_version=...), one transaction per event",
            ),
            Measure(
                "append, batch=1 (ref)",
                cairn_single,
                raw_seq,
                "raw, former 7-stmt append",
                count=n_single,
                notes="baseline: BEGIN, SET LOCAL, LOCK, SELECT max, INSERT RETURNING, "
                "pg_notify, COMMIT from raw asyncpg: the round trips without cairn's Python",
            ),
        ]

        # batch of 100 -----------------------------------------------------------------------
        n_events = 100 * n_batches
        progress(f"append batch=100: cairn, {n_batches:,} batches ({n_events:,} events)")
        versions = {}
        with timed() as t:
            for b, batch in enumerate(batches):
                stream = f"trial-{201 + b % 100}"
                recorded = await store.append(
                    stream, batch, expected_version=versions.get(stream, 0)
                )
                versions[stream] = recorded[-1].stream_version
        cairn_batch = _rate(report, "append batch=100: cairn", t, n_events)

        batch_payloads = [[(e.event_type, encode(e)) for e in batch] for batch in batches]
        progress(f"append batch=100: raw INSERT ... SELECT unnest, {n_batches:,} batches")
        with timed() as t:
            for b, items in enumerate(batch_payloads):
                base = 100 * (b // 100)
                await raw.execute(
                    _RAW_INSERT_UNNEST,
                    [uuid.uuid4() for _ in items],
                    f"rawu-2.{b % 100}",
                    [base + i + 1 for i in range(len(items))],
                    [typ for typ, _ in items],
                    [1] * len(items),
                    [_dumps(p) for _, p in items],
                    ["{}"] * len(items),
                )
        raw_unnest = _rate(report, "append batch=100: raw unnest", t, n_events)

        progress(f"append batch=100: raw COPY (copy_records_to_table), {n_batches:,} batches")
        with timed() as t:
            for b, items in enumerate(batch_payloads):
                base = 100 * (b // 100)
                stream = f"rawc-2.{b % 100}"
                await raw.copy_records_to_table(
                    "raw_events",
                    columns=INSERT_COLUMNS,
                    records=[
                        (uuid.uuid4(), stream, base + i + 1, typ, 1, _dumps(p), "{}")
                        for i, (typ, p) in enumerate(items)
                    ],
                )
        raw_copy = _rate(report, "append batch=100: raw COPY", t, n_events)
        report.measures.append(
            Measure("append, batch=100", cairn_batch, raw_unnest, "raw unnest/txn", count=n_events)
        )
        report.measures.append(
            Measure("append, batch=100", cairn_batch, raw_copy, "raw COPY/txn", count=n_events)
        )
    finally:
        await raw.close()
        await store.close()


# --------------------------------------------------------------------------------------------
# 2. replay


async def _load(raw: asyncpg.Connection, n_experiments: int) -> int:
    """COPYs ``n_experiments`` experiment streams and their trial streams into ``events``.

    Positions interleave streams as a real log does: step by step, one event of every stream.
    """
    rng = random.Random(2)
    streams: list[tuple[str, int, int | None]] = []  # (stream_id, experiment, trial | None)
    for exp in range(1, n_experiments + 1):
        streams.append((f"experiment-{exp}", exp, None))
        streams.extend((f"trial-{exp}.{t}", exp, t) for t in range(1, TRIALS_PER_EXPERIMENT + 1))
    total = len(streams) * EVENTS_PER_STREAM
    loaded = 0
    next_report = 200_000
    for first in range(0, EVENTS_PER_STREAM, COPY_CHUNK_STEPS):
        records: list[tuple[Any, ...]] = []
        for step in range(first, min(first + COPY_CHUNK_STEPS, EVENTS_PER_STREAM)):
            for stream_id, exp, trial in streams:
                if trial is None:
                    typ, version, payload = _experiment_payload(rng, exp, step)
                    meta = '{"actor":"api"}' if step == 0 else '{"actor":"searcher"}'
                else:
                    typ, version, payload = _trial_payload(rng, exp, trial, step)
                    meta = f'{{"actor":"agent","correlation_id":"trial-{exp}.{trial}"}}'
                event_id = uuid.UUID(int=rng.getrandbits(128), version=4)
                records.append((event_id, stream_id, step + 1, typ, version, payload, meta))
        await raw.copy_records_to_table("events", columns=INSERT_COLUMNS, records=records)
        loaded += len(records)
        if loaded >= next_report or loaded == total:
            progress(f"  loaded {loaded:,}/{total:,}")
            next_report += 200_000
    return total


class _Ticker:
    """Prints a progress line every ``every`` events of a long scan."""

    def __init__(self, every: int = 250_000) -> None:
        self.every = every
        self.next = every

    def __call__(self, n: int) -> None:
        if n >= self.next:
            progress(f"  ... {n:,} events")
            self.next += self.every


async def _raw_paged(conn: asyncpg.Connection) -> int:
    n, position, tick = 0, 0, _Ticker()
    while True:
        rows = await conn.fetch(_RAW_PAGE, position, PAGE)
        n += len(rows)
        tick(n)
        if len(rows) < PAGE:
            return n
        position = rows[-1]["position"]


async def _raw_cursor(conn: asyncpg.Connection) -> int:
    n, tick = 0, _Ticker()
    async with conn.transaction():
        async for _row in conn.cursor(_RAW_SCAN, prefetch=PAGE):
            n += 1
            if n % PAGE == 0:
                tick(n)
    return n


async def _cairn_read_all(store: EventStore) -> int:
    n, position, tick = 0, 0, _Ticker()
    while True:
        page = await store.read_all(position, limit=PAGE)
        n += len(page)
        tick(n)
        if len(page) < PAGE:
            return n
        position = page[-1].position


async def _cairn_fold(store: EventStore) -> tuple[int, ReplayStats]:
    fold = ReplayFold()
    n, position, tick = 0, 0, _Ticker()
    while True:
        page = await store.read_all(position, limit=PAGE)
        for event in page:
            fold.apply(event)
        n += len(page)
        tick(n)
        if len(page) < PAGE:
            if n and not fold.trials:
                raise RuntimeError("the fold saw no trial stream")
            return n, fold.stats
        position = page[-1].position


async def _replay(ctx: BenchContext, report: Report) -> None:
    # The services run with this collector setting (services.runtime.main); both cairn and the
    # raw baselines below are measured under it, and the default is back for the next bench.
    thresholds = gc.get_threshold()
    tune_gc()
    try:
        await _replay_tuned(ctx, report)
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def _replay_tuned(ctx: BenchContext, report: Report) -> None:
    dsn = await ctx.create_database("bench_replay")
    store = await EventStore.connect(dsn, max_size=2)
    raw = await asyncpg.connect(dsn)  # jsonb as text: the driver doing the least work
    raw_json = await asyncpg.connect(dsn)
    await _json_codec(raw_json)  # jsonb parsed, as cairn's pool does
    try:
        n_experiments = ctx.scaled(100)
        target = n_experiments * EVENTS_PER_STREAM * EVENTS_PER_STREAM
        progress(
            f"replay: loading {target:,} events over {n_experiments * EVENTS_PER_STREAM:,} "
            "streams (bulk COPY into events)"
        )
        with timed() as t_load:
            total = await _load(raw, n_experiments)
            await raw.execute("VACUUM (ANALYZE) events")
            await raw.execute("CHECKPOINT")
        size = await raw.fetchval("SELECT pg_size_pretty(pg_total_relation_size('events'))")
        types = await raw.fetch("SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY 1")
        progress(f"  loaded in {t_load.seconds:.1f}s; events table {size}; warming the cache")
        await raw.fetchval("SELECT sum(octet_length(payload::text)) FROM events")

        async def measure(label: str, coro: Any) -> float:
            progress(f"replay: {label}")
            with timed() as t:
                result = await coro
            n = result[0] if isinstance(result, tuple) else result
            if n != total:
                raise RuntimeError(f"{label}: read {n:,} events, expected {total:,}")
            return _rate(report, label, t, n)

        raw_text = await measure("raw paged SELECT, jsonb as text", _raw_paged(raw))
        raw_paged = await measure("raw paged SELECT, jsonb parsed", _raw_paged(raw_json))
        raw_cursor = await measure("raw cursor scan, jsonb parsed", _raw_cursor(raw_json))
        cairn_read = await measure("cairn read_all -> RecordedEvent", _cairn_read_all(store))
        progress("replay: cairn read_all + decode to models + fold")
        with timed() as t:
            n, state = await _cairn_fold(store)
        cairn_fold = _rate(report, "cairn read_all + decode + fold", t, n)
        if state.events != total:
            raise RuntimeError(f"fold saw {state.events:,} events, expected {total:,}")

        label = f"replay {total:,}"
        report.measures += [
            Measure(f"{label}: read_all", cairn_read, raw_paged, "raw paged", count=total),
            Measure(f"{label}: read_all", cairn_read, raw_cursor, "raw cursor", count=total),
            Measure(
                f"{label}: decode+fold",
                cairn_fold,
                raw_paged,
                "raw paged",
                count=total,
                target=f">= {REPLAY_TARGET}x",
                met=cairn_fold >= REPLAY_TARGET * raw_paged,
            ),
            Measure(f"{label}: decode+fold", cairn_fold, raw_cursor, "raw cursor", count=total),
            Measure(f"{label}: (ref) raw, jsonb text", None, raw_text, "raw paged", count=total),
        ]
        report.details["replay"] = {
            "events": total,
            "streams": n_experiments * EVENTS_PER_STREAM,
            "page_size": PAGE,
            "load_seconds": round(t_load.seconds, 2),
            "table_size": size,
            "types": {r["type"]: r["n"] for r in types},
            "fold_state": asdict(state),
        }
        report.notes.append(
            f"replay data set: {total:,} events ({len(types)} types, v1 and v2 TrialExited) "
            f"bulk-loaded with COPY into the events table in {t_load.seconds:.0f}s "
            f"(not a measured figure); {size} on disk; page size {PAGE}; the garbage collector "
            "set as the services set it (services.runtime.tune_gc)"
        )
    finally:
        await raw.close()
        await raw_json.close()
        await store.close()


async def run(ctx: BenchContext) -> Report:
    """Runs the append and replay benchmarks; returns their figures."""
    report = Report()
    mode = "durable (fsync on)" if ctx.durable else "fsync OFF"
    report.notes.append(f"PostgreSQL {mode}: {ctx.pg_settings}")
    await _appends(ctx, report)
    await _replay(ctx, report)
    return report


__all__: Sequence[str] = ("ReplayFold", "ReplayStats", "run")
