"""A task's allocation as its agent sees it: the launch spec, the started and exited reports, the
output lines. The allocation routes (:mod:`services.api.routes_allocations`) hand an allocation
id of a task (``task-<id>.<run>``) here, so an agent launches a command through the same
endpoints, the same runtime and the same confinement as a trial's run.

Only an agent holding the allocation (or an admin) may call these: a task's process gets no
token at all, so nothing it runs can report as the task or read another's spec. Each report is
applied once (the inbox claims the allocation, as for a trial's run), and its events are decided
by :mod:`events.domain.deciders.task` over the stream version folded here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web

from events.domain.aggregates import TaskView
from events.domain.deciders import Decision
from events.domain.deciders.task import (
    SERVING_KINDS,
    ReportTaskExited,
    ReportTaskIdle,
    ReportTaskReady,
    ReportTaskStarted,
    decide_task_exited,
    decide_task_idle,
    decide_task_ready,
    decide_task_started,
)
from events.domain.names import task_stream
from events.log.store import Transaction
from services.api.auth import check_agent, check_holder, principal_of, sign_serve_token
from services.api.decided import accepted, append_decided
from services.api.errors import forbidden, not_found, parse, read_json
from services.api.identities import identity_for_run
from services.api.inbox import claim, in_transaction, record
from services.api.log_lines import store_lines
from services.api.routes_agents import check_incarnation
from services.api.routes_master import cluster_id as load_cluster_id
from services.api.routes_tasks import load_task
from services.api.routing import state_of, store_of
from services.api.views import Reader, environment_variables, load_experiment
from services.contracts.agent import (
    ExitedBody,
    IdleBody,
    LogsBody,
    ReadyBody,
    SpecQuery,
    SpecResponse,
    StartedBody,
    TensorboardSpecSource,
)

log = structlog.get_logger("api")


async def _held(request: web.Request, task_id: str, allocation_id: str) -> TaskView:
    """The task, if ``allocation_id`` is its allocation and the caller may act for it."""
    principal = principal_of(request)
    if principal.kind == "trial":
        raise forbidden("a trial's token has no business with a task's allocation")
    task = await load_task(store_of(request), task_id)
    if task.allocation_id != allocation_id:
        raise not_found(f"no allocation {allocation_id}")
    check_holder(principal, allocation_id, task.run_id, task.placements)
    return task


async def spec(request: web.Request, task_id: str) -> web.Response:
    """The launch spec of the task's allocation (``active: false`` once it ended)."""
    allocation_id = request.match_info["allocation_id"]
    task = await _held(request, task_id, allocation_id)
    query = parse(SpecQuery, dict(request.query))
    principal = principal_of(request)
    if principal.kind == "agent":
        check_agent(principal, query.agent_id or principal.name)
    agent_id = query.agent_id or (
        principal.name if principal.kind == "agent" else next(iter(task.placements), None)
    )
    state = state_of(request)
    identity = await identity_for_run(state.store, task.owner)
    config = task.config.model_dump(mode="json")
    body = SpecResponse(
        active=not task.ended,
        allocation_id=allocation_id,
        trial_id=0,
        experiment_id=0,
        run_id=task.run_id,
        entrypoint=list(task.argv),
        code_ref=task.code_ref,
        hparams={},
        trial_seed=0,
        latest_checkpoint=None,
        steps_completed=0,
        token="",
        checkpoint_storage=None,
        environment_variables=environment_variables(config, "cpu"),
        slot_ids=list(task.placements.get(agent_id or "", [])),
        placements=task.placements,
        config=config,
        user=task.owner,
        cluster_id=await load_cluster_id(state.store),
        agent_user_group=identity.to_json(),
        task_id=task_id,
        task_kind=task.kind,
        tensorboard_sources=await _tensorboard_sources(state.store, task),
        serve_token=(
            sign_serve_token(state.secret, task_id, allocation_id)
            if task.kind in SERVING_KINDS
            else None
        ),
    )
    return web.json_response(body.model_dump(mode="json"))


async def _tensorboard_sources(reader: Reader, task: TaskView) -> list[TensorboardSpecSource]:
    """Each experiment a TensorBoard shows, with its storage as its trials get it (the
    credentials are the experiment's config's, never the task's request's)."""
    out = []
    for source in task.tensorboard_sources:
        experiment = await load_experiment(reader, source.experiment_id, with_trials=False)
        storage = experiment.config.get("checkpoint_storage")
        out.append(
            TensorboardSpecSource(
                experiment_id=source.experiment_id,
                trial_ids=source.trial_ids,
                checkpoint_storage=dict(storage) if isinstance(storage, dict) else None,
            )
        )
    return out


