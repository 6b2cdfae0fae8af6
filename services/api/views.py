"""Read side of the gateway: fold experiment, trial and agent streams to answer queries.

The folds are pure (events in, state out). Loaders take the store (a plain read) or a
:class:`~events.log.store.Transaction` (to decide and append in one transaction). They read only the
event types their fold uses (a long trial's many ``WorkloadCompleted`` are never decoded), and
the stream's head version in the same statement, so an append with ``expected_version`` equal to
the view's version fails if anything at all was appended since.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from events.domain.aggregates import (
    AGENT_FACTS,
    EXPERIMENT_FACTS,
    TRIAL_FACTS,
    AgentView,
    AllocationView,
    ExperimentView,
    SettingsChange,
    TrialView,
    apply_settings,
    apply_trial,
    fold_agent,
    fold_experiment,
    fold_trial,
    iso,
)
from events.domain.names import (
    TrialIdError,
    agent_stream,
    experiment_stream,
    parse_allocation_id,
    parse_trial_id,
    trial_label,
    trial_stream,
)
from events.domain.types import TrialRequested
from events.log.envelope import RecordedEvent
from events.log.store import EventStore, Transaction
from services.api.errors import not_found
from services.contracts.agent import SpecResponse

MAX_ID = 2**63 - 1
"""Largest id a ``bigint`` column holds; larger ids in a path are simply unknown (404)."""


Reader = EventStore | Transaction

__all__ = [
    "AGENT_FACTS",
    "EXPERIMENT_FACTS",
    "TRIAL_FACTS",
    "AgentView",
    "AllocationView",
    "ExperimentView",
    "SettingsChange",
    "TrialView",
    "agent_stream",
    "apply_settings",
    "apply_trial",
    "fold_agent",
    "fold_experiment",
    "fold_trial",
    "iso",
]

TRIAL_CONTROL_FACTS = ("TrialStateChanged", "TrialKillRequested")


async def read_facts(
    reader: Reader,
    stream_id: str,
    types: Sequence[str],
    *,
    after_version: int = 0,
    trial_id: int | None = None,
    at: int | None = None,
) -> tuple[list[RecordedEvent], int]:
    """Reads one stream's events of ``types`` after ``after_version``, and its head version.

    Args:
        reader: the store or a transaction.
        stream_id: the stream.
        types: event types wanted.
        after_version: read only events above this version.
        trial_id: when set, ``TrialRequested`` events of other trials are skipped.
        at: when set, the stream as it was at this log position (events and head up to it).

    Returns:
        The events in version order and the stream's current version (0: no such stream).
    """
    return await reader.read_stream_facts(
        stream_id,
        types,
        after_version=after_version,
        requested_trial=None if trial_id is None else trial_label(trial_id),
        at=at,
    )


# --- ids ------------------------------------------------------------------------------------


def trial_id_of(text: str) -> int:
    """The trial id a path names (``17``; a legacy trial also as ``9.1``); else a 404."""
    try:
        return parse_trial_id(text)
    except TrialIdError as exc:
        raise not_found(f"no trial {text[:40]!r}: {exc}") from None


def trial_of(allocation: str) -> int:
    """The trial of an allocation id (``17.2`` -> 17); an invalid id is a 404."""
    try:
        return parse_allocation_id(allocation)[0]
    except TrialIdError as exc:
        raise not_found(f"no allocation {allocation[:40]!r}: {exc}") from None


async def experiment_of(reader: Reader, trial_id: int) -> int:
    """The experiment that requested ``trial_id``; a trial never requested is a 404."""
    # The stored id's text is the trial's label (events.domain.names), which the index holds.
    request = await reader.trial_request(trial_label(trial_id))
    if request is None:
        raise not_found(f"no trial {trial_id}")
    return request.decode_as(TrialRequested).experiment_id


# --- experiment -----------------------------------------------------------------------------


async def load_experiment(
    reader: Reader,
    experiment_id: int,
    *,
    trial_id: int | None = None,
    with_trials: bool = True,
    at: int | None = None,
) -> ExperimentView:
    """Loads an experiment; a missing one is a 404.

    Args:
        reader: the store or a transaction.
        experiment_id: the experiment.
        trial_id: keep only this trial's ``TrialRequested``.
        with_trials: ``False`` skips every ``TrialRequested`` (state and config only).
        at: the experiment as it was at this log position (404 if not submitted by then).
    """
    types = EXPERIMENT_FACTS if with_trials else EXPERIMENT_FACTS[:-1]
    events, head = await read_facts(
        reader, experiment_stream(experiment_id), types, trial_id=trial_id, at=at
    )
    view = fold_experiment(experiment_id, events)
    view.version = head
    if not view.exists:
        when = "" if at is None else f" at position {at}"
        raise not_found(f"no experiment {experiment_id}{when}")
    return view


# --- trial ----------------------------------------------------------------------------------


async def load_trial(reader: Reader, trial_id: int) -> TrialView:
    """Loads a trial; one with no events yet is a 404."""
    events, head = await read_facts(reader, trial_stream(trial_id), TRIAL_FACTS)
    view = fold_trial(trial_id, events)
    view.version = head
    if view.version == 0:
        raise not_found(f"no trial {trial_id}")
    return view


def allocation_of(trial: TrialView, allocation_id: str) -> AllocationView:
    """The trial's allocation ``allocation_id``, or a 404 when the scheduler never made it."""
    alloc = trial.allocations.get(allocation_id)
    if alloc is None:
        raise not_found(f"no allocation {allocation_id}")
    return alloc


