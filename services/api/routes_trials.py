"""Trials: batched reports from training code (metrics, checkpoints, progress, early exit) and
the metric series."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from events.domain.checkpoints import checkpoint_owners
from events.domain.deciders.trial_reports import (
    ReportAlert,
    ReportCheckpoint,
    ReportEarlyExit,
    ReportMetrics,
    ReportProgress,
    ReportsState,
    TrialReport,
    decide_reports,
)
from events.domain.names import trial_label, trial_stream
from events.log.store import Transaction
from services.api import checkpoint_ids
from services.api import projections_read as pr
from services.api.access import readable_trial
from services.api.auth import check_holder, check_trial, principal_of
from services.api.decided import accepted, append_decided
from services.api.errors import bad_request, forbidden, parse, read_json, validate
from services.api.inbox import claim_many
from services.api.limits import BATCH_MAX_BODY
from services.api.routing import ANYONE, TRIAL_OR_AGENT, RouteTable, state_of, store_of
from services.api.runs import load_run_state
from services.api.views import trial_id_of
from services.tracker import read as tracker_read

log = structlog.get_logger("api")
routes = RouteTable("trials")

MAX_BATCH = 10_000
MAX_STEPS = 2**62
MAX_RUN = 2**31 - 1


class ItemBase(BaseModel):
    """What every report item carries: a key that makes a repeat of it a no-op."""

    idempotency_key: str = Field(min_length=1, max_length=500)


class MetricsItem(ItemBase):
    """Metrics of one group at ``steps_completed`` (training -> WorkloadCompleted, validation ->
    ValidationReported, any other group -> MetricsReported; the tracker projects them into
    ``tr_metrics``)."""

    kind: Literal["metrics"]
    group: str = Field(min_length=1, max_length=200)
    steps_completed: int = Field(ge=0, le=MAX_STEPS)
    metrics: dict[str, Any]
    run_id: int | None = Field(None, ge=1, le=MAX_RUN, description="defaults to the latest run")


class CheckpointItem(ItemBase):
    """A complete checkpoint; ``metadata.steps_completed`` is required, and ``uuid`` must be
    one the gateway issued to this trial (``POST /trials/{trial_id}/checkpoint-ids``)."""

    kind: Literal["checkpoint"]
    uuid: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
        description="the uuid issued for it (the checkpoint directory is <root>/<uuid>)",
    )
    steps_completed: int | None = Field(None, ge=0, le=MAX_STEPS)
    resources: dict[str, int] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    run_id: int | None = Field(None, ge=1, le=MAX_RUN, description="defaults to the latest run")


class ProgressItem(ItemBase):
    """Fraction of the trial's work done (table ``trial_progress``)."""

    kind: Literal["progress"]
    progress: float = Field(ge=0, le=1, allow_inf_nan=False)


class EarlyExitItem(ItemBase):
    """The training code stops the trial early."""

    kind: Literal["early_exit"]
    reason: Literal["invalid_hp", "user_requested_stop", "errored"]

    @field_validator("reason", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class StatusItem(ItemBase):
    """The trial's current status text (``ctx.train.set_status``; table ``trial_status``)."""

    kind: Literal["status"]
    status: str = Field(max_length=4096)


class AlertItem(ItemBase):
    """An alert raised by the training code (``ctx.alert``) -> ``TrialAlerted``."""

    kind: Literal["alert"]
    title: str = Field("", max_length=10_000)
    description: str = Field("", max_length=10_000)
    level: Literal["warn", "info", "debug", "error"] = "info"
    run_id: int | None = Field(None, ge=1, le=MAX_RUN, description="defaults to the latest run")


ReportItem = Annotated[
    MetricsItem | CheckpointItem | ProgressItem | EarlyExitItem | StatusItem | AlertItem,
    Field(discriminator="kind"),
]
_ITEM_MODELS: dict[str, type[ItemBase]] = {
    "metrics": MetricsItem,
    "checkpoint": CheckpointItem,
    "progress": ProgressItem,
    "early_exit": EarlyExitItem,
    "status": StatusItem,
    "alert": AlertItem,
}


class ReportsBody(BaseModel):
    """A batch of reports; each item's ``idempotency_key`` makes repeats no-ops."""

    items: list[ReportItem] = Field(max_length=MAX_BATCH)


class CheckpointIdBody(BaseModel):
    """No fields (an empty body is fine)."""

    model_config = {"extra": "forbid"}


class CheckpointIdResponse(BaseModel):
    """A new checkpoint uuid, valid in this trial's checkpoint reports."""

    uuid: str


class ReportsResponse(BaseModel):
    """How many items were new, how many were repeats, and how many events were appended."""

    accepted: int
    duplicates: int
    events: int


class MetricsQuery(BaseModel):
    """Which series to read: one group (all when omitted); archived rows only when asked; at
    most ``max_points`` points per group and run."""

    group: str | None = None
    archived: bool = Field(False, description="include rows archived by a later run's rollback")
    max_points: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="downsample each (group, run) series longer than this to this many evenly "
        "spaced points, first and last kept (1: the last point only)",
    )


