"""Checkpoint garbage collection (consumer ``tracker-gc``).

When an experiment ends (COMPLETED, CANCELED, ERROR) the GC keeps the checkpoints its
``checkpoint_storage`` policy asks for and deletes the others' directories; when it is being
deleted (DELETING) it deletes them all and records the experiment DELETED (or DELETE_FAILED).
It reads the experiment's checkpoints and validations from the log itself, never from the
projections (which may lag), and records what it removed as ``CheckpointsDeleted`` in the same
transaction that moves its checkpoint.

The selection is Determined's (``reference/determined.md`` §1.5,
``ExperimentCheckpointsToGCRaw``): :func:`select_for_deletion`.

A checkpoint a model version keeps is never deleted, whatever the policy or the request: each
page takes the registry lock first and every decision reads the registrations in force after it
(:mod:`events.domain.model_registry` states the invariant), so a version registered while the GC
decides is either seen here or refused there. When a version or a model is deleted, the GC
collects its checkpoints' experiments again by their policy (an ended one), so a checkpoint
kept only for that version goes at once; a deleting one whose deletion was kept from finishing
stays DELETE_FAILED until the user deletes it again.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import structlog

from events.domain.aggregates import fold_experiment, metric_value
from events.domain.checkpoint_storage import (
    CheckpointStorage,
    DirectoryStorage,
    StorageError,
    open_storage,
    safe_uuid,
)
from events.domain.checkpoints import checkpoint_owners
from events.domain.config.cluster import CheckpointStoragePolicy
from events.domain.config.storage import checkpoint_root
from events.domain.lifecycle import DELETE_FAILED, DELETED, DELETING, TERMINAL
from events.domain.model_registry import (
    Registration,
    lock_registry,
    registrations,
)
from events.domain.names import experiment_stream, model_of_stream, trial_stream
from events.domain.types import (
    CheckpointSaved,
    CheckpointsDeleted,
    CheckpointsDeleteRequested,
    ExperimentStateChanged,
    ExperimentSubmitted,
    ModelVersionDeleted,
    ModelVersionRegistered,
    TrialRequested,
    TrialStarted,
    ValidationReported,
)
from events.log.bus import EVENTS_PREFIX
from events.log.consumer import Consumer
from events.log.envelope import Event, RecordedEvent, new
from events.log.errors import EventsError, StatementError
from events.log.store import Transaction

log = structlog.get_logger("tracker")

NAME = "tracker-gc"
ACTOR = "tracker"
UUIDS_PER_EVENT = 1000
"""Most uuids one ``CheckpointsDeleted`` names, so that it stays far below the store's event
size limit (uuids are at most 128 characters); more deletions become several events."""


@dataclass(frozen=True)
class GCPolicy:
    """How many checkpoints to keep: the union of the experiment's best, each trial's best and
    each trial's latest."""

    save_experiment_best: int = 0
    save_trial_best: int = 1
    save_trial_latest: int = 1

    @classmethod
    def from_storage(cls, storage: Any) -> GCPolicy:
        """The policy of a ``checkpoint_storage`` config (defaults 0/1/1 where unset)."""
        data = storage if isinstance(storage, Mapping) else {}

        def count(key: str, default: int) -> int:
            value = data.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                return value
            return default

        return cls(
            save_experiment_best=count("save_experiment_best", cls.save_experiment_best),
            save_trial_best=count("save_trial_best", cls.save_trial_best),
            save_trial_latest=count("save_trial_latest", cls.save_trial_latest),
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """One reported checkpoint as the GC sees it.

    Attributes:
        uuid: the checkpoint's id (its directory is ``<root>/<uuid>``).
        trial_id: the trial that saved it.
        steps_completed: the trial's steps when it was saved.
        searcher_metric: the searcher metric of the trial's validation at the same
            ``steps_completed`` (``None``: no such validation, or it lacks the metric).
    """

    uuid: str
    trial_id: int
    steps_completed: int
    searcher_metric: float | None = None


def select_for_deletion(
    checkpoints: Iterable[CheckpointInfo],
    policy: GCPolicy,
    *,
    smaller_is_better: bool,
    warm_starts: frozenset[str] = frozenset(),
) -> set[str]:
    """The uuids to delete under ``policy`` (Determined's rule).

    Checkpoints are ranked SQL-``rank()``-style (ties share a rank) by the signed searcher
    metric experiment-wide (``experiment_rank``) and within their trial (``trial_rank``), and by
    ``steps_completed`` descending within their trial (``trial_order_rank``). One is deleted iff
    ``((experiment_rank > save_experiment_best AND trial_rank > save_trial_best) OR it has no
    validation metric) AND trial_order_rank > save_trial_latest``, and it is not a warm start.

    Args:
        checkpoints: the experiment's live checkpoints (a repeated uuid counts once).
        policy: how many to keep.
        smaller_is_better: the searcher metric's direction.
        warm_starts: uuids some trial started from; never deleted.

    Returns:
        The uuids to delete.
    """
    unique: dict[str, CheckpointInfo] = {}
    for ckpt in checkpoints:
        unique.setdefault(ckpt.uuid, ckpt)
    sign = 1.0 if smaller_is_better else -1.0
    signed = {
        c.uuid: sign * c.searcher_metric for c in unique.values() if c.searcher_metric is not None
    }
    experiment_values = sorted(signed.values())
    trial_values: dict[int, list[float]] = {}
    trial_steps: dict[int, list[int]] = {}
    for c in unique.values():
        if c.uuid in signed:
            trial_values.setdefault(c.trial_id, []).append(signed[c.uuid])
        trial_steps.setdefault(c.trial_id, []).append(-c.steps_completed)
    for values in trial_values.values():
        values.sort()
    for steps in trial_steps.values():
        steps.sort()

    def rank(sorted_values: list[float], value: float) -> int:
        # SQL rank(): one more than the number of rows strictly ahead.
        return 1 + bisect.bisect_left(sorted_values, value)

    def order_rank(sorted_steps: list[int], steps: int) -> int:
        return 1 + bisect.bisect_left(sorted_steps, -steps)

    doomed: set[str] = set()
    for c in unique.values():
        if c.uuid in warm_starts:
            continue
        if order_rank(trial_steps[c.trial_id], c.steps_completed) <= policy.save_trial_latest:
            continue
        value = signed.get(c.uuid)
        if value is None:
            doomed.add(c.uuid)
            continue
        experiment_rank = rank(experiment_values, value)
        trial_rank = rank(trial_values[c.trial_id], value)
        if experiment_rank > policy.save_experiment_best and trial_rank > policy.save_trial_best:
            doomed.add(c.uuid)
    return doomed


@dataclass
class ExperimentCheckpoints:
    """What the log says about one experiment's checkpoints."""

    experiment_id: int
    version: int
    config: dict[str, Any] = field(default_factory=dict)
    state: str = ""
    checkpoints: dict[str, CheckpointInfo] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)

    @property
    def live(self) -> list[CheckpointInfo]:
        """The checkpoints not deleted yet, in report order."""
        return [c for uuid, c in self.checkpoints.items() if uuid not in self.deleted]

    @property
    def searcher(self) -> dict[str, Any]:
        """The searcher section of the config."""
        value = self.config.get("searcher")
        return dict(value) if isinstance(value, Mapping) else {}


