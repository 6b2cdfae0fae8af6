"""Ids and stream names of experiments, trials, allocations, tasks and models: one function
for each.

Trial ids are integers, unique across the whole cluster (as Determined's): the searcher takes
each from the PostgreSQL sequence ``trial_ids`` when it decides ``TrialRequested``, so they
start at 1 and are never negative. A trial's stream is ``trial-<id>`` and its run ``r`` runs
as allocation ``<id>.<r>``.

Logs written before trial ids were integers named trials ``"<experiment>.<n>"`` (the n-th trial
of an experiment). Upcasters turn such a *legacy* id into the negative integer
``-(experiment * LEGACY_SCALE + n)`` (``"9.1"`` -> ``-9000001``), a range the sequence never
reaches, and every name of a legacy trial stays what it was: stream ``trial-9.1``, allocations
``9.1.<r>``, token subject ``9.1``. A log written before the change thus keeps folding into the
same trials, and nothing stored is renamed. Legacy ordinals are below ``LEGACY_SCALE``.
"""

from __future__ import annotations

import re

LEGACY_SCALE = 1_000_000
"""Multiplier of a legacy id's experiment part; its ordinal is below it."""

MAX_TRIAL_ID = 2**63 - 1
"""Largest trial id a ``bigint`` holds; larger ids are simply unknown."""

TRIAL_PREFIX = "trial-"
EXPERIMENT_PREFIX = "experiment-"
AGENT_PREFIX = "agent-"

_INT = re.compile(r"^-?[0-9]{1,19}$", re.ASCII)
_LEGACY = re.compile(r"^([0-9]{1,13})\.([0-9]{1,6})$", re.ASCII)
_ALLOCATION = re.compile(r"^(-?[0-9]{1,19}|[0-9]{1,13}\.[0-9]{1,6})\.([0-9]{1,9})$", re.ASCII)


class TrialIdError(ValueError):
    """A text is not a trial or allocation id."""


def legacy_trial_id(experiment_id: int, ordinal: int) -> int:
    """The integer id of legacy trial ``"<experiment_id>.<ordinal>"``.

    Raises:
        TrialIdError: ``ordinal`` is not in ``[1, LEGACY_SCALE)`` or ``experiment_id`` < 1.
    """
    if experiment_id < 1 or not 1 <= ordinal < LEGACY_SCALE:
        raise TrialIdError(f"legacy trial {experiment_id}.{ordinal} is out of range")
    return -(experiment_id * LEGACY_SCALE + ordinal)


def legacy_parts(trial_id: int) -> tuple[int, int] | None:
    """``(experiment_id, ordinal)`` of a legacy trial id; ``None`` for an id from the sequence."""
    if trial_id >= 0:
        return None
    experiment_id, ordinal = divmod(-trial_id, LEGACY_SCALE)
    return experiment_id, ordinal


def trial_label(trial_id: int) -> str:
    """The text a trial is named by in stream names, allocation ids and tokens.

    ``"17"`` for trial 17; ``"9.1"`` for the legacy trial ``-9000001``. It is also what
    ``payload->>'trial_id'`` reads in SQL over raw stored payloads, which no upcaster has seen
    (a legacy trial's ids were only ever stored in the old form).
    """
    parts = legacy_parts(trial_id)
    return str(trial_id) if parts is None else f"{parts[0]}.{parts[1]}"


def parse_trial_id(text: str) -> int:
    """Reads a trial id a user or a stored payload wrote: ``"17"``, ``"-9000001"`` or ``"9.1"``.

    Raises:
        TrialIdError: ``text`` is none of those forms, or out of range.
    """
    raw = text.strip()
    if _INT.match(raw):
        value = int(raw)
        if abs(value) > MAX_TRIAL_ID or value == 0:
            raise TrialIdError(f"trial id {text!r} is out of range")
        return value
    legacy = _LEGACY.match(raw)
    if legacy:
        return legacy_trial_id(int(legacy.group(1)), int(legacy.group(2)))
    raise TrialIdError(f"{text[:40]!r} is not a trial id (trial ids are integers, e.g. 17)")


def coerce_trial_id(value: object) -> int:
    """A stored ``trial_id`` value as an integer: an int as is, a legacy ``"E.N"`` mapped.

    Raises:
        TrialIdError: the value is neither.
    """
    if isinstance(value, bool):
        raise TrialIdError(f"{value!r} is not a trial id")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        return parse_trial_id(value)
    raise TrialIdError(f"{value!r} is not a trial id")


def trial_stream(trial_id: int) -> str:
    """The stream of a trial: ``trial-17`` (legacy ``trial-9.1``)."""
    return f"{TRIAL_PREFIX}{trial_label(trial_id)}"


