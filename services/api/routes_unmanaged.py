"""Unmanaged runs: a ``core_v2`` script started outside the cluster reports to it.

``POST /api/v1/unmanaged/trials`` (a user's token) finds or creates, per (user, external
experiment id, external trial id), an unmanaged experiment and its trial, and opens the trial's
next run: it answers the run's trial token, with which the script reports metrics, checkpoints
and logs through the same routes as a managed trial, and the latest checkpoint to resume from.
``POST /api/v1/unmanaged/runs/heartbeat`` and ``/close`` (the run's token) keep it open and end
it; :func:`expire_silent_runs`, run by every gateway on a timer, ends a run whose script went
silent past the cluster's ``unmanaged.heartbeat_timeout`` (lost, its trial ERROR).

Every decision is :mod:`events.domain.unmanaged`'s, over the streams folded in the transaction
that appends, with their versions as ``expected_version``: a run is opened, closed or expired
once, whichever gateway decides. External ids are keyed by the caller's username, so one user's
ids never name another user's experiment; ``unmanaged_names`` is the index of the ids the log
records, written in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates import TrialView
from events.domain.deciders.experiment import SubmitExperiment, decide_submit
from events.domain.names import experiment_stream, parse_trial_id, trial_stream
from events.domain.types.experiment import MAX_EXTERNAL_ID
from events.domain.unmanaged import close_run, expire_run, open_run, refuse_run, request_trial
from events.log.errors import EventsError
from events.log.store import EventStore, Transaction
from services.api.auth import principal_of, sign_trial_token
from services.api.decided import append_decided, refusal_error
from services.api.errors import ApiError, forbidden, parse, read_json
from services.api.host_access import check_host_requests
from services.api.inbox import in_transaction
from services.api.routes_experiment_submit import validate_config
from services.api.routing import STATE, USERS, Access, RouteTable, state_of, store_of
from services.api.runs import not_current
from services.api.teams import current_teams, project_for_experiment
from services.api.views import experiment_of, load_experiment, load_trial

log = structlog.get_logger("api")
routes = RouteTable("unmanaged")

RUN_TOKEN: frozenset[Access] = frozenset({"trial", "admin"})
"""The run's own trial token (an admin passes the gate, and is refused by the handler)."""
MAX_REASON = 1000
EXTERNAL_ID_PATTERN = r"^[^\x00-\x1f\x7f]+$"
"""External ids are printable text (no NUL or other control characters)."""


class OpenRunBody(BaseModel):
    """The script's run: the names it gives its experiment and trial, and its config."""

    external_experiment_id: str = Field(
        min_length=1, max_length=MAX_EXTERNAL_ID, pattern=EXTERNAL_ID_PATTERN
    )
    external_trial_id: str = Field(
        min_length=1, max_length=MAX_EXTERNAL_ID, pattern=EXTERNAL_ID_PATTERN
    )
    config: str | dict[str, Any] = Field(
        description="the experiment config core_v2 built (a mapping, or YAML text)"
    )
    hparams: dict[str, Any] = Field(default_factory=dict)


class OpenRunResponse(BaseModel):
    """The run opened: ids, its trial token, what to resume from and how often to heartbeat."""

    experiment_id: int
    trial_id: int
    run_id: int
    allocation_id: str
    token: str
    hparams: dict[str, Any]
    config: dict[str, Any]
    latest_checkpoint: str | None
    steps_completed: int
    heartbeat_interval: float
    owner: str


class CloseRunBody(BaseModel):
    """How the script ended."""

    failed: bool = False
    message: str = Field("", max_length=MAX_REASON)
    exit_code: int | None = Field(None, ge=-(2**31), le=2**31 - 1)


class HeartbeatBody(BaseModel):
    """No fields."""


class RunResponse(BaseModel):
    """The run and whether this call changed anything."""

    trial_id: int
    run_id: int
    changed: bool


async def _lock(tx: Transaction, owner: str, external_experiment_id: str) -> None:
    """Serializes opens of one owner's external experiment (two first runs make one)."""
    await tx.conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 7219))",
        json.dumps(["unmanaged", owner, external_experiment_id]),
    )


async def _name(tx: Transaction, owner: str, experiment: str, trial: str) -> Any:
    return await tx.conn.fetchrow(
        """SELECT experiment_id, trial_id FROM unmanaged_names
           WHERE owner = $1 AND external_experiment_id = $2 AND external_trial_id = $3""",
        owner,
        experiment,
        trial,
    )


