"""Allocations (one run of a trial): spec, started/exited reports, logs, preemption long poll,
and an agent's request to preempt the run when its resource manager (Slurm) signals its job.

A task's allocation (``task-<id>.<run>``) is served by :mod:`services.api.task_runs` through the
same endpoints, so an agent launches and reports a command as it does a trial's run."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from events.domain.deciders import Decision
from events.domain.deciders.trial import (
    ReportExited,
    ReportStarted,
    RequestPendingPreemption,
    decide_exited,
    decide_pending_preemption,
    decide_started,
    outcome_of,
)
from events.domain.names import task_of_allocation, trial_stream
from events.log.envelope import Event
from events.log.store import Transaction
from services.api import task_runs
from services.api.access import MAX_POLL_SECONDS, POLL_EVERY, allocation_of_path
from services.api.auth import (
    check_agent,
    check_holder,
    principal_of,
    sign_trial_token,
)
from services.api.decided import append_accepted
from services.api.errors import not_found, parse, read_json
from services.api.identities import identity_for_run
from services.api.inbox import claim, in_transaction, record
from services.api.limits import BATCH_MAX_BODY
from services.api.log_lines import store_lines
from services.api.routes_agents import check_incarnation
from services.api.routes_master import cluster_id as load_cluster_id
from services.api.routing import AGENTS, TRIAL_OR_AGENT, RouteTable, state_of, store_of
from services.api.runs import load_run_state
from services.api.views import (
    AllocationView,
    TrialView,
    allocation_of,
    build_spec,
    experiment_of,
    load_agent,
    load_experiment,
    load_trial,
    refresh_trial,
)
from services.contracts.agent import (
    ExitedBody,
    IdleBody,
    LogsBody,
    LogsResponse,
    PendingPreemptionBody,
    PreemptionQuery,
    PreemptionResponse,
    ReadyBody,
    ReportResponse,
    SpecQuery,
    SpecResponse,
    StartedBody,
)

log = structlog.get_logger("api")
routes = RouteTable("allocations")

TrialAllocationHandler = Callable[[web.Request, str, int], Awaitable[web.Response]]
"""A handler of a trial's allocation: the request, the allocation id and its trial id."""
TaskAllocationHandler = Callable[[web.Request, str], Awaitable[web.Response]]
"""A handler of a task's allocation: the request and the task id."""


def _trial_or_task(
    task_handler: TaskAllocationHandler,
) -> Callable[[TrialAllocationHandler], Callable[[web.Request], Awaitable[web.Response]]]:
    """Serves the allocation of the path: a task's with ``task_handler``, a trial's with the
    decorated handler, given the allocation id and its trial id (a trial token: its own trial's
    only, 403 otherwise)."""

    def wrap(handler: TrialAllocationHandler) -> Callable[[web.Request], Awaitable[web.Response]]:
        @functools.wraps(handler)
        async def route(request: web.Request) -> web.Response:
            task_id = task_of_allocation(request.match_info["allocation_id"])
            if task_id is not None:
                return await task_handler(request, task_id)
            allocation_id, trial_id = allocation_of_path(request)
            return await handler(request, allocation_id, trial_id)

        return route

    return wrap


@routes.get(
    "/api/v1/allocations/{allocation_id}/spec",
    allow=TRIAL_OR_AGENT,
    query=SpecQuery,
    response=SpecResponse,
)
@_trial_or_task(task_runs.spec)
async def spec(request: web.Request, allocation_id: str, trial_id: int) -> web.Response:
    """The run's launch spec, folded from the trial and experiment streams."""
    query = parse(SpecQuery, dict(request.query))
    state = state_of(request)
    trial = await load_trial(state.store, trial_id)
    alloc = allocation_of(trial, allocation_id)
    principal = principal_of(request)
    check_holder(principal, allocation_id, alloc.run_id, alloc.placements)
    if principal.kind == "agent":
        check_agent(principal, query.agent_id or principal.name)
    experiment = await load_experiment(
        state.store, await experiment_of(state.store, trial_id), trial_id=trial_id
    )
    device = "cpu"
    agent_id = query.agent_id or (
        principal.name
        if principal.kind == "agent"
        else next(iter(alloc.placements))
        if len(alloc.placements) == 1
        else None
    )
    if agent_id is not None and agent_id in alloc.placements:
        agent = await load_agent(state.store, agent_id)
        wanted = set(alloc.placements[agent_id])
        if agent.registration is not None and any(
            s.device == "cuda" for s in agent.registration.slots if s.slot_id in wanted
        ):
            device = "cuda"
    identity = await identity_for_run(state.store, experiment.owner) if experiment.owner else None
    body = build_spec(
        experiment,
        trial,
        allocation_id,
        agent_id=agent_id,
        device=device,
        token=sign_trial_token(state.secret, trial_id, alloc.run_id),
        cluster_id=await load_cluster_id(state.store),
        agent_user_group=identity.to_json() if identity is not None else None,
    )
    return web.json_response(body.model_dump(mode="json", exclude_unset=True))