class MetricsRow(BaseModel):
    """One reported point."""

    run_id: int
    group: str
    steps_completed: int
    metrics: dict[str, Any]
    archived: bool
    reported_at: str


class MetricsResponse(BaseModel):
    """A trial's metric series, by steps then run."""

    trial_id: int
    metrics: list[MetricsRow]


def _trial_id(request: web.Request) -> int:
    trial_id = trial_id_of(request.match_info["trial_id"])
    check_trial(principal_of(request), trial_id)
    return trial_id


def _parse_items(data: Any) -> list[ItemBase]:
    """The items of a body :func:`read_json` returned (so already checked for storability)."""
    if not isinstance(data, dict) or not isinstance(data.get("items"), list):
        raise bad_request("items: must be a list of report items", "items")
    raw_items: list[Any] = data["items"]
    if len(raw_items) > MAX_BATCH:
        raise bad_request(f"items: at most {MAX_BATCH} items per batch", "items")
    items: list[ItemBase] = []
    for i, raw in enumerate(raw_items):
        kind = raw.get("kind") if isinstance(raw, dict) else None
        model = _ITEM_MODELS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise bad_request(
                f"items[{i}].kind: must be one of {sorted(_ITEM_MODELS)}", f"items[{i}].kind"
            )
        item = validate(model, raw, prefix=f"items[{i}]")
        if isinstance(item, CheckpointItem):
            _check_checkpoint(item, i)
        items.append(item)
    return items


def _check_checkpoint_ids(request: web.Request, trial_id: int, items: list[ItemBase]) -> None:
    """A 400 naming the first checkpoint item whose uuid the gateway did not issue to the
    trial (so no report can name a directory that was already there)."""
    secret = state_of(request).secret
    for i, item in enumerate(items):
        if isinstance(item, CheckpointItem) and not checkpoint_ids.issued_to(
            secret, trial_id, item.uuid
        ):
            path = f"items[{i}].uuid"
            raise bad_request(
                f"{path}: {item.uuid!r} is not a checkpoint uuid issued to trial {trial_id} "
                f"(ask POST /api/v1/trials/{trial_id}/checkpoint-ids for one)",
                path,
            )


def _check_checkpoint(item: CheckpointItem, i: int) -> None:
    steps = item.metadata.get("steps_completed")
    path = f"items[{i}].metadata.steps_completed"
    if steps is None:
        raise bad_request(f"{path}: required (checkpoint metadata must say steps_completed)", path)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_STEPS:
        raise bad_request(f"{path}: must be a non-negative integer, got {steps!r}", path)
    if item.steps_completed is not None and item.steps_completed != steps:
        raise bad_request(
            f"items[{i}].steps_completed: {item.steps_completed} differs from metadata's {steps}",
            f"items[{i}].steps_completed",
        )


def _report_of(item: ItemBase, index: int) -> TrialReport:
    """The decider's command for one parsed report item at ``items[index]``."""
    key = item.idempotency_key
    if isinstance(item, MetricsItem):
        return ReportMetrics(
            index=index,
            key=key,
            group=item.group,
            steps_completed=item.steps_completed,
            metrics=item.metrics,
            run_id=item.run_id,
        )
    if isinstance(item, CheckpointItem):
        return ReportCheckpoint(
            index=index,
            key=key,
            uuid=item.uuid,
            metadata=item.metadata,
            resources=item.resources,
            run_id=item.run_id,
        )
    if isinstance(item, EarlyExitItem):
        return ReportEarlyExit(index=index, key=key, reason=item.reason)
    if isinstance(item, AlertItem):
        return ReportAlert(
            index=index,
            key=key,
            title=item.title,
            description=item.description,
            level=item.level,
            run_id=item.run_id,
        )
    return ReportProgress(index=index, key=key)


