"""Golden histories: logs recorded from real runs, and the final state today's folds give them.

A history is ``tests/fixtures/golden/NAME.jsonl.gz`` (one stored event a line, in position order)
and ``NAME.state.json`` (the state recorded with it). :func:`final_state` computes that state from
a store holding the history: the experiment and trial lifecycles, the scheduler's cluster state,
the searcher's decisions (re-derived by replaying its methods), the tracker's projections rebuilt
from position 0, and the log checker's findings.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from events.domain import aggregates
from events.domain.check import check_log
from events.domain.types import ExperimentStateChanged, TrialStateChanged
from events.log.envelope import Event, RecordedEvent
from events.log.store import EventStore, row_to_event
from services.scheduler.state import ClusterState
from services.searcher.service import TYPES as SEARCHER_TYPES
from services.searcher.service import SearcherConsumer, _NewTrial, _StopTrial
from services.tracker import projections
from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "golden"
NAMES = ("asha", "crash_resume", "preemption", "kill")
COLUMNS = (
    "position",
    "stream_id",
    "stream_version",
    "event_id",
    "type",
    "schema_version",
    "payload",
    "metadata",
    "recorded_at",
)
EPOCH = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
_HOLDER = re.compile(r"^[^:]+:[0-9]+$")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def log_path(name: str) -> Path:
    """The history's event file."""
    return FIXTURES / f"{name}.jsonl.gz"


def state_path(name: str) -> Path:
    """The history's recorded final state."""
    return FIXTURES / f"{name}.state.json"