async def _report_once(
    request: web.Request,
    source: str,
    task_id: str,
    body: StartedBody | ExitedBody | ReadyBody | IdleBody,
    decide: Callable[[TaskView], Decision],
) -> dict[str, Any]:
    """An agent's report, applied once per allocation (repeats get the first answer back)."""
    allocation_id = request.match_info["allocation_id"]
    principal = principal_of(request)
    check_agent(principal, body.agent_id)
    if isinstance(body, StartedBody):
        check_incarnation(principal, body.incarnation)
    await _held(request, task_id, allocation_id)

    async def work(tx: Transaction) -> dict[str, Any]:
        fresh, previous = await claim(tx, source, allocation_id)
        if not fresh:
            return {**(previous or {}), "duplicate": True}
        task = await load_task(tx, task_id)
        events = accepted(decide(task))
        await append_decided(
            tx,
            task_stream(task_id),
            events,
            expected_version=task.version,
            actor=f"agent:{body.agent_id}",
            causation_id=body.idempotency_key,
        )
        outcome = next((getattr(e, "outcome", None) for e in events), None)
        result = {
            "allocation_id": allocation_id,
            "appended": [event.event_type for event in events],
            "duplicate": False,
            "outcome": outcome,
        }
        await record(tx, source, allocation_id, result)
        return result

    return await in_transaction(store_of(request), work)


async def started(request: web.Request, task_id: str) -> web.Response:
    """Appends TaskStarted once per allocation."""
    body = parse(StartedBody, await read_json(request))
    command = ReportTaskStarted(request.match_info["allocation_id"], body.agent_id)
    result = await _report_once(
        request,
        "api.task.started",
        task_id,
        body,
        lambda task: decide_task_started(task, command),
    )
    return web.json_response(result)


async def exited(request: web.Request, task_id: str) -> web.Response:
    """Appends TaskExited (its outcome from the exit code and a pending kill) once."""
    body = parse(ExitedBody, await read_json(request))
    command = ReportTaskExited(
        request.match_info["allocation_id"],
        body.agent_id,
        body.exit_code,
        body.message,
        agent_shutdown=body.agent_shutdown,
    )
    result = await _report_once(
        request, "api.task.exited", task_id, body, lambda task: decide_task_exited(task, command)
    )
    if result["appended"] and not result["duplicate"]:
        log.info("task exited", task_id=task_id, outcome=result["outcome"])
    return web.json_response(result)


async def ready(request: web.Request, task_id: str) -> web.Response:
    """Appends TaskReady (the address the proxy forwards to) once per allocation."""
    body = parse(ReadyBody, await read_json(request))
    command = ReportTaskReady(
        request.match_info["allocation_id"], body.agent_id, body.address, body.port
    )
    result = await _report_once(
        request, "api.task.ready", task_id, body, lambda task: decide_task_ready(task, command)
    )
    if result["appended"] and not result["duplicate"]:
        log.info("task ready", task_id=task_id, agent_id=body.agent_id)
    return web.json_response(result)


async def idle(request: web.Request, task_id: str) -> web.Response:
    """Appends TaskKillRequested when the task was idle past its ``idle_timeout`` (once)."""
    body = parse(IdleBody, await read_json(request))
    command = ReportTaskIdle(request.match_info["allocation_id"], body.agent_id, body.idle_seconds)
    result = await _report_once(
        request, "api.task.idle", task_id, body, lambda task: decide_task_idle(task, command)
    )
    if result["appended"] and not result["duplicate"]:
        log.info("idle task killed", task_id=task_id, idle_seconds=body.idle_seconds)
    return web.json_response(result)


async def logs(request: web.Request, task_id: str) -> web.Response:
    """Stores a batch of the task's output lines (rows with ``task_id`` set and no
    ``trial_id``), once per ``idempotency_key``."""
    allocation_id = request.match_info["allocation_id"]
    body = parse(LogsBody, await read_json(request))
    await _held(request, task_id, allocation_id)
    return await store_lines(request, allocation_id, "task_id", task_id, body)


async def preemption(request: web.Request, task_id: str) -> web.Response:
    """Answers at once (a task is never preempted): ``preempt`` once a kill was asked for,
    ``current: false`` once the task ended."""
    task = await _held(request, task_id, request.match_info["allocation_id"])
    return web.json_response(
        {"preempt": task.kill_requested or task.ended, "current": not task.ended}
    )
