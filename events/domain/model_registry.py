"""What the model registry reads of the log, and the lock that orders registrations against
checkpoint deletions.

Invariant (a registered checkpoint is never deleted): every transaction that registers a
model version, and every one that decides to delete checkpoints (the tracker's GC, a user's
checkpoint deletion, an experiment's deletion), takes the registry lock (:func:`lock_registry`)
*before* it reads from the log which checkpoints are registered or whether a checkpoint is
deleted, and holds it until it commits. Of a registration R and a deletion D, one therefore
commits before the other reads: either D reads R's ``ModelVersionRegistered`` and keeps the
checkpoint, or R reads D's ``CheckpointsDeleted`` (or its experiment's DELETING) and is refused.
Never neither. Reads here run at READ COMMITTED, so a statement after the lock sees every commit
made before it was granted.

The lock is taken before the append lock in every such transaction (the GC takes it at the start
of each page, before anything of the page appends), so two of them never wait on each other's
locks in opposite orders. Every other change of a model takes it too, so that the number a new
model takes and the uniqueness of its name are decided on a registry nobody else changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from events.domain.aggregates import MODEL_FACTS, ModelView, fold_model
from events.domain.names import MODEL_PREFIX, model_of_stream, model_stream
from events.domain.types import ModelVersionRegistered
from events.log.reads import LogReads
from events.log.store import Transaction

REGISTRY_LOCK = int.from_bytes(
    hashlib.blake2b(b"cairn:model-registry", digest_size=8).digest(), "big", signed=True
)
"""The key of the registry's transaction-level advisory lock."""

NAME_FACTS = ("ModelCreated", "ModelEdited", "ModelDeleted")
"""The facts that give (or take away) a model's name."""


async def lock_registry(tx: Transaction) -> None:
    """Takes the registry lock for the rest of ``tx`` (see the module's invariant)."""
    await tx.conn.execute("SELECT pg_advisory_xact_lock($1)", REGISTRY_LOCK)


async def load_model(reader: LogReads, model_id: int) -> ModelView:
    """The model's stream folded (``exists`` is false for an unknown or deleted one), with the
    stream's version for an append at it."""
    events, version = await reader.read_stream_facts(model_stream(model_id), MODEL_FACTS)
    view = fold_model(model_id, events)
    view.version = version
    return view


async def model_names(reader: LogReads) -> dict[str, int]:
    """The name of every existing model, to its number."""
    names: dict[str, int] = {}
    for recorded in await reader.latest_per_stream(MODEL_PREFIX, NAME_FACTS):
        model_id = model_of_stream(recorded.stream_id)
        if model_id is None or recorded.type == "ModelDeleted":
            continue
        fact = recorded.decode()
        name = getattr(fact, "name", None)
        if isinstance(name, str):
            names[name] = model_id
    return names


async def model_named(reader: LogReads, name: str) -> int | None:
    """The number of the existing model called ``name`` (case-sensitive), if there is one."""
    return (await model_names(reader)).get(name)


async def next_model_id(tx: Transaction) -> int:
    """The number a new model takes: one above any number ever taken (under the registry lock,
    nobody else takes one before this transaction commits)."""
    return await tx.max_model_id() + 1


@dataclass(frozen=True)
class Registration:
    """A model version in force and the checkpoint it keeps."""

    model_id: int
    model_name: str
    version: int
    checkpoint_uuid: str
    experiment_id: int

    def describe(self) -> str:
        """``model 'mnist' version 2 (checkpoint <uuid>)``: how refusals name it."""
        return (
            f"model {self.model_name!r} version {self.version} (checkpoint {self.checkpoint_uuid})"
        )


async def registrations(
    reader: LogReads, *, uuids: Sequence[str] = (), experiment_id: int | None = None
) -> list[Registration]:
    """The versions in force that keep one of ``uuids`` or a checkpoint of experiment
    ``experiment_id``, oldest first (call it under the registry lock to act on the answer)."""
    found = await reader.live_registrations(uuids=sorted(set(uuids)), experiment_id=experiment_id)
    names: dict[int, str] = {}
    out = []
    for recorded in found:
        fact = recorded.decode_as(ModelVersionRegistered)
        if fact.model_id not in names:
            names[fact.model_id] = (await load_model(reader, fact.model_id)).name
        out.append(
            Registration(
                model_id=fact.model_id,
                model_name=names[fact.model_id],
                version=fact.version,
                checkpoint_uuid=fact.checkpoint_uuid,
                experiment_id=fact.experiment_id,
            )
        )
    return out