def load(name: str) -> list[dict[str, Any]]:
    """The stored rows of history ``name``, in position order."""
    with gzip.open(log_path(name), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def save(name: str, rows: list[dict[str, Any]], state: dict[str, Any]) -> None:
    """Writes history ``name`` and its final state (gzip without a timestamp: same rows, same bytes)."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
    with (
        open(log_path(name), "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f,
    ):
        f.write(text.encode())
    state_path(name).write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")


def normalise(events: list[RecordedEvent], replace: dict[str, str]) -> list[dict[str, Any]]:
    """Rows of ``events`` with what differs between runs made stable, consistently.

    Event ids become sequential uuids (and so do their mentions in payloads and metadata, e.g.
    causation ids), other random uuids (checkpoints) another sequence, in order of first
    mention; ``recorded_at`` is shifted so the first event is at :data:`EPOCH` (the gaps between
    events are kept); each ``replace`` key (a scratch path, a port) becomes its value;
    ``pid``, ``hostname`` and lease ``holder`` (host:pid) values become placeholders. Everything
    else, including the ids the services derive (allocations, request ids, slot ids), is kept.
    """
    ids = {str(e.event_id): f"00000000-0000-4000-8000-{n:012d}" for n, e in enumerate(events, 1)}
    randoms: dict[str, str] = {}
    pids: dict[int, int] = {}
    start = events[0].recorded_at if events else EPOCH

    def text_of(value: Any) -> Any:
        text = json.dumps(value, sort_keys=True)
        for old, new in replace.items():
            text = text.replace(old, new)
        text = _UUID.sub(lambda m: _stable(m.group(0), ids, randoms), text)
        return _placeholders(json.loads(text), pids)

    return [
        {
            "position": e.position,
            "stream_id": e.stream_id,
            "stream_version": e.stream_version,
            "event_id": ids[str(e.event_id)],
            "type": e.type,
            "schema_version": e.schema_version,
            "payload": text_of(e.payload),
            "metadata": text_of(e.metadata.model_dump(exclude_none=True)),
            "recorded_at": (EPOCH + (e.recorded_at - start)).isoformat(),
        }
        for e in events
    ]


def _stable(found: str, ids: dict[str, str], randoms: dict[str, str]) -> str:
    """An event id's placeholder; for any other random (version 4) uuid, e.g. a checkpoint's,
    the next free placeholder of its own series; derived (version 5) uuids stay as they are."""
    if found in ids:
        return ids[found]
    if found[14] != "4":
        return found
    return randoms.setdefault(found, f"00000000-0000-4000-9000-{len(randoms) + 1:012d}")


def _placeholders(value: Any, pids: dict[int, int]) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "pid" and isinstance(item, int):
                out[key] = pids.setdefault(item, 1000 + len(pids))
            elif key == "hostname" and isinstance(item, str):
                out[key] = "golden-host"
            elif key == "holder" and isinstance(item, str) and _HOLDER.match(item):
                out[key] = (
                    f"golden-host:{pids.setdefault(int(item.rpartition(':')[2]), 1000 + len(pids))}"
                )
            else:
                out[key] = _placeholders(item, pids)
        return out
    if isinstance(value, list):
        return [_placeholders(item, pids) for item in value]
    return value


def decoded(rows: Iterable[dict[str, Any]]) -> list[RecordedEvent]:
    """The rows as the store reads them (upcast to today's schema versions)."""
    return [
        row_to_event({**row, "recorded_at": datetime.fromisoformat(row["recorded_at"])})
        for row in rows
    ]


async def insert(store: EventStore, rows: list[dict[str, Any]]) -> None:
    """Puts the rows into ``store``'s (empty) log exactly as recorded, positions included."""
    async with store.transaction() as tx:
        await tx.conn.executemany(
            """INSERT INTO events (position, stream_id, stream_version, event_id, type,
                                   schema_version, payload, metadata, recorded_at)
               OVERRIDING SYSTEM VALUE
               VALUES ($1, $2, $3, $4::uuid, $5, $6, $7::jsonb, $8::jsonb, $9)""",
            [
                (
                    r["position"],
                    r["stream_id"],
                    r["stream_version"],
                    r["event_id"],
                    r["type"],
                    r["schema_version"],
                    json.dumps(r["payload"]),
                    json.dumps(r["metadata"]),
                    datetime.fromisoformat(r["recorded_at"]),
                )
                for r in rows
            ],
        )


def lifecycles(events: list[RecordedEvent]) -> dict[str, Any]:
    """Each experiment's and trial's state as its aggregate's fold has it, with the state changes
    the fold refused (position, state, target)."""
    streams: dict[str, list[RecordedEvent]] = {}
    for e in events:
        streams.setdefault(e.stream_id, []).append(e)
    out: dict[str, Any] = {"experiments": {}, "trials": {}}
    for stream_id, stream in sorted(streams.items()):
        kind, _, ident = stream_id.partition("-")
        if kind not in ("experiment", "trial"):
            continue
        view: aggregates.ExperimentView | aggregates.TrialView
        view = aggregates.ExperimentView(0) if kind == "experiment" else aggregates.TrialView(0)
        refused = []
        for e in stream:
            before = view.state
            if isinstance(view, aggregates.ExperimentView):
                applied = aggregates.apply_experiment(view, e)
            else:
                applied = aggregates.apply_trial(view, e)
            if not applied and e.type in ("ExperimentStateChanged", "TrialStateChanged"):
                refused.append((e.position, before, e.decode_as(_STATE_CHANGE[e.type]).state))
        out[f"{kind}s"][ident] = {"state": view.state, "refused": refused}
    return json.loads(json.dumps(out))


_STATE_CHANGE: dict[str, Any] = {
    "ExperimentStateChanged": ExperimentStateChanged,
    "TrialStateChanged": TrialStateChanged,
}


def cluster_summary(events: list[RecordedEvent]) -> dict[str, Any]:
    """The scheduler's :class:`ClusterState` at the end of the log, summarised."""
    state = ClusterState()
    for e in events:
        state.apply(e)
    return {
        "position": state.position,
        "experiments": {
            str(x.experiment_id): {
                "state": x.state,
                "priority": x.settings.priority,
                "max_restarts": x.settings.max_restarts,
                "trials": list(x.trials),
            }
            for x in state.experiments.values()
        },
        "trials": {
            str(t.trial_id): {
                "state": t.state,
                "restarts": t.restarts,
                "runs": t.run_id,
                "running": t.running,
                "latest_checkpoint": t.resume_from,
                "stop_requested": t.stop_requested,
                "kill_requested": t.kill_requested,
                "early_exit": t.early_exit,
            }
            for t in state.trials.values()
        },
        "agents": {
            a.agent_id: {"lost": a.lost, "slots": len(a.slot_ids)} for a in state.agents.values()
        },
        "allocations": len(state.allocations),
    }


def searcher_decisions(events: list[RecordedEvent]) -> dict[str, Any]:
    """What the searcher's methods decide when fed the log afresh (not what the log says they
    decided: the two are compared by the test), plus each search's end state."""
    consumer = SearcherConsumer(None)  # type: ignore[arg-type]  # apply never reads the store
    decisions: list[dict[str, Any]] = []
    for e in events:
        if e.type not in SEARCHER_TYPES:
            continue
        consumer.apply(e)
        pending, consumer._pending = consumer._pending, []
        for stream_id, item in pending:
            decisions.append(_decision(stream_id, item))
    searches = {
        str(s.experiment_id): {
            "state": s.state,
            "trials": s.trials,
            "trial_of": s.trial_of,
            "closed": sorted(s.closed),
            "shut_down": s.shut_down,
        }
        for s in consumer.searches.values()
    }
    return json.loads(json.dumps({"decisions": decisions, "searches": searches}))


def _decision(stream_id: str, item: Event | _NewTrial | _StopTrial) -> dict[str, Any]:
    if isinstance(item, _NewTrial):
        return {
            "stream": stream_id,
            "create": item.request_id,
            "seq": item.seq,
            "hparams": item.hparams,
            "trial_seed": item.trial_seed,
        }
    if isinstance(item, _StopTrial):
        return {"stream": stream_id, "stop": item.request_id}
    return {"stream": stream_id, "fact": item.event_type, **item.model_dump(mode="json")}


def logged_decisions(events: list[RecordedEvent]) -> list[dict[str, Any]]:
    """The searcher's trial requests and stops as the log records them, in order."""
    out: list[dict[str, Any]] = []
    for e in events:
        p = e.payload
        if e.type == "TrialRequested":
            out.append(
                {
                    "stream": e.stream_id,
                    "create": p["request_id"],
                    "seq": p["seq"],
                    "hparams": p["hparams"],
                    "trial_seed": p["trial_seed"],
                }
            )
        elif e.type == "TrialStopRequested":
            out.append({"stream": e.stream_id, "stop": p["request_id"]})
    return json.loads(json.dumps(out))


_PROJECTED = {
    "tr_experiments": (
        "experiment_id, state, searcher_name, searcher_metric, num_trials, best_trial_id,"
        " best_metric, (ended_at IS NOT NULL) AS ended",
        "experiment_id",
    ),
    "tr_trials": (
        "trial_id, experiment_id, seq, state, hparams, trial_seed, run_id, restarts,"
        " steps_completed, latest_checkpoint, best_metric, latest_validation,"
        " (ended_at IS NOT NULL) AS ended",
        "trial_id",
    ),
    "tr_allocations": (
        "allocation_id, trial_id, run_id, placements, state, outcome, exit_code, agent_id",
        "allocation_id",
    ),
    "tr_checkpoints": (
        "uuid, trial_id, run_id, steps_completed, state, searcher_metric",
        "trial_id, steps_completed, uuid",
    ),
    "tr_metrics": (
        'trial_id, run_id, "group", count(*) AS points, max(steps_completed) AS last_step',
        'trial_id, run_id, "group"',
    ),
    "tr_agents": ("agent_id, resource_pool, state", "agent_id"),
}


async def projection_rows(store: EventStore) -> dict[str, Any]:
    """The tracker's projections rebuilt from position 0: the key columns of every row
    (metrics as a count and last step per trial, run and group)."""
    await projections.rebuild(store)
    out: dict[str, Any] = {}
    async with store.transaction() as tx:
        for table, (columns, order) in _PROJECTED.items():
            group = f" GROUP BY {order}" if table == "tr_metrics" else ""
            rows = await tx.conn.fetch(f"SELECT {columns} FROM {table}{group} ORDER BY {order}")
            out[table] = [_jsonable(dict(r)) for r in rows]
    return out


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v for k, v in row.items()}


async def final_state(store: EventStore) -> dict[str, Any]:
    """The state today's folds give the log in ``store``."""
    events = await store.read_all(limit=1_000_000)
    return {
        "events": len(events),
        "lifecycle": lifecycles(events),
        "scheduler": cluster_summary(events),
        "searcher": searcher_decisions(events),
        "tracker": await projection_rows(store),
        "check_log": [str(f) for f in await check_log(store)],
    }