async def ingest(
    tx: Transaction, trial_id: int, items: list[ItemBase], actor: str
) -> dict[str, int]:
    """Applies a batch of report items in ``tx``: new keys only, one append (metrics become events,
    which the tracker projects), progress into table ``trial_progress``, status into table
    ``trial_status``.

    New items are accepted only for the trial's current run, and a checkpoint only under a uuid
    no other trial recorded first (:mod:`events.domain.checkpoints`), as
    :func:`events.domain.deciders.trial_reports.decide_reports` decides; otherwise the whole
    batch is refused with a 409 and nothing is appended or claimed. Both
    checks are made under the append lock, taken before anything else, so they still hold when
    the events are appended (and of two reports claiming one new uuid, exactly one wins).

    Returns:
        Counts of accepted and duplicate items and of appended events.
    """
    await tx.lock_appends()
    unique: dict[str, ItemBase] = {}
    for item in items:
        unique.setdefault(item.idempotency_key, item)
    fresh_keys = await claim_many(tx, f"api.trial-report.{trial_label(trial_id)}", list(unique))
    fresh = [item for key, item in unique.items() if key in fresh_keys]
    counts = {"accepted": len(fresh), "duplicates": len(items) - len(fresh), "events": 0}
    if not fresh:
        return counts
    runs = await load_run_state(tx, trial_id)
    position = {id(item): i for i, item in enumerate(items)}
    uuids = [item.uuid for item in fresh if isinstance(item, CheckpointItem)]
    state = ReportsState(
        trial=runs.trial,
        trial_state=runs.trial_state,
        experiment_state=runs.experiment_state,
        checkpoint_owners=await checkpoint_owners(tx.conn, uuids) if uuids else {},
    )
    events = accepted(decide_reports(state, [_report_of(i, position[id(i)]) for i in fresh]))

    progress = [i for i in fresh if isinstance(i, ProgressItem)]
    if progress:
        await tx.conn.execute(
            """INSERT INTO trial_progress (trial_id, progress) VALUES ($1, $2)
               ON CONFLICT (trial_id) DO UPDATE
               SET progress = excluded.progress, updated_at = now()""",
            trial_id,
            progress[-1].progress,
        )
    statuses = [i for i in fresh if isinstance(i, StatusItem)]
    if statuses:
        await tx.conn.execute(
            """INSERT INTO trial_status (trial_id, status) VALUES ($1, $2)
               ON CONFLICT (trial_id) DO UPDATE
               SET status = excluded.status, updated_at = now()""",
            trial_id,
            statuses[-1].status,
        )
    await append_decided(tx, trial_stream(trial_id), events, expected_version=None, actor=actor)
    counts["events"] = len(events)
    return counts


@routes.post(
    "/api/v1/trials/{trial_id}/reports",
    allow=TRIAL_OR_AGENT,
    body=ReportsBody,
    response=ReportsResponse,
    max_body=BATCH_MAX_BODY,
)
async def reports(request: web.Request) -> web.Response:
    """Ingests a batch of reports in one transaction; repeated keys are no-ops; 400 for a
    checkpoint uuid the gateway did not issue to the trial; 409 for a trial or run that has
    ended, a run that is not the current one, or a checkpoint uuid that belongs to another
    trial; 403 for an agent the trial's latest run is not placed on."""
    trial_id = _trial_id(request)
    items = _parse_items(await read_json(request))
    _check_checkpoint_ids(request, trial_id, items)
    principal = principal_of(request)
    if principal.kind == "agent":
        runs = await load_run_state(store_of(request), trial_id)
        latest = runs.trial.latest_allocation
        alloc = runs.trial.allocations.get(latest) if latest is not None else None
        if alloc is None:
            raise forbidden(f"agent {principal.name} runs nothing of trial {trial_id}")
        check_holder(principal, alloc.allocation_id, alloc.run_id, alloc.placements)
    actor = f"trial:{trial_id}" if principal.kind == "trial" else principal.name
    async with store_of(request).transaction() as tx:
        counts = await ingest(tx, trial_id, items, actor)
    return web.json_response(counts)


@routes.post(
    "/api/v1/trials/{trial_id}/checkpoint-ids",
    allow=TRIAL_OR_AGENT,
    body=CheckpointIdBody,
    response=CheckpointIdResponse,
    audit=False,
)
async def checkpoint_id(request: web.Request) -> web.Response:
    """Issues the uuid of a new checkpoint of the trial (the only uuids its checkpoint reports
    may name); nothing is recorded until the checkpoint is reported."""
    trial_id = _trial_id(request)
    parse(CheckpointIdBody, await read_json(request))
    return web.json_response({"uuid": checkpoint_ids.issue(state_of(request).secret, trial_id)})


@routes.get(
    "/api/v1/trials/{trial_id}/metrics",
    allow=ANYONE,
    query=MetricsQuery,
    response=MetricsResponse,
)
async def metrics(request: web.Request) -> web.Response:
    """A trial's reported metrics (the tracker's ``tr_metrics``), optionally one group and
    downsampled, by steps then run (the experiment's owner, an admin, the trial's own token or
    an agent)."""
    trial_id = trial_id_of(request.match_info["trial_id"])
    await readable_trial(request, trial_id)
    query = parse(MetricsQuery, dict(request.query))
    rows = await pr.read_rows(
        store_of(request),
        tracker_read.trial_metrics,
        trial_id,
        group=query.group,
        archived=query.archived,
        max_points=query.max_points,
    )
    return web.json_response({"trial_id": trial_id, "metrics": rows})
