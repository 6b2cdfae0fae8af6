"""Changing an experiment after submission: its name, description, labels and resources
(``PATCH``), and continuing it once it has ended.

Only the experiment's owner or an admin may change it. Every change is a fact on the
experiment's stream, decided in a transaction against the stream's version; a field set to the
value it already has records nothing.
"""

from __future__ import annotations

import math
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from events.domain import lifecycle
from events.domain.authorization import Permission
from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.deciders.experiment import (
    MAX_LABELS,
    ChangeSettings,
    ContinueExperiment,
    ContinueState,
    decide_continue,
    decide_settings,
)
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    CheckpointsDeleted,
    CheckpointsDeleteRequested,
)
from events.domain.types.experiment_changes import ResourceField
from events.log.store import Transaction
from services.api.access import check_experiment
from services.api.auth import principal_of
from services.api.decided import accepted, append_decided
from services.api.errors import bad_request, parse, read_json
from services.api.experiment_commands import act_on_experiment, experiment_id_of
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import (
    ExperimentView,
    apply_settings,
    load_experiment,
    load_trial,
    load_trial_control,
    read_facts,
)

log = structlog.get_logger("api")
routes = RouteTable("experiments")

MAX_NAME = 512
"""Longest experiment name, in characters."""
MAX_DESCRIPTION = 10_000
"""Longest experiment description, in characters."""
MAX_LABEL = 255
"""Longest label, in characters."""
MAX_WEIGHT = 1e6
"""Largest fair-share weight."""


def _text(value: str, what: str) -> str:
    if any(ord(c) < 32 and c not in "\t\n" for c in value) or "\x7f" in value:
        raise ValueError(f"{what} must not contain control characters")
    return value


class ResourcesPatch(BaseModel):
    """Scheduling fields to change; a field left out stays as it is, ``max_slots: null`` lifts
    the cap."""

    model_config = {"extra": "forbid"}

    priority: int | None = Field(None, ge=1, le=99, description="1 (first) to 99")
    weight: float | None = Field(None, gt=0, le=MAX_WEIGHT)
    max_slots: int | None = Field(None, ge=0, le=1_000_000)

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class ExperimentPatch(BaseModel):
    """What to change; every field is optional and a field left out stays as it is."""

    model_config = {"extra": "forbid"}

    name: str | None = Field(None, min_length=1, max_length=MAX_NAME)
    description: str | None = Field(None, max_length=MAX_DESCRIPTION)
    labels: list[str] | None = Field(
        None, max_length=MAX_LABELS, description="the whole new set of labels"
    )
    add_labels: list[str] = Field(default_factory=list, max_length=MAX_LABELS)
    remove_labels: list[str] = Field(default_factory=list, max_length=MAX_LABELS)
    resources: ResourcesPatch | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return None if value is None else _text(value, "a name")

    @field_validator("description")
    @classmethod
    def _description(cls, value: str | None) -> str | None:
        return None if value is None else _text(value, "a description")

    @field_validator("labels", "add_labels", "remove_labels")
    @classmethod
    def _labels(cls, value: list[str] | None) -> list[str] | None:
        for label in value or []:
            if not label.strip() or len(label) > MAX_LABEL:
                raise ValueError(f"a label has 1 to {MAX_LABEL} characters, not all blank")
            if any(ord(c) < 32 for c in label) or "\x7f" in label:
                raise ValueError("a label must not contain control characters")
        return value


class PatchResponse(BaseModel):
    """The experiment's settings after the change, and the facts it recorded."""

    id: int
    name: str | None
    description: str | None
    labels: list[str]
    priority: int | None
    weight: float | None
    max_slots: int | None
    changed: list[str]


class ContinueBody(BaseModel):
    """A partial config merged over the experiment's (of a single-trial experiment only
    ``hyperparameters`` constants, ``searcher.max_length`` and ``max_restarts`` may change; of a
    search only ``max_restarts``)."""

    model_config = {"extra": "forbid"}

    config: dict[str, Any] = Field(default_factory=dict)


class ContinueResponse(BaseModel):
    """The continued experiment, the trials that train on (``trial_id``/``latest_checkpoint``:
    the first of them and the checkpoint it resumes from) and each one's checkpoint."""

    id: int
    state: str
    trial_id: int
    latest_checkpoint: str | None
    trial_ids: list[int]
    latest_checkpoints: dict[str, str | None]