async def _remember(
    tx: Transaction, owner: str, experiment: str, trial: str, ids: tuple[int, int | None]
) -> None:
    await tx.conn.execute(
        """INSERT INTO unmanaged_names
               (owner, external_experiment_id, external_trial_id, experiment_id, trial_id)
           VALUES ($1, $2, $3, $4, $5)""",
        owner,
        experiment,
        trial,
        *ids,
    )


@routes.post(
    "/api/v1/unmanaged/trials",
    allow=USERS,
    body=OpenRunBody,
    response=OpenRunResponse,
)
async def open_unmanaged_run(request: web.Request) -> web.Response:
    """Finds or creates the caller's unmanaged experiment and trial and opens its next run."""
    principal = principal_of(request)
    body = parse(OpenRunBody, await read_json(request))
    config, warnings = await validate_config(request, body.config)
    check_host_requests(request, config)
    state = state_of(request)
    store = state.store
    owner = principal.name
    project = project_for_experiment(await current_teams(store), principal, config)

    async def work(tx: Transaction) -> dict[str, Any]:
        await _lock(tx, owner, body.external_experiment_id)
        row = await _name(tx, owner, body.external_experiment_id, "")
        if row is None:
            experiment_id = await store.next_experiment_id()
            submitted = decide_submit(
                SubmitExperiment(
                    experiment_id=experiment_id,
                    config=config,
                    code_ref=None,
                    owner=owner,
                    warnings=tuple(warnings),
                    unmanaged=True,
                    external_id=body.external_experiment_id,
                    project_id=project.project_id,
                )
            )
            await append_decided(
                tx, experiment_stream(experiment_id), submitted, expected_version=0, actor=owner
            )
            await _remember(tx, owner, body.external_experiment_id, "", (experiment_id, None))
        else:
            experiment_id = int(row["experiment_id"])
        experiment = await load_experiment(tx, experiment_id)
        if experiment.owner != owner or not experiment.unmanaged:
            raise forbidden(f"experiment {experiment_id} is not your unmanaged experiment")
        refused = refuse_run(experiment)
        if refused is not None:
            raise refusal_error(refused)
        row = await _name(tx, owner, body.external_experiment_id, body.external_trial_id)
        if row is None:
            trial_id = await tx.next_trial_id()
            requested = request_trial(
                experiment_id=experiment_id,
                trial_id=trial_id,
                seq=len(experiment.trials) + 1,
                external_id=body.external_trial_id,
                hparams=body.hparams,
            )
            await append_decided(
                tx,
                experiment_stream(experiment_id),
                [requested],
                expected_version=experiment.version,
                actor=owner,
            )
            await _remember(
                tx,
                owner,
                body.external_experiment_id,
                body.external_trial_id,
                (experiment_id, trial_id),
            )
            hparams = dict(body.hparams)
        else:
            trial_id = int(row["trial_id"])
            hparams = dict(experiment.trials[trial_id].hparams)
        trial = await load_trial(tx, trial_id) if row is not None else TrialView(trial_id)
        events, run_id = open_run(trial)
        await append_decided(
            tx, trial_stream(trial_id), events, expected_version=trial.version, actor=owner
        )
        await tx.conn.execute(
            """INSERT INTO unmanaged_heartbeats (trial_id, run_id, seen_at)
               VALUES ($1, $2, now())
               ON CONFLICT (trial_id) DO UPDATE SET run_id = $2, seen_at = now()""",
            trial_id,
            run_id,
        )
        latest = trial.latest_checkpoint
        return {
            "experiment_id": experiment_id,
            "trial_id": trial_id,
            "run_id": run_id,
            "allocation_id": f"{trial_id}.{run_id}",
            "token": sign_trial_token(state.secret, trial_id, run_id),
            "hparams": hparams,
            "config": experiment.config,
            "latest_checkpoint": latest.uuid if latest is not None else None,
            "steps_completed": latest.steps_completed if latest is not None else 0,
            "heartbeat_interval": state.cluster.unmanaged.heartbeat_timeout.total_seconds() / 3,
            "owner": owner,
        }

    answer = await in_transaction(store, work)
    log.info(
        "unmanaged run opened",
        experiment_id=answer["experiment_id"],
        trial_id=answer["trial_id"],
        run_id=answer["run_id"],
    )
    return web.json_response(answer)


def _run_of(request: web.Request) -> tuple[int, int]:
    principal = principal_of(request)
    if principal.kind != "trial" or principal.run_id is None:
        raise forbidden("only an unmanaged run's own token may do this")
    return parse_trial_id(principal.name), principal.run_id


