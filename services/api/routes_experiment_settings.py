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
from events.domain.config import ConfigError, parse_config
from events.domain.config.merge import changed_paths, merge_under
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    CheckpointsDeleted,
    CheckpointsDeleteRequested,
    ContinuedTrial,
    ExperimentContinued,
    ExperimentDescribed,
    ExperimentLabelsChanged,
    ExperimentRenamed,
    ExperimentResourcesChanged,
    TrialStateChanged,
)
from events.domain.types.experiment_changes import ResourceField
from events.log.envelope import new
from events.log.store import Transaction
from services.api.auth import Principal, principal_of
from services.api.errors import ApiError, bad_request, conflict, not_found, parse, read_json
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, store_of
from services.api.views import (
    MAX_ID,
    ExperimentView,
    SettingsChange,
    apply_settings,
    check_owner,
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
MAX_LABELS = 100
"""Most labels one experiment carries."""
MAX_WEIGHT = 1e6
"""Largest fair-share weight."""

CONTINUABLE = ("hyperparameters", "searcher.max_length", "max_restarts")
"""The config paths continuing a single-trial experiment may change: how long and how its trial
trains on, never what is searched, where checkpoints live or how the experiment competes for
slots."""
CONTINUABLE_SEARCH = ("max_restarts",)
"""The config paths continuing a search may change: its trials keep the hyperparameters and
length the searcher gave them."""
REOPENING_SEARCHERS = frozenset({"single", "random", "grid", "tpe"})
"""Searchers that can take a closed trial back (ASHA's decisions to stop trials are final)."""
UNCHANGEABLE = lifecycle.DELETION


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


def experiment_id_of(request: web.Request) -> int:
    """The experiment id of the path (an id that cannot exist is a 404)."""
    raw = request.match_info["experiment_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise not_found(f"no experiment {raw!r}")
    return int(raw)


async def changeable(tx: Transaction, principal: Principal, experiment_id: int) -> ExperimentView:
    """The experiment, if ``principal`` may change it (404 unknown, 403 not theirs, 409 being
    deleted)."""
    view = await load_experiment(tx, experiment_id, with_trials=False)
    check_owner(principal, view.owner)
    if view.state in UNCHANGEABLE:
        raise conflict(f"experiment {experiment_id} is {view.state}; it cannot be changed")
    return view


def _labels_after(current: list[str], body: ExperimentPatch) -> list[str]:
    labels = list(body.labels) if body.labels is not None else list(current)
    for label in body.add_labels:
        if label not in labels:
            labels.append(label)
    labels = [label for label in labels if label not in set(body.remove_labels)]
    labels = list(dict.fromkeys(labels))
    if len(labels) > MAX_LABELS:
        raise bad_request(f"labels: at most {MAX_LABELS} labels", path="labels")
    return labels


def _settings_events(
    view: ExperimentView, body: ExperimentPatch, fields_set: set[str], actor: str
) -> list[SettingsChange]:
    exp_id = view.experiment_id
    events: list[SettingsChange] = []
    if body.name is not None and body.name != view.config.get("name"):
        events.append(ExperimentRenamed(experiment_id=exp_id, name=body.name, actor=actor))
    if body.description is not None and body.description != (view.config.get("description")):
        events.append(
            ExperimentDescribed(experiment_id=exp_id, description=body.description, actor=actor)
        )
    current = [str(x) for x in view.config.get("labels") or []]
    if body.labels is not None or body.add_labels or body.remove_labels:
        labels = _labels_after(current, body)
        if labels != current:
            events.append(
                ExperimentLabelsChanged(
                    experiment_id=exp_id,
                    labels=labels,
                    added=[x for x in labels if x not in current],
                    removed=[x for x in current if x not in labels],
                    actor=actor,
                )
            )
    if body.resources is not None and "resources" in fields_set:
        events.extend(_resources_events(view, body.resources, actor))
    return events


def _resources_events(
    view: ExperimentView, patch: ResourcesPatch, actor: str
) -> list[SettingsChange]:
    given = patch.model_fields_set
    if "priority" in given and patch.priority is None:
        raise bad_request("resources.priority: must be 1 to 99", path="resources.priority")
    if "weight" in given and patch.weight is None:
        raise bad_request("resources.weight: must be a positive number", path="resources.weight")
    current = view.resources
    slots_per_trial = int(current.get("slots_per_trial") or 1)
    if patch.max_slots is not None and patch.max_slots < slots_per_trial:
        raise bad_request(
            f"resources.max_slots: must be >= slots_per_trial ({slots_per_trial}), "
            f"got {patch.max_slots}",
            path="resources.max_slots",
        )
    changes: dict[ResourceField, int | float | None] = {}
    keys: tuple[ResourceField, ...] = ("priority", "weight", "max_slots")
    for key in keys:
        if key in given and getattr(patch, key) != current.get(key):
            changes[key] = getattr(patch, key)
    if not changes:
        return []
    return [
        ExperimentResourcesChanged(
            experiment_id=view.experiment_id,
            resources=changes,
            actor=actor,
        )
    ]


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

    async def decide(tx: Transaction) -> dict[str, Any]:
        view = await changeable(tx, principal, experiment_id)
        events = _settings_events(view, body, fields_set, principal.name)
        if events:
            await tx.append(
                experiment_stream(experiment_id),
                [new(e, actor=principal.name) for e in events],
                expected_version=view.version,
            )
        after = view
        for event in events:
            after.config = apply_settings(after.config, event)
        labels = after.config.get("labels")
        return {
            "id": experiment_id,
            "name": after.config.get("name"),
            "description": after.config.get("description"),
            "labels": list(labels) if isinstance(labels, list) else [],
            "priority": after.resources.get("priority"),
            "weight": after.resources.get("weight"),
            "max_slots": after.resources.get("max_slots"),
            "changed": [type(e).event_type for e in events],
        }

    result = await in_transaction(store_of(request), decide)
    if result["changed"]:
        log.info("experiment changed", experiment_id=experiment_id, facts=result["changed"])
    return web.json_response(result)


# --------------------------------------------------------------------------- continue


def _continued_config(
    view: ExperimentView, partial: dict[str, Any], continuable: tuple[str, ...]
) -> dict[str, Any]:
    """The config merged with ``partial``, validated; 400 naming a path it may not change."""
    merged = merge_under(view.config, partial)
    try:
        config = parse_config(merged).model_dump(mode="json")
    except ConfigError as exc:
        errors = exc.errors or [("<config>", "invalid config")]
        path, message = errors[0]
        raise ApiError(400, f"invalid config: {path}: {message}", path=f"config.{path}") from None
    for path in changed_paths(view.config, config):
        if not any(path == p or path.startswith(f"{p}.") for p in continuable):
            what = "a single-trial experiment" if continuable == CONTINUABLE else "a search"
            raise bad_request(
                f"config.{path}: cannot be changed when continuing {what} (only "
                f"{', '.join(continuable)} can)",
                path=f"config.{path}",
            )
    return config


def _continued_hparams(
    before: dict[str, Any], after: dict[str, Any], hparams: dict[str, Any]
) -> dict[str, Any]:
    """The trial's hparams with the constants the new config changed."""
    out = dict(hparams)
    old_hps, new_hps = before.get("hyperparameters") or {}, after.get("hyperparameters") or {}
    for name in sorted(set(old_hps) | set(new_hps)):
        if old_hps.get(name) == new_hps.get(name):
            continue
        value = new_hps.get(name)
        if not (isinstance(value, dict) and value.get("type") == "const"):
            raise bad_request(
                f"config.hyperparameters.{name}: only a constant value can be set when "
                "continuing a trial",
                path=f"config.hyperparameters.{name}",
            )
        out[name] = value.get("val")
    return out


async def _deleted_checkpoints(tx: Transaction, experiment_id: int) -> set[str]:
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
    return gone


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

    async def decide(tx: Transaction) -> dict[str, Any]:
        view = await load_experiment(tx, experiment_id, with_trials=True)
        check_owner(principal, view.owner)
        if view.state not in lifecycle.TERMINAL:
            raise conflict(
                f"experiment {experiment_id} is {view.state}; only an ended experiment "
                "(COMPLETED, CANCELED, ERROR) can be continued"
            )
        if view.archived:
            raise conflict(f"experiment {experiment_id} is archived; unarchive it first")
        searcher = str(view.searcher.get("name"))
        if searcher not in REOPENING_SEARCHERS:
            raise conflict(
                f"experiment {experiment_id} ran a {searcher!r} search, whose decisions to stop "
                f"trials are final; only {', '.join(sorted(REOPENING_SEARCHERS))} experiments "
                "can be continued (submit a new experiment instead)"
            )
        single = searcher == "single" and len(view.trials) == 1
        states: dict[int, str] = {}
        for trial_id in sorted(view.trials):
            control = await load_trial_control(tx, trial_id)
            if not control.terminal:
                raise conflict(f"trial {trial_id} is {control.state}; it has not ended")
            states[trial_id] = control.state
        chosen = [t for t, state in states.items() if single or state != lifecycle.COMPLETED]
        if not chosen:
            raise conflict(
                f"every trial of experiment {experiment_id} completed; there is nothing to continue"
            )
        gone = await _deleted_checkpoints(tx, experiment_id)
        trials = {}
        for trial_id in chosen:
            trial = await load_trial(tx, trial_id)
            latest = trial.latest_checkpoint.uuid if trial.latest_checkpoint else None
            if latest is not None and latest in gone:
                raise conflict(
                    f"trial {trial_id}'s latest checkpoint {latest} was deleted; "
                    "it cannot be continued from it"
                )
            trials[trial_id] = (trial, latest)
        config = _continued_config(view, body.config, CONTINUABLE if single else CONTINUABLE_SEARCH)
        continued = ExperimentContinued(
            experiment_id=experiment_id,
            trials=[
                ContinuedTrial(
                    trial_id=trial_id,
                    hparams=_continued_hparams(view.config, config, view.trials[trial_id].hparams),
                )
                for trial_id in chosen
            ],
            config=config,
            actor=principal.name,
        )
        await tx.append(
            experiment_stream(experiment_id),
            [new(continued, actor=principal.name)],
            expected_version=view.version,
        )
        for trial_id, (trial, _) in trials.items():
            reopened = TrialStateChanged(
                trial_id=trial_id, state=lifecycle.ACTIVE, reason="continued by user"
            )
            await tx.append(
                trial_stream(trial_id),
                [new(reopened, actor=principal.name)],
                expected_version=trial.version,
            )
        return {
            "id": experiment_id,
            "state": lifecycle.ACTIVE,
            "trial_id": chosen[0],
            "latest_checkpoint": trials[chosen[0]][1],
            "trial_ids": chosen,
            "latest_checkpoints": {str(t): latest for t, (_, latest) in trials.items()},
        }

    result = await in_transaction(store_of(request), decide)
    log.info("experiment continued", experiment_id=experiment_id, trials=result["trial_ids"])
    return web.json_response(result)