@routes.add(
    "PATCH",
    "/api/v1/experiments/{experiment_id}",
    allow=USERS,
    body=ExperimentPatch,
    response=PatchResponse,
)
async def patch_experiment(request: web.Request) -> web.Response:
    """Changes the experiment's name, description, labels or resources (priority, weight,
    max_slots); owner or admin; 409 while it is being deleted."""
    principal = principal_of(request)
    experiment_id = experiment_id_of(request)
    raw = await read_json(request)
    body = parse(ExperimentPatch, raw)
    fields_set = set(body.model_fields_set)
    overlap = set(body.add_labels) & set(body.remove_labels)
    if overlap:
        raise bad_request(
            f"add_labels: {sorted(overlap)[0]!r} is also in remove_labels", path="add_labels"
        )

    resources = body.resources if "resources" in fields_set else None
    command = ChangeSettings(
        actor=principal.name,
        name=body.name,
        description=body.description,
        labels=tuple(body.labels) if body.labels is not None else None,
        add_labels=tuple(body.add_labels),
        remove_labels=tuple(body.remove_labels),
        resources=(
            None
            if resources is None
            else {key: getattr(resources, key) for key in _resource_fields(resources)}
        ),
    )

    after, events = await act_on_experiment(
        request, principal, experiment_id, lambda view: decide_settings(view, command)
    )
    for event in events:
        after.config = apply_settings(after.config, event)
    settings = ExperimentSettings.of(after.config)
    changed = [type(e).event_type for e in events]
    if changed:
        log.info("experiment changed", experiment_id=experiment_id, facts=changed)
    return web.json_response(
        {
            "id": experiment_id,
            "name": settings.name,
            "description": settings.description,
            "labels": list(settings.labels),
            "priority": after.resources.get("priority"),
            "weight": after.resources.get("weight"),
            "max_slots": after.resources.get("max_slots"),
            "changed": changed,
        }
    )


def _resource_fields(patch: ResourcesPatch) -> list[ResourceField]:
    keys: tuple[ResourceField, ...] = ("priority", "weight", "max_slots")
    return [key for key in keys if key in patch.model_fields_set]


# --------------------------------------------------------------------------- continue


async def _deleted_checkpoints(tx: Transaction, experiment_id: int) -> frozenset[str]:
    events, _ = await read_facts(
        tx,
        experiment_stream(experiment_id),
        ("CheckpointsDeleted", "CheckpointsDeleteRequested"),
    )
    gone: set[str] = set()
    for recorded in events:
        fact = recorded.decode()
        if isinstance(fact, CheckpointsDeleted | CheckpointsDeleteRequested):
            gone.update(fact.uuids)
    return frozenset(gone)


@routes.post(
    "/api/v1/experiments/{experiment_id}/continue",
    allow=USERS,
    body=ContinueBody,
    response=ContinueResponse,
)
async def continue_experiment(request: web.Request) -> web.Response:
    """Continues an ended experiment (owner or admin): a single-trial experiment's trial trains
    on from its latest checkpoint, and so does each trial of a search that did not complete
    (its completed trials stay as they are). 409 when it has not ended, is archived, every trial
    completed, its searcher cannot reopen trials (ASHA), or a latest checkpoint was deleted."""
    principal = principal_of(request)
    experiment_id = experiment_id_of(request)
    body = parse(ContinueBody, await read_json(request))

    command = ContinueExperiment(actor=principal.name, config=body.config)

    async def work(tx: Transaction) -> dict[str, Any]:
        view = await load_experiment(tx, experiment_id, with_trials=True)
        await check_experiment(tx, principal, view, Permission.UPDATE_EXPERIMENT)
        state = await _continue_state(tx, view)
        continuation = accepted(decide_continue(state, command))
        await append_decided(
            tx,
            experiment_stream(experiment_id),
            continuation.experiment,
            expected_version=view.version,
            actor=principal.name,
        )
        for trial_id, events in continuation.trials.items():
            await append_decided(
                tx,
                trial_stream(trial_id),
                events,
                expected_version=state.trials[trial_id].version,
                actor=principal.name,
            )
        chosen = list(continuation.trials)
        return {
            "id": experiment_id,
            "state": lifecycle.ACTIVE,
            "trial_id": chosen[0],
            "latest_checkpoint": continuation.latest_checkpoints[chosen[0]],
            "trial_ids": chosen,
            "latest_checkpoints": {
                str(t): latest for t, latest in continuation.latest_checkpoints.items()
            },
        }

    result = await in_transaction(store_of(request), work)
    log.info("experiment continued", experiment_id=experiment_id, trials=result["trial_ids"])
    return web.json_response(result)


async def _continue_state(tx: Transaction, view: ExperimentView) -> ContinueState:
    """What continuing ``view`` decides over: every trial's state, the folded stream of each
    trial that has ended, and the experiment's deleted checkpoints (read only once the
    experiment itself could be continued)."""
    if view.state not in lifecycle.TERMINAL or view.archived:
        return ContinueState(experiment=view, trial_states={}, trials={})
    states = {t: (await load_trial_control(tx, t)).state for t in sorted(view.trials)}
    if any(state not in lifecycle.TERMINAL for state in states.values()):
        return ContinueState(experiment=view, trial_states=states, trials={})
    trials = {t: await load_trial(tx, t) for t in states}
    gone = await _deleted_checkpoints(tx, view.experiment_id)
    return ContinueState(
        experiment=view, trial_states=states, trials=trials, deleted_checkpoints=gone
    )