async def read_experiment(
    tx: Transaction, experiment_id: int, upto_version: int | None = None
) -> ExperimentCheckpoints:
    """Reads an experiment's config, checkpoints (with their validations' searcher metric) and
    already-deleted uuids from the log, in ``tx``.

    Only checkpoints the experiment owns are listed: a uuid one of its trials reported after
    another trial had recorded it belongs to that other trial (:mod:`events.domain.checkpoints`).

    Args:
        tx: the transaction to read in.
        experiment_id: the experiment.
        upto_version: fold the experiment's state only up to this stream version.
    """
    stream = experiment_stream(experiment_id)
    version = await tx.stream_version(stream)
    events = await tx.read_stream(stream)
    facts = ExperimentCheckpoints(experiment_id=experiment_id, version=version)
    facts.state = fold_experiment(
        experiment_id,
        (e for e in events if upto_version is None or e.stream_version <= upto_version),
    ).state
    trial_streams: list[str] = []
    for e in events:
        if e.type not in _EXPERIMENT_FACTS:
            continue
        fact = e.decode()
        if isinstance(fact, ExperimentSubmitted):
            facts.config = dict(fact.config)
        elif isinstance(fact, TrialRequested):
            trial_streams.append(trial_stream(fact.trial_id))
        elif isinstance(fact, CheckpointsDeleted):
            facts.deleted.update(fact.uuids)
    events_of_trials = await tx.read_streams(
        trial_streams, ["CheckpointSaved", "ValidationReported"]
    )
    metric = str(facts.searcher.get("metric") or "")
    saved: list[tuple[str, int, int]] = []
    validations: dict[tuple[int, int], float | None] = {}
    for recorded in events_of_trials:
        # Upcast at the read boundary: a legacy "E.N" trial id arrives mapped.
        event = recorded.decode()
        if isinstance(event, CheckpointSaved):
            saved.append((event.uuid, event.trial_id, event.steps_completed))
        elif isinstance(event, ValidationReported):  # the latest at these steps wins
            key = (event.trial_id, event.steps_completed)
            validations[key] = metric_value(event.metrics, metric)
    # Only checkpoints this experiment's trials recorded first are its own; a later report of
    # the same uuid elsewhere (refused now, but older logs may hold one) never makes it ours.
    owners = await checkpoint_owners(tx.conn, (uuid for uuid, _, _ in saved))
    for uuid, trial_id, steps in saved:
        if owners.get(uuid) != trial_id:
            continue
        if uuid not in facts.checkpoints:
            facts.checkpoints[uuid] = CheckpointInfo(
                uuid, trial_id, steps, validations.get((trial_id, steps))
            )
    return facts