def trial_of_stream(stream_id: str) -> int | None:
    """The trial whose stream ``stream_id`` is; ``None`` for any other stream."""
    if not stream_id.startswith(TRIAL_PREFIX):
        return None
    try:
        return parse_trial_id(stream_id[len(TRIAL_PREFIX) :])
    except TrialIdError:
        return None


def experiment_stream(experiment_id: int) -> str:
    """The stream of an experiment: ``experiment-7``."""
    return f"{EXPERIMENT_PREFIX}{experiment_id}"


SLURM_PREFIX = "slurm-"


def slurm_stream(allocation_id: str) -> str:
    """The stream of a Slurm pool's allocation: ``slurm-17.1``, ``slurm-task-<id>.1``."""
    return f"{SLURM_PREFIX}{allocation_id}"


def agent_stream(agent_id: str) -> str:
    """The stream of an agent: ``agent-gpu03``."""
    return f"{AGENT_PREFIX}{agent_id}"


def experiment_of_stream(stream_id: str) -> int | None:
    """The experiment whose stream ``stream_id`` is; ``None`` for any other stream."""
    if not stream_id.startswith(EXPERIMENT_PREFIX):
        return None
    text = stream_id[len(EXPERIMENT_PREFIX) :]
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def agent_of_stream(stream_id: str) -> str | None:
    """The agent whose stream ``stream_id`` is; ``None`` for any other stream."""
    if not stream_id.startswith(AGENT_PREFIX):
        return None
    return stream_id[len(AGENT_PREFIX) :] or None


def allocation_id(trial_id: int, run_id: int) -> str:
    """The allocation of a trial's run ``run_id``: ``17.1`` (legacy ``9.1.1``)."""
    return f"{trial_label(trial_id)}.{run_id}"


def parse_allocation_id(text: str) -> tuple[int, int]:
    """``(trial_id, run_id)`` of an allocation id made by :func:`allocation_id`.

    Raises:
        TrialIdError: ``text`` is not such an id.
    """
    match = _ALLOCATION.match(text)
    if match is None:
        raise TrialIdError(f"{text[:40]!r} is not an allocation id (allocation ids look like 17.1)")
    return parse_trial_id(match.group(1)), int(match.group(2))


def sql_trial_id(column: str) -> str:
    """SQL turning text column ``column`` (``"17"`` or legacy ``"9.1"``) into the integer trial
    id, as :func:`coerce_trial_id` does: for migrating tables that stored trial ids as text."""
    return (
        f"(CASE WHEN {column} LIKE '%.%' THEN -(split_part({column}, '.', 1)::bigint"
        f" * {LEGACY_SCALE} + split_part({column}, '.', 2)::bigint) ELSE {column}::bigint END)"
    )


TASK_PREFIX = "task-"
_TASK_ID = re.compile(r"^[0-9a-f]{8,32}$", re.ASCII)
_TASK_ALLOCATION = re.compile(r"^task-([0-9a-f]{8,32})\.([0-9]{1,9})$", re.ASCII)


def is_task_id(text: str) -> bool:
    """Whether ``text`` is a task id (8 to 32 lowercase hex digits, made by the API)."""
    return _TASK_ID.match(text) is not None


def task_stream(task_id: str) -> str:
    """The stream of a task (``task-<id>``)."""
    return f"{TASK_PREFIX}{task_id}"


def task_of_stream(stream_id: str) -> str | None:
    """The task id of a task stream, or ``None`` for any other stream."""
    if not stream_id.startswith(TASK_PREFIX):
        return None
    text = stream_id[len(TASK_PREFIX) :]
    return text if is_task_id(text) else None


def task_allocation_id(task_id: str, run_id: int = 1) -> str:
    """The allocation of a task's run: ``task-<id>.<run>`` (never parsed as a trial's)."""
    return f"{TASK_PREFIX}{task_id}.{run_id}"


def task_of_allocation(text: str) -> str | None:
    """The task id of a task's allocation id, or ``None`` when ``text`` is not one."""
    match = _TASK_ALLOCATION.match(text)
    return match.group(1) if match is not None else None


MODEL_PREFIX = "model-"
"""The streams of registered models: ``model-<model_id>`` (a name may hold any character a
stream id or bus subject may not, so the stream is named by the model's number)."""


def model_stream(model_id: int) -> str:
    """The stream of a registered model: ``model-3``."""
    return f"{MODEL_PREFIX}{model_id}"


def model_of_stream(stream_id: str) -> int | None:
    """The model whose stream ``stream_id`` is; ``None`` for any other stream."""
    if not stream_id.startswith(MODEL_PREFIX):
        return None
    tail = stream_id[len(MODEL_PREFIX) :]
    return int(tail) if tail.isascii() and tail.isdigit() and len(tail) <= 18 else None
