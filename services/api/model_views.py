"""Registered models as the API shows them, folded from their streams (``model-<id>``).

A path names a model by its name or by its number (a name is never all digits, so the two never
meet). Every model is folded from the log on each read, as templates are: the registry is
small, and a read never lags behind a change the same user just made.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from events.domain.aggregates import MODEL_FACTS, ModelVersionView, ModelView, fold_model, iso
from events.domain.aggregates.teams import Teams
from events.domain.deciders.model import LATEST
from events.domain.model_registry import load_model, lock_registry, model_named, model_names
from events.domain.names import model_of_stream, model_stream
from events.log.reads import LogReads
from events.log.store import Transaction
from services.api.errors import not_found

MAX_MODEL_ID = 10**18
"""Largest model number a path may name (larger ones are simply unknown)."""


async def model_of_path(reader: LogReads, ref: str) -> ModelView:
    """The existing model ``ref`` names (its name, or its number when all digits); else 404."""
    if ref.isascii() and ref.isdigit():
        model_id: int | None = int(ref) if len(ref) <= 18 else None
    else:
        model_id = await model_named(reader, ref)
    view = await load_model(reader, model_id) if model_id is not None else None
    if view is None or not view.exists:
        raise not_found(f"no model {ref!r}")
    return view


def version_number(ref: str) -> int:
    """The version number a path names (``-1``: the latest); else 404."""
    if ref == str(LATEST):
        return LATEST
    if ref.isascii() and ref.isdigit() and len(ref) <= 9:
        return int(ref)
    raise not_found(f"no version {ref[:40]!r}: versions are numbered 1, 2, ... (-1: the latest)")


def version_of_path(view: ModelView, ref: str) -> ModelVersionView:
    """The model's version ``ref`` names (``-1``: the latest); else 404."""
    number = version_number(ref)
    if number == LATEST:
        number = max(view.versions, default=0)
    found = view.versions.get(number)
    if found is None:
        raise not_found(f"model {view.name!r} has no version {ref}")
    return found


async def all_models(reader: LogReads) -> list[ModelView]:
    """Every existing model, folded (two reads of the log, whatever their number)."""
    ids = sorted(set((await model_names(reader)).values()))
    if not ids:
        return []
    by_stream: dict[str, list[Any]] = defaultdict(list)
    for recorded in await reader.read_streams([model_stream(i) for i in ids], MODEL_FACTS):
        by_stream[recorded.stream_id].append(recorded)
    out = []
    for stream, events in by_stream.items():
        model_id = model_of_stream(stream)
        if model_id is not None:
            view = fold_model(model_id, events)
            if view.exists:
                out.append(view)
    return out


async def models_by_workspace(tx: Transaction) -> dict[int, list[str]]:
    """The names of the existing models of each workspace that holds one, read under the
    registry lock (taken here): a model created in or moved to a workspace either commits before
    this reads, and is counted, or reads the teams after the caller's transaction commits (see
    :mod:`services.api.routes_models`)."""
    await lock_registry(tx)
    out: dict[int, list[str]] = defaultdict(list)
    for view in await all_models(tx):
        out[view.workspace_id].append(view.name)
    return dict(out)


def describe_model(view: ModelView, teams: Teams) -> dict[str, Any]:
    """A model as the API shows it, with its workspace's id and name (``teams``: the
    workspaces as read)."""
    workspace = teams.workspaces.get(view.workspace_id)
    return {
        "id": view.model_id,
        "name": view.name,
        "description": view.description,
        "labels": list(view.labels),
        "metadata": dict(view.metadata),
        "notes": view.notes,
        "username": view.owner,
        "workspace_id": view.workspace_id,
        "workspace": workspace.name if workspace is not None else "",
        "archived": view.archived,
        "num_versions": len(view.versions),
        "creation_time": iso(view.created_at),
        "last_updated_time": iso(view.updated_at),
    }


def describe_version(
    view: ModelView, version: ModelVersionView, checkpoint: dict[str, Any] | None
) -> dict[str, Any]:
    """A version as the API shows it, with its model's id and name and its checkpoint (the
    projection's ``state``, ``steps_completed`` and ``reported_at`` when it has the row)."""
    summary: dict[str, Any] = {
        "uuid": version.checkpoint_uuid,
        "experiment_id": version.experiment_id,
        "trial_id": version.trial_id,
        "state": None,
        "steps_completed": None,
        "reported_at": None,
    }
    if checkpoint is not None:
        for key in ("state", "steps_completed", "reported_at"):
            summary[key] = checkpoint.get(key)
    return {
        "model": {"id": view.model_id, "name": view.name},
        "version": version.version,
        "checkpoint": summary,
        "name": version.name,
        "comment": version.comment,
        "labels": list(version.labels),
        "metadata": dict(version.metadata),
        "notes": version.notes,
        "username": version.creator,
        "creation_time": iso(version.created_at),
        "last_updated_time": iso(version.updated_at),
    }