_EXPERIMENT_FACTS = frozenset(
    model.event_type for model in (ExperimentSubmitted, TrialRequested, CheckpointsDeleted)
)
"""The types of an experiment's stream that :func:`read_experiment` reads (it decodes no other)."""


async def warm_starts(tx: Transaction, facts: ExperimentCheckpoints) -> frozenset[str]:
    """The experiment's checkpoints that some trial was started from (a trial resuming from its
    own checkpoint is not a warm start) or that a submitted experiment names as its
    ``searcher.source_checkpoint_uuid``."""
    uuids = list(facts.checkpoints)
    if not uuids:
        return frozenset()
    used = set()
    for event in await tx.checkpoint_uses(uuids):
        use = event.decode()
        if isinstance(use, TrialStarted):
            uuid = str(use.restored_checkpoint)
            starter: int | None = use.trial_id
        elif isinstance(use, ExperimentSubmitted):
            searcher = use.config["searcher"]
            uuid, starter = str(searcher["source_checkpoint_uuid"]), None
        else:
            continue  # checkpoint_uses reads only these two types
        if uuid in facts.checkpoints and starter != facts.checkpoints[uuid].trial_id:
            used.add(uuid)
    return frozenset(used)


@dataclass
class Removal:
    """The outcome of removing checkpoint directories."""

    removed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def deleted(self) -> list[str]:
        """Every uuid now gone from storage (removed now or already missing), sorted."""
        return sorted(self.removed + self.missing)


def remove_checkpoints(storage: CheckpointStorage, uuids: Iterable[str]) -> Removal:
    """Removes each checkpoint's files from ``storage``; an absent one (or a uuid that is not
    a plain path component, which cannot name a checkpoint) is ``missing``, any other error is
    ``failed``.

    Only a checkpoint cairn wrote is removed (its marker names it, see
    :meth:`CheckpointStorage.owned`); anything else at that name (a directory that was there
    before, a link put in its place) is left alone and counted ``missing``: cairn's checkpoint
    is not there.
    """
    result = Removal()
    for uuid in sorted(set(uuids)):
        if not safe_uuid(uuid):
            result.missing.append(uuid)
            continue
        try:
            if not storage.owned(uuid):
                if storage.files(uuid):
                    log.warning(
                        "not a checkpoint cairn wrote; left in place",
                        uuid=uuid,
                        storage=storage.location,
                    )
                result.missing.append(uuid)
                continue
            found = storage.delete(uuid)
        except StorageError as exc:
            result.failed[uuid] = str(exc)
        else:
            (result.removed if found else result.missing).append(uuid)
    return result


def remove_directories(root: Path, uuids: Iterable[str]) -> Removal:
    """:func:`remove_checkpoints` of the directories ``<root>/<uuid>``."""
    return remove_checkpoints(DirectoryStorage(root), uuids)