async def refresh_trial(reader: Reader, view: TrialView) -> None:
    """Applies what was appended to the trial since ``view`` was loaded."""
    events, head = await read_facts(
        reader, trial_stream(view.trial_id), TRIAL_FACTS, after_version=view.version
    )
    for recorded in events:
        apply_trial(view, recorded)
    view.version = max(view.version, head)


async def load_trial_control(reader: Reader, trial_id: int) -> TrialView:
    """Loads a trial's lifecycle state and pending kill (the trial fold of those facts only)."""
    events, head = await read_facts(reader, trial_stream(trial_id), TRIAL_CONTROL_FACTS)
    view = fold_trial(trial_id, events)
    view.version = head
    return view


# --- agent ----------------------------------------------------------------------------------


async def load_agent(reader: Reader, agent_id: str) -> AgentView:
    """Loads an agent (an unknown agent folds to an unregistered view)."""
    events, head = await read_facts(reader, agent_stream(agent_id), AGENT_FACTS)
    view = fold_agent(agent_id, events)
    view.version = head
    return view


# --- allocation spec ------------------------------------------------------------------------


def environment_variables(config: dict[str, Any], device: str) -> dict[str, str]:
    """``environment.environment_variables`` as a dict, picking ``device``'s list from a map."""
    env = (config.get("environment") or {}).get("environment_variables") or []
    if isinstance(env, dict):
        env = env.get(device) or []
    out: dict[str, str] = {}
    for item in env:
        key, _, value = str(item).partition("=")
        out[key] = value
    return out


def build_spec(
    experiment: ExperimentView,
    trial: TrialView,
    allocation_id: str,
    *,
    agent_id: str | None,
    device: str,
    token: str,
    cluster_id: str = "",
    agent_user_group: dict[str, Any] | None = None,
) -> SpecResponse:
    """What an agent needs to launch one run (``GET /allocations/{id}/spec``).

    ``user`` is the experiment's owner and ``cluster_id`` the cluster's id: the agent hands both
    to the trial process (``det.get_cluster_info().user`` / ``.cluster_id``). The answer names
    ``agent_user_group`` only when one is given (the owner's unix identity).
    """
    alloc = allocation_of(trial, allocation_id)
    requested = experiment.trials.get(trial.trial_id)
    if requested is None:
        raise not_found(f"trial {trial.trial_id} was never requested")
    if agent_id is not None and agent_id in alloc.placements:
        slot_ids = list(alloc.placements[agent_id])
    else:
        slot_ids = [s for slots in alloc.placements.values() for s in slots]
    checkpoint = trial.latest_checkpoint
    # A cloned trial's first run starts from its parent's checkpoint, recorded when it was
    # requested; once it saves its own, that one is the latest.
    latest = checkpoint.uuid if checkpoint else requested.warm_start_checkpoint
    steps = checkpoint.steps_completed if checkpoint else requested.warm_start_steps
    if latest is None:
        steps = 0
    config = experiment.config
    identity = {} if agent_user_group is None else {"agent_user_group": agent_user_group}
    fields: dict[str, Any] = {
        "active": trial.is_current(allocation_id),
        "allocation_id": allocation_id,
        "trial_id": trial.trial_id,
        "experiment_id": experiment.experiment_id,
        "run_id": alloc.run_id,
        "entrypoint": config.get("entrypoint"),
        "code_ref": experiment.code_ref,
        "hparams": requested.hparams,
        "trial_seed": requested.trial_seed,
        "latest_checkpoint": latest,
        "steps_completed": steps,
        "token": token,
        "checkpoint_storage": config.get("checkpoint_storage"),
        "environment_variables": environment_variables(config, device),
        "slot_ids": slot_ids,
        "placements": alloc.placements,
        "config": config,
        "user": experiment.owner,
        "cluster_id": cluster_id,
        **identity,
    }
    return SpecResponse.model_validate(fields)
