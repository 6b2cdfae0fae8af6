"""``python -m bench scale``: the synthetic year of a lab's log is a log cairn could have
written, and the long benchmark stays out of the default run."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from bench.__main__ import OPT_IN, default_names
from bench._scale_log import COLUMNS, TRIALS_PER_EXPERIMENT, Plan, generate
from bench.scale import slow_statements
from events.domain.check import LogChecker
from events.log.reads import row_to_event

END = datetime(2026, 11, 1, tzinfo=UTC)


def _log(events: int) -> list[dict[str, Any]]:
    rows = [
        dict(zip(COLUMNS, row, strict=True))
        for chunk in generate(Plan.for_events(events), end=END)
        for row in chunk
    ]
    for position, row in enumerate(rows, start=1):
        row["position"] = position
        row["payload"] = json.loads(str(row["payload"]))
        row["metadata"] = json.loads(str(row["metadata"]))
    return rows


def test_the_generated_log_breaks_no_invariant_of_a_log() -> None:
    """Every generated event decodes into its current model and the log checker (ids, stream
    versions, slots, lifecycles, checkpoints) finds nothing wrong."""
    checker = LogChecker()
    for row in _log(12_000):
        event = row_to_event(row)
        event.decode()
        checker.feed(event)
    assert checker.findings == []


def test_the_log_has_the_lab_s_shape_and_spans_a_year_in_order() -> None:
    """About the events asked for, 10 trials an experiment, metrics the bulk of it, tasks and
    audit present, and recorded_at rising over the year before the end."""
    plan = Plan.for_events(12_000)
    rows = _log(12_000)
    types = Counter(str(r["type"]) for r in rows)
    assert 0.8 * plan.events < len(rows) < 1.2 * plan.events
    assert types["ExperimentSubmitted"] == plan.experiments
    assert types["TrialRequested"] == plan.experiments * TRIALS_PER_EXPERIMENT
    assert types["WorkloadCompleted"] > len(rows) / 2
    assert types["TaskRequested"] > 0 and types["RequestRejected"] == plan.experiments
    stamps = [r["recorded_at"] for r in rows]
    assert stamps == sorted(stamps)
    assert (END - stamps[0]).days == 365 and stamps[-1] <= END


def test_scale_runs_only_when_named() -> None:
    """The default run leaves out the opt-in benchmarks; naming one runs it."""
    available = ["event_store", "trials", "scale", "search"]
    assert "scale" in OPT_IN
    assert default_names(available, []) == ["event_store", "trials", "search"]
    assert default_names(available, ["scale"]) == ["scale"]


def test_slow_statements_are_grouped_from_the_server_log() -> None:
    """Logged slow statements are grouped by text, with their count, mean and parameters."""
    log = "\n".join(
        [
            "2026-11-27 23:00:00.000 UTC [1] LOG:  duration: 120.5 ms  execute __a1: SELECT x",
            "\tFROM t WHERE a = $1",
            "2026-11-27 23:00:00.000 UTC [1] DETAIL:  Parameters: $1 = '7'",
            "2026-11-27 23:00:01.000 UTC [1] LOG:  duration: 79.5 ms  execute __a1: SELECT x",
            "\tFROM t WHERE a = $1",
            "2026-11-27 23:00:01.000 UTC [1] DETAIL:  Parameters: $1 = '8'",
            "2026-11-27 23:00:02.000 UTC [1] LOG:  duration: 30.0 ms  statement: SELECT 1",
        ]
    )
    first, second = slow_statements(log)
    assert first["query"] == "SELECT x FROM t WHERE a = $1"
    assert (first["count"], first["mean_ms"], first["max_ms"]) == (2, 100.0, 120.5)
    assert first["parameters"] == {"1": "'7'"}
    assert second["query"] == "SELECT 1" and second["parameters"] is None