@routes.post(
    "/api/v1/allocations/{allocation_id}/started",
    allow=AGENTS,
    body=StartedBody,
    response=ReportResponse,
)
@_trial_or_task(task_runs.started)
async def started(request: web.Request, allocation_id: str, trial_id: int) -> web.Response:
    """Appends TrialStarted once per allocation (repeats return the first answer)."""
    body = parse(StartedBody, await read_json(request))
    store = state_of(request).store
    experiment = await load_experiment(
        store, await experiment_of(store, trial_id), trial_id=trial_id
    )
    requested = experiment.trials.get(trial_id)
    warm_start = requested.warm_start_checkpoint if requested is not None else None

    command = ReportStarted(
        agent_id=body.agent_id,
        incarnation=body.incarnation,
        listed_from=body.listed_from,
        warm_start_checkpoint=warm_start,
    )

    result = await _report_once(
        request,
        "api.allocation.started",
        allocation_id,
        trial_id,
        body,
        lambda trial, alloc: decide_started(trial, alloc, command),
    )
    if result["appended"] and not result["duplicate"]:
        log.info("trial started", allocation_id=allocation_id, agent_id=body.agent_id)
    return web.json_response(result)


@routes.post(
    "/api/v1/allocations/{allocation_id}/exited",
    allow=AGENTS,
    body=ExitedBody,
    response=ReportResponse,
)
@_trial_or_task(task_runs.exited)
async def exited(request: web.Request, allocation_id: str, trial_id: int) -> web.Response:
    """Appends TrialExited (outcome from pending preempt/kill and the exit code) and
    SlotsReleased, once per allocation."""
    body = parse(ExitedBody, await read_json(request))

    command = ReportExited(
        agent_id=body.agent_id,
        exit_code=body.exit_code,
        message=body.message,
        agent_shutdown=body.agent_shutdown,
    )

    result = await _report_once(
        request,
        "api.allocation.exited",
        allocation_id,
        trial_id,
        body,
        lambda trial, alloc: decide_exited(trial, alloc, command),
        describe=lambda events: {"outcome": outcome_of(events)},
    )
    if result["appended"] and not result["duplicate"]:
        log.info("trial exited", allocation_id=allocation_id, outcome=result["outcome"])
    return web.json_response(result)


@routes.post(
    "/api/v1/allocations/{allocation_id}/signals/pending_preemption",
    allow=AGENTS,
    body=PendingPreemptionBody,
    response=ReportResponse,
)
async def pending_preemption(request: web.Request) -> web.Response:
    """Appends PreemptionRequested for the run (as the scheduler does when it preempts), asked
    by an agent whose resource manager signalled its job; nothing once a preemption or kill is
    pending. 403 for an agent holding no slots in the run; 404 for an unknown allocation (and a
    task's: a task is not preempted)."""
    body = parse(PendingPreemptionBody, await read_json(request))
    allocation_id, trial_id = allocation_of_path(request)
    principal = principal_of(request)
    check_agent(principal, body.agent_id)
    trial = await load_trial(store_of(request), trial_id)
    alloc = allocation_of(trial, allocation_id)
    check_holder(principal, allocation_id, alloc.run_id, alloc.placements)
    command = RequestPendingPreemption(agent_id=body.agent_id, reason=body.reason)

    async def work(tx: Transaction) -> dict[str, Any]:
        trial = await load_trial(tx, trial_id)
        events = await append_accepted(
            tx,
            trial_stream(trial_id),
            decide_pending_preemption(trial, allocation_of(trial, allocation_id), command),
            expected_version=trial.version,
            actor=f"agent:{body.agent_id}",
            causation_id=body.idempotency_key,
        )
        return {
            "allocation_id": allocation_id,
            "appended": [event.event_type for event in events],
            "duplicate": not events,
        }

    result = await in_transaction(store_of(request), work)
    if result["appended"]:
        log.info(
            "preemption requested by the resource manager",
            allocation_id=allocation_id,
            agent_id=body.agent_id,
            reason=body.reason,
        )
    return web.json_response(result)


