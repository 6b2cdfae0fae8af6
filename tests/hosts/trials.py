"""Tiny trials for the hosts test bed and questions about where they ran."""

from __future__ import annotations

import copy
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from events.domain import names
from events.log.store import EventStore
from tests.e2e.harness import events_of
from tests.helpers import ROOT

SCRIPTED = ROOT / "examples" / "scripted"
DIGITS = ROOT / "examples" / "digits"
T = TypeVar("T")


def scripted(checkpoints: Path, **hparams: Any) -> dict[str, Any]:
    """The scripted example (no ML) with ``hparams``, its checkpoints under ``checkpoints``."""
    config = copy.deepcopy(yaml.safe_load((SCRIPTED / "config.yaml").read_text()))
    config["hyperparameters"].update(hparams)
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(checkpoints)}
    config["reproducibility"] = {"experiment_seed": 7}
    return config


async def placements(store: EventStore, trial_id: int) -> list[list[str]]:
    """The agents of each allocation of ``trial_id``, in log order."""
    stream = await store.read_stream(names.trial_stream(trial_id))
    return [sorted(e.payload["placements"]) for e in stream if e.type == "SlotsAllocated"]


async def agents_that_started_runs(store: EventStore) -> set[str]:
    """Every agent that reported a run started (``TrialStarted``)."""
    return {e.payload["agent_id"] for e in await events_of(store, "TrialStarted")}


async def run_output(store: EventStore, trial_id: int, tail: int = 40) -> str:
    """The last ``tail`` lines of output of each run of ``trial_id``, after the lines that
    name an error or a signal (for failure messages)."""
    rows = await store.fetch(
        "SELECT allocation_id, line FROM task_logs WHERE trial_id = $1 ORDER BY id", trial_id
    )
    runs: dict[str, list[str]] = {}
    for row in rows:
        runs.setdefault(row["allocation_id"], []).append(row["line"])
    marked = ("rror", "xception", "terminate", "ignal", "gloo", "Gloo")
    return "\n".join(
        f"== {allocation}\n"
        + "\n".join([line for line in lines[:-tail] if any(m in line for m in marked)][-60:])
        + "\n...\n"
        + "\n".join(lines[-tail:])
        for allocation, lines in runs.items()
    )


async def explained(check: Awaitable[T], store: EventStore, trial_id: int) -> T:
    """Awaits ``check``; an assertion it fails carries the output of the trial's runs."""
    try:
        return await check
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await run_output(store, trial_id)}") from None