class GCConsumer(Consumer):
    """Deletes checkpoints when experiments end or are deleted (consumer ``tracker-gc``).

    Args:
        default_root: the checkpoint root of experiments without ``checkpoint_storage``.
        policy: the cluster config's storage policy: a storage it does not allow (an
            experiment submitted before the policy changed) is not touched.
    """

    name = NAME
    subjects = (f"{EVENTS_PREFIX}.experiment.>", f"{EVENTS_PREFIX}.model.>")
    types = frozenset(
        {
            "ExperimentStateChanged",
            "CheckpointsDeleteRequested",
            "ModelVersionDeleted",
            "ModelDeleted",
        }
    )

    def __init__(self, default_root: Path, policy: CheckpointStoragePolicy) -> None:
        self.default_root = default_root
        self.policy = policy

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        """Takes the registry lock, then handles the page's events in order.

        The lock comes first, before anything of the page appends (see
        :mod:`events.domain.model_registry`): every decision below reads the registrations in
        force after it, and no registration commits until this page has.
        """
        if events:
            await lock_registry(tx)
        await super().handle_page(tx, events)

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        """Collects the experiment's checkpoints when ``event`` ends it or asks to delete it,
        and collects again the experiments a deleted version or model kept checkpoints of.

        Raises:
            ConcurrencyError: the experiment's stream moved meanwhile (the page is retried).
            EventsError: the database refused a statement.
        """
        if event.type == "CheckpointsDeleteRequested":
            await self._delete_requested(tx, event)
            return
        if event.type in ("ModelVersionDeleted", "ModelDeleted"):
            await self._released(tx, event)
            return
        changed = event.decode_as(ExperimentStateChanged)
        state = changed.state
        if state not in TERMINAL and state != DELETING:
            return
        experiment_id = changed.experiment_id
        try:
            facts = await read_experiment(tx, experiment_id, event.stream_version)
            if facts.state != state:
                return  # a transition the fold refused: nothing happened
            if state == DELETING:
                await self._delete_all(tx, facts)
            else:
                await self._collect(tx, facts)
        except StatementError as exc:
            raise EventsError(f"checkpoint GC of experiment {experiment_id} failed: {exc}") from exc

    async def _released(self, tx: Transaction, event: RecordedEvent) -> None:
        """Collects again, by their policy, the ended experiments whose checkpoints the deleted
        version (or every version of the deleted model) kept."""
        if event.type == "ModelVersionDeleted":
            experiments = {event.decode_as(ModelVersionDeleted).experiment_id}
        else:
            model_id = model_of_stream(event.stream_id)
            if model_id is None:
                return
            stream = await tx.read_stream(event.stream_id, 0)
            experiments = {
                e.decode_as(ModelVersionRegistered).experiment_id
                for e in stream
                if e.type == "ModelVersionRegistered" and e.stream_version < event.stream_version
            }
        for experiment_id in sorted(experiments):
            try:
                facts = await read_experiment(tx, experiment_id)
                if facts.state in TERMINAL:
                    await self._collect(tx, facts)
            except StatementError as exc:
                raise EventsError(
                    f"checkpoint GC of experiment {experiment_id} failed: {exc}"
                ) from exc

    async def _delete_requested(self, tx: Transaction, event: RecordedEvent) -> None:
        """Deletes the checkpoints a user asked for that the experiment still has and no model
        version keeps."""
        requested = event.decode_as(CheckpointsDeleteRequested)
        experiment_id = requested.experiment_id
        wanted = set(requested.uuids)
        try:
            facts = await read_experiment(tx, experiment_id)
            doomed = wanted.intersection(c.uuid for c in facts.live)
            kept = await _registered(tx, doomed)
            if kept:
                log.info(
                    "registered checkpoints kept",
                    experiment=experiment_id,
                    kept=[r.describe() for r in kept],
                )
            doomed -= {r.checkpoint_uuid for r in kept}
            if not doomed:
                return
            await self._delete(tx, facts, doomed, "user")
        except StatementError as exc:
            raise EventsError(
                f"deleting checkpoints of experiment {experiment_id} failed: {exc}"
            ) from exc

    def root_of(self, facts: ExperimentCheckpoints) -> Path:
        """Where the experiment's checkpoint directories are (when they are directories)."""
        return checkpoint_root(facts.config.get("checkpoint_storage"), self.default_root)

    def storage_of(self, facts: ExperimentCheckpoints) -> CheckpointStorage:
        """The storage of the experiment's checkpoints (a directory or an S3 bucket)."""
        return open_storage(
            facts.config.get("checkpoint_storage"), self.default_root, policy=self.policy
        )

    async def _remove(self, facts: ExperimentCheckpoints, uuids: Iterable[str]) -> Removal:
        def work() -> Removal:
            try:
                storage = self.storage_of(facts)
            except StorageError as exc:
                return Removal(failed={uuid: str(exc) for uuid in sorted(set(uuids))})
            return remove_checkpoints(storage, uuids)

        return await asyncio.to_thread(work)

    async def _collect(self, tx: Transaction, facts: ExperimentCheckpoints) -> None:
        policy = GCPolicy.from_storage(facts.config.get("checkpoint_storage"))
        doomed = select_for_deletion(
            facts.live,
            policy,
            smaller_is_better=bool(facts.searcher.get("smaller_is_better", True)),
            warm_starts=await warm_starts(tx, facts),
        )
        doomed -= {r.checkpoint_uuid for r in await _registered(tx, doomed)}
        if not doomed:
            return
        await self._delete(tx, facts, doomed, "gc")

    async def _delete(
        self,
        tx: Transaction,
        facts: ExperimentCheckpoints,
        doomed: Iterable[str],
        reason: Literal["gc", "user"],
    ) -> None:
        """Removes ``doomed`` from storage, logs each failure and records what was deleted."""
        removal = await self._remove(facts, doomed)
        for uuid, error in removal.failed.items():
            log.error("checkpoint not deleted", uuid=uuid, error=error)
        if removal.deleted:
            await self._append(tx, facts, self._deleted(facts, removal, reason))

    async def _delete_all(self, tx: Transaction, facts: ExperimentCheckpoints) -> None:
        kept = await _registered(tx, [c.uuid for c in facts.live])
        kept_uuids = {r.checkpoint_uuid for r in kept}
        live = [c.uuid for c in facts.live if c.uuid not in kept_uuids]
        removal = await self._remove(facts, live)
        events: list[Event] = []
        if removal.deleted:
            events.extend(self._deleted(facts, removal, "experiment deleted"))
        if kept:
            # Registered while the deletion was on its way (the gateway refuses to start one
            # over a registered checkpoint): the versions win, the deletion stops here.
            names = ", ".join(r.describe() for r in kept)
            log.warning("experiment deletion kept registered checkpoints", kept=names)
            final, reason = (
                DELETE_FAILED,
                f"checkpoints are registered as model versions: {names}",
            )
        elif removal.failed:
            uuid, error = sorted(removal.failed.items())[0]
            log.error("experiment deletion failed", experiment=facts.experiment_id, error=error)
            final, reason = DELETE_FAILED, f"could not delete checkpoint {uuid}: {error}"
        else:
            final, reason = DELETED, "checkpoints deleted"
        events.append(
            ExperimentStateChanged(
                experiment_id=facts.experiment_id, state=final, reason=reason, actor=ACTOR
            )
        )
        await self._append(tx, facts, events)

    @staticmethod
    def _deleted(
        facts: ExperimentCheckpoints,
        removal: Removal,
        reason: Literal["gc", "experiment deleted", "user"],
    ) -> list[Event]:
        deleted = removal.deleted
        missing = set(removal.missing)
        chunks = [deleted[i : i + UUIDS_PER_EVENT] for i in range(0, len(deleted), UUIDS_PER_EVENT)]
        return [
            CheckpointsDeleted(
                experiment_id=facts.experiment_id,
                uuids=chunk,
                missing=sorted(missing.intersection(chunk)),
                reason=reason,
            )
            for chunk in chunks
        ]

    @staticmethod
    async def _append(tx: Transaction, facts: ExperimentCheckpoints, events: list[Event]) -> None:
        await tx.append(
            experiment_stream(facts.experiment_id),
            [new(e, actor=ACTOR) for e in events],
            expected_version=facts.version,
        )
        log.info(
            "checkpoints collected",
            experiment=facts.experiment_id,
            types=[e.event_type for e in events],
        )


async def _registered(tx: Transaction, uuids: Iterable[str]) -> list[Registration]:
    """The versions in force that keep one of ``uuids`` (the page holds the registry lock)."""
    wanted = sorted(set(uuids))
    return await registrations(tx, uuids=wanted) if wanted else []