async def _report_once(
    request: web.Request,
    source: str,
    allocation_id: str,
    trial_id: int,
    body: StartedBody | ExitedBody,
    decide_report: Callable[[TrialView, AllocationView], Decision],
    *,
    describe: Callable[[list[Event]], dict[str, Any]] = lambda _: {},
) -> dict[str, Any]:
    """An agent's report on an allocation, applied once: the first call claims the allocation
    in the inbox, appends what ``decide_report`` decides over the trial's fold (a refusal, e.g.
    from an agent holding no slots in it, rolls the claim back) against the trial's version and
    records the answer (with what ``describe`` adds); repeats get the recorded answer back."""

    principal = principal_of(request)
    check_agent(principal, body.agent_id)
    if isinstance(body, StartedBody):
        check_incarnation(principal, body.incarnation)

    async def work(tx: Transaction) -> dict[str, Any]:
        fresh, previous = await claim(tx, source, allocation_id)
        if not fresh:
            return {**(previous or {}), "duplicate": True}
        trial = await load_trial(tx, trial_id)
        alloc = allocation_of(trial, allocation_id)
        events = await append_accepted(
            tx,
            trial_stream(trial_id),
            decide_report(trial, alloc),
            expected_version=trial.version,
            actor=f"agent:{body.agent_id}",
            causation_id=body.idempotency_key,
        )
        result = {
            "allocation_id": allocation_id,
            "appended": [event.event_type for event in events],
            "duplicate": False,
            **describe(events),
        }
        await record(tx, source, allocation_id, result)
        return result

    return await in_transaction(store_of(request), work)


@routes.post(
    "/api/v1/allocations/{allocation_id}/logs",
    allow=TRIAL_OR_AGENT,
    audit=False,
    body=LogsBody,
    response=LogsResponse,
    max_body=BATCH_MAX_BODY,
)
@_trial_or_task(task_runs.logs)
async def logs(request: web.Request, allocation_id: str, trial_id: int) -> web.Response:
    """Stores a batch of log lines in one statement (table ``task_logs``): for an allocation
    the scheduler made, and from a trial's own token only while it is the live run (409
    otherwise; the agent may still ship a run's last lines after it exited)."""
    body = parse(LogsBody, await read_json(request))
    runs = await load_run_state(store_of(request), trial_id)
    runs.check_allocation(allocation_id, live=principal_of(request).kind == "trial")
    alloc = runs.trial.allocations[allocation_id]
    check_holder(principal_of(request), allocation_id, alloc.run_id, alloc.placements)
    return await store_lines(request, allocation_id, "trial_id", trial_id, body)


def _task_of(request: web.Request) -> str:
    """The task of the path's allocation; 404 for a trial's (only tasks serve or idle)."""
    allocation_id = request.match_info["allocation_id"]
    task_id = task_of_allocation(allocation_id)
    if task_id is None:
        raise not_found(f"no task allocation {allocation_id[:60]!r}")
    return task_id


@routes.post(
    "/api/v1/allocations/{allocation_id}/ready",
    allow=AGENTS,
    body=ReadyBody,
    response=ReportResponse,
)
async def ready(request: web.Request) -> web.Response:
    """Appends TaskReady once per task allocation: its server accepts connections at the
    address the proxy then forwards to."""
    parse(ReadyBody, await read_json(request))  # a bad body is a 400 on any allocation
    return await task_runs.ready(request, _task_of(request))


@routes.post(
    "/api/v1/allocations/{allocation_id}/idle",
    allow=AGENTS,
    body=IdleBody,
    response=ReportResponse,
)
async def idle(request: web.Request) -> web.Response:
    """Kills a task idle past its ``idle_timeout`` (TaskKillRequested naming it), once."""
    parse(IdleBody, await read_json(request))
    return await task_runs.idle(request, _task_of(request))


@routes.get(
    "/api/v1/allocations/{allocation_id}/signals/preemption",
    allow=TRIAL_OR_AGENT,
    query=PreemptionQuery,
    response=PreemptionResponse,
)
@_trial_or_task(task_runs.preemption)
async def preemption(request: web.Request, allocation_id: str, trial_id: int) -> web.Response:
    """Long poll: answers ``preempt: true`` as soon as the run is asked to stop (preempt or kill
    requested, or the allocation is no longer current), else ``false`` after the timeout."""
    query = parse(PreemptionQuery, dict(request.query))
    deadline = time.monotonic() + min(query.timeout_seconds, MAX_POLL_SECONDS)
    store = store_of(request)
    trial = await load_trial(store, trial_id)
    first = allocation_of(trial, allocation_id)
    check_holder(principal_of(request), allocation_id, first.run_id, first.placements)
    while True:
        alloc = trial.allocations[allocation_id]
        if not trial.is_current(allocation_id):
            return web.json_response({"preempt": True, "current": False})
        if alloc.preempt or alloc.kill:
            return web.json_response({"preempt": True, "current": True})
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return web.json_response({"preempt": False, "current": True})
        await asyncio.sleep(min(POLL_EVERY, remaining))
        await refresh_trial(store, trial)