@routes.post(
    "/api/v1/unmanaged/runs/heartbeat",
    allow=RUN_TOKEN,
    body=HeartbeatBody,
    response=RunResponse,
    audit=False,
)
async def heartbeat(request: web.Request) -> web.Response:
    """Records that the run's script is alive; 409 once the run has ended."""
    parse(HeartbeatBody, await read_json(request))
    trial_id, run_id = _run_of(request)
    result = await store_of(request).execute(
        "UPDATE unmanaged_heartbeats SET seen_at = now() WHERE trial_id = $1 AND run_id = $2",
        trial_id,
        run_id,
    )
    if str(result).endswith(" 0"):
        raise not_current(f"run {run_id} of trial {trial_id} is not an open unmanaged run")
    return web.json_response({"trial_id": trial_id, "run_id": run_id, "changed": True})


@routes.post(
    "/api/v1/unmanaged/runs/close",
    allow=RUN_TOKEN,
    body=CloseRunBody,
    response=RunResponse,
)
async def close(request: web.Request) -> web.Response:
    """Ends the run: COMPLETED, or ERROR when the script failed (a repeat changes nothing)."""
    body = parse(CloseRunBody, await read_json(request))
    trial_id, run_id = _run_of(request)
    store = store_of(request)
    experiment = await load_experiment(store, await experiment_of(store, trial_id))
    if not experiment.unmanaged:
        raise forbidden(f"trial {trial_id} is a managed trial: its agent ends its runs")

    async def work(tx: Transaction) -> bool:
        trial = await load_trial(tx, trial_id)
        events = close_run(
            trial, run_id, failed=body.failed, message=body.message, exit_code=body.exit_code
        )
        await append_decided(
            tx,
            trial_stream(trial_id),
            events,
            expected_version=trial.version,
            actor=f"trial:{trial_id}",
        )
        await tx.conn.execute(
            "DELETE FROM unmanaged_heartbeats WHERE trial_id = $1 AND run_id = $2",
            trial_id,
            run_id,
        )
        return bool(events)

    changed = await in_transaction(store, work)
    log.info("unmanaged run closed", trial_id=trial_id, run_id=run_id, failed=body.failed)
    return web.json_response({"trial_id": trial_id, "run_id": run_id, "changed": changed})


async def expire_silent_runs(store: EventStore, timeout: timedelta) -> list[tuple[int, int]]:
    """Ends every open unmanaged run not heard from within ``timeout`` (its trial ERROR);
    returns the (trial, run) pairs it ended."""
    rows = await store.fetch(
        """SELECT trial_id, run_id, extract(epoch FROM now() - seen_at) AS silent
           FROM unmanaged_heartbeats WHERE seen_at < now() - $1::interval""",
        timeout,
    )
    ended: list[tuple[int, int]] = []
    for row in rows:
        trial_id, run_id, silent = int(row["trial_id"]), int(row["run_id"]), float(row["silent"])

        async def work(
            tx: Transaction, trial_id: int = trial_id, run_id: int = run_id, silent: float = silent
        ) -> bool:
            still = await tx.conn.fetchval(
                """DELETE FROM unmanaged_heartbeats
                   WHERE trial_id = $1 AND run_id = $2 AND seen_at < now() - $3::interval
                   RETURNING 1""",
                trial_id,
                run_id,
                timeout,
            )
            if still is None:
                return False  # heard from meanwhile, closed, or expired by another gateway
            trial = await load_trial(tx, trial_id)
            events = expire_run(trial, run_id, silent_seconds=silent)
            await append_decided(
                tx,
                trial_stream(trial_id),
                events,
                expected_version=trial.version,
                actor="unmanaged-heartbeat",
            )
            return bool(events)

        if await in_transaction(store, work):
            ended.append((trial_id, run_id))
            log.warning("unmanaged run expired", trial_id=trial_id, run_id=run_id, silent=silent)
    return ended


@contextlib.asynccontextmanager
async def _expiring(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    timeout = state.cluster.unmanaged.heartbeat_timeout
    every = min(max(timeout.total_seconds() / 4, 0.2), 10.0)

    async def loop() -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await expire_silent_runs(state.store, timeout)
            except (EventsError, ApiError, OSError) as exc:
                log.warning("unmanaged expiry failed", error=str(exc))

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def install(app: web.Application) -> None:
    """Runs :func:`expire_silent_runs` on a timer while ``app`` serves."""
    app.cleanup_ctx.append(_expiring)


__all__ = ["expire_silent_runs", "install", "routes"]
