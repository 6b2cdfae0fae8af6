"""Decisions from the folded cluster state: a pure function, tested as such.

Each call looks at every live trial and answers the questions the log raises: what to do with a
run that exited (complete, requeue, restart from the latest checkpoint, or give up), which runs
must be signalled (pause, cancel, kill, searcher stop), which pending trials get slots now (the
scheduling policy), and which stopping experiments are done. Tasks (commands) share the policy
with trials: a queued task gets its slots by the same priorities, is never preempted, and one
killed before it was placed is canceled. Decisions become events; the next
fold sees them, so calling the planner again on the updated state decides nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from events.domain import lifecycle
from events.domain.aggregates import AllocationView as Run
from events.domain.aggregates import ExperimentView as Experiment
from events.domain.aggregates import TaskView as Task
from events.domain.aggregates import TrialView as Trial
from events.domain.deciders.trial import Outcome
from events.domain.names import (
    agent_stream,
    allocation_id,
    experiment_stream,
    task_allocation_id,
    task_stream,
    trial_stream,
)
from events.domain.types import (
    AgentLost,
    ExperimentStateChanged,
    KillRequested,
    PreemptionRequested,
    SlotsAllocated,
    SlotsReleased,
    TaskAllocated,
    TaskExited,
    TrialExited,
    TrialRestarted,
    TrialStateChanged,
)
from events.domain.types.task import TaskOutcome
from events.log.envelope import Event
from services.scheduler.policy import decide
from services.scheduler.policy.state import (
    Agent,
    Allocate,
    Allocation,
    ClusterView,
    PendingRequest,
    Placement,
    PoolConfig,
    Preempt,
    SchedulerType,
    Slot,
)
from services.scheduler.state import ClusterState

Decision = tuple[str, Event]


@dataclass(frozen=True)
class Settings:
    """Scheduler settings that are not in the log."""

    default_pool: str = "default"
    preemption: bool = True
    scheduler: SchedulerType = "priority"
    task_start_timeout: float = 60.0
    """Seconds after a task's placement by which its agent's heartbeats must list it (see
    :func:`_unlisted`)."""


@dataclass(frozen=True)
class Report:
    """An agent process's latest heartbeat: what it runs as of its heartbeat number ``seq``."""

    incarnation: str
    seq: int
    running: frozenset[str]
    at: float | None = None
    """When the heartbeat was recorded (seconds since the epoch, the database's clock, as the
    log's ``recorded_at``); ``None``: unknown."""


@dataclass(frozen=True)
class Reports:
    """What agents report, read in the scheduler's transaction alongside the folded state.

    ``exits_unfolded`` holds the allocations whose ``TrialExited`` or ``TaskExited`` is in the
    log beyond the folded state: an agent drops a run from its heartbeats only after its exit
    report was committed, so such a run is absent from the heartbeats and must not be declared
    lost.
    """

    agents: Mapping[str, Report] = field(default_factory=dict)
    exits_unfolded: frozenset[str] = frozenset()


def plan(state: ClusterState, settings: Settings, reports: Reports | None = None) -> list[Decision]:
    """Every decision the current state (and the agents' ``reports``) call for, in a
    deterministic order."""
    decisions: list[Decision] = []
    pending: list[Trial] = []
    for trial_id in sorted(state.trials, key=lambda t: state.trials[t].requested_position):
        trial = state.trials[trial_id]
        exp = state.experiments.get(trial.experiment_id)
        if exp is None or not trial.live:
            continue
        run = trial.run
        # One end per run (protocol.md): a run with an exit in the log, its agent's report or
        # an earlier verdict, is never judged lost again, so a report kept across a restart and
        # delivered before the new registration is the run's end and the registration is not.
        if run is not None and run.exited:
            decisions.extend(_after_exit(trial, run, exp))
        elif run is not None and _orphaned(state, run):
            decisions.extend(_lost(trial, run, "agent restarted"))
        elif run is not None and (gone := _forgotten(run, reports)) is not None:
            decisions.extend(_lost(trial, run, gone))
        elif run is not None:
            decisions.extend(_signals(state, trial, run, exp))
        else:
            settled = _unallocated(trial, exp)
            if settled is not None:
                decisions.append(settled)
            elif exp.state == lifecycle.ACTIVE:
                pending.append(trial)
    waiting: list[Task] = []
    for task in sorted(state.tasks.values(), key=lambda t: t.requested_position):
        if task.ended or not task.exists:
            continue
        if task.allocation_id is None:
            if task.kill_requested:
                decisions.append(_task_exit(task, "canceled", "killed before it ran"))
            else:
                waiting.append(task)
        elif _placed_orphaned(state, task.placements, task.allocated_position):
            decisions.append(_task_exit(task, "lost", "agent restarted"))
        elif (unlisted := _unlisted(state, task, reports, settings.task_start_timeout)) is not None:
            decisions.append(_task_exit(task, "lost", unlisted))
    decisions.extend(_allocate(state, pending, settings, waiting))
    decisions.extend(_finish_experiments(state))
    return decisions


def _task_exit(task: Task, outcome: TaskOutcome, message: str) -> Decision:
    event = TaskExited(
        task_id=task.task_id, allocation_id=task.allocation_id, outcome=outcome, message=message
    )
    return task_stream(task.task_id), event


def _unlisted(
    state: ClusterState, task: Task, reports: Reports | None, timeout: float
) -> str | None:
    """Why a task its agent does not list, ``timeout`` seconds after its placement, is lost, or
    ``None`` while it may still start or run.

    An agent lists an allocation in each heartbeat from the moment it receives the start
    command until the run's exit report is committed. So a heartbeat of the very process that
    was registered when the task was placed (a restarted one orphans it instead), recorded
    ``timeout`` seconds or more after the placement, that does not list the task, means the
    agent never received the start (the command was lost) or no longer runs it (its exit
    report was refused). Without this verdict such a task would hold its allocation, ASSIGNED
    or RUNNING, for ever. It is a ``TaskExited`` in the log, decided once: a replay folds it and
    judges nothing again, whatever the heartbeats say then.
    """
    if reports is None or task.allocated_at is None or task.allocation_id in reports.exits_unfolded:
        return None
    placed_at = task.allocated_at.timestamp()
    for agent_id in sorted(task.placements):
        agent = state.agents.get(agent_id)
        report = reports.agents.get(agent_id)
        if agent is None or agent.lost or report is None or report.at is None:
            continue
        if (
            report.incarnation != agent.incarnation
            or report.at - placed_at < timeout
            or task.allocation_id in report.running
        ):
            continue
        if task.started_at is None:
            return (
                f"never started: agent {agent_id} did not receive its start command "
                f"({timeout:g}s after the placement its heartbeat {report.seq} does not list it)"
            )
        return f"agent {agent_id} no longer runs it (heartbeat {report.seq} does not list it)"
    return None


def _state(trial: Trial, state: str, reason: str) -> Decision:
    return trial_stream(trial.trial_id), TrialStateChanged(
        trial_id=trial.trial_id, state=state, reason=reason
    )


def _after_exit(trial: Trial, run: Run, exp: Experiment) -> list[Decision]:
    outcome = run.outcome
    if outcome == "completed" or trial.early_exit is not None:
        return [_state(trial, lifecycle.COMPLETED, "exited")]
    if trial.kill_requested:
        return [_state(trial, lifecycle.CANCELED, "killed by user")]
    if trial.stop_requested:
        return [_state(trial, lifecycle.COMPLETED, "stopped by searcher")]
    if exp.state in lifecycle.STOPPING or run.kill:
        return [_state(trial, lifecycle.CANCELED, exp.state.lower())]
    if outcome in ("preempted", "killed"):
        return [_state(trial, lifecycle.ACTIVE, "requeue")]
    if outcome == "lost" or trial.restarts < exp.settings.max_restarts:
        restarts = trial.restarts + (0 if outcome == "lost" else 1)
        event = TrialRestarted(
            trial_id=trial.trial_id,
            restarts=restarts,
            latest_checkpoint=trial.resume_from,
            reason=f"run {run.run_id} {outcome}",
        )
        return [(trial_stream(trial.trial_id), event)]
    return [_state(trial, lifecycle.ERROR, f"failed {trial.restarts + 1} times (max_restarts)")]


def _orphaned(state: ClusterState, run: Run) -> bool:
    """A run whose agent registered anew after the allocation (the agent restarted) is gone."""
    return _placed_orphaned(state, run.placements, run.position)


def _placed_orphaned(state: ClusterState, placements: Mapping[str, object], position: int) -> bool:
    """Whether an agent of ``placements`` registered anew after ``position`` (it restarted)."""
    for agent_id in placements:
        agent = state.agents.get(agent_id)
        if agent is not None and agent.registered_position > position:
            return True
    return False


def _forgotten(run: Run, reports: Reports | None) -> str | None:
    """Why a run its agent process no longer runs is lost, or ``None`` while it may still run.

    The agent that started the run promised that each of its heartbeats from number
    ``listed_from`` on lists the run until its exit is reported. So a heartbeat from that same
    process, numbered at least that, without the run means the agent lost it, while an earlier
    heartbeat (computed before the agent knew of the run, however late it arrived) proves
    nothing, and neither does one from another process (a new process re-registers, which
    ``_orphaned`` handles). Runs not yet started are never judged here: the agent may not have
    received the start command yet.
    """
    starter = run.started_by
    if reports is None or starter is None or run.allocation_id in reports.exits_unfolded:
        return None
    report = reports.agents.get(starter.agent_id)
    if (
        report is None
        or report.incarnation != starter.incarnation
        or report.seq < starter.listed_from
        or run.allocation_id in report.running
    ):
        return None
    return f"agent {starter.agent_id} no longer runs it (heartbeat {report.seq})"


def _lost(trial: Trial, run: Run, message: str) -> list[Decision]:
    return run_ended(trial, run, message)


def run_ended(trial: Trial, run: Run, message: str, outcome: Outcome = "lost") -> list[Decision]:
    """The exit of ``run`` decided for it, not reported by its agent (``TrialExited`` with
    ``outcome`` and ``SlotsReleased``)."""
    stream = trial_stream(trial.trial_id)
    return [
        (
            stream,
            TrialExited(
                trial_id=trial.trial_id,
                run_id=run.run_id,
                allocation_id=run.allocation_id,
                outcome=outcome,
                message=message,
            ),
        ),
        (
            stream,
            SlotsReleased(
                trial_id=trial.trial_id, allocation_id=run.allocation_id, placements=run.placements
            ),
        ),
    ]


def _signals(state: ClusterState, trial: Trial, run: Run, exp: Experiment) -> list[Decision]:
    agents = sorted(run.placements)
    if (exp.state == lifecycle.STOPPING_KILLED or trial.kill_requested) and not run.kill:
        kill = KillRequested(
            trial_id=trial.trial_id,
            allocation_id=run.allocation_id,
            reason="killed by user" if trial.kill_requested else "kill",
            agent_ids=agents,
        )
        return [(trial_stream(trial.trial_id), kill)]
    if run.preemption is not None or run.kill:
        return []
    reason = None
    if trial.stop_requested:
        reason = "searcher stop"
    elif any(
        a in state.agents and state.agents[a].evicting(slots) for a, slots in run.placements.items()
    ):
        reason = "slots disabled"
    elif exp.state == lifecycle.PAUSED or exp.state in lifecycle.STOPPING:
        reason = exp.state.lower()
    if reason is None:
        return []
    event = PreemptionRequested(
        trial_id=trial.trial_id, allocation_id=run.allocation_id, reason=reason, agent_ids=agents
    )
    return [(trial_stream(trial.trial_id), event)]


def _unallocated(trial: Trial, exp: Experiment) -> Decision | None:
    if trial.kill_requested:
        return _state(trial, lifecycle.CANCELED, "killed by user before running")
    if trial.stop_requested:
        return _state(trial, lifecycle.COMPLETED, "stopped by searcher before running")
    if exp.state in lifecycle.STOPPING:
        return _state(trial, lifecycle.CANCELED, exp.state.lower())
    return None


def _allocate(
    state: ClusterState, pending: list[Trial], settings: Settings, waiting: list[Task]
) -> list[Decision]:
    if not pending and not waiting:
        return []
    pool_of = {
        e.experiment_id: e.settings.pool or settings.default_pool
        for e in state.experiments.values()
    }
    placeable = [a for a in sorted(state.agents.values(), key=lambda a: a.agent_id) if a.placeable]
    reserved = {
        a.reserved_for: a.pool or settings.default_pool for a in placeable if a.reserved_for
    }

    def pool_of_request(pool: str, request_id: str) -> str:
        return reserved_pool(pool, request_id) if reserved.get(request_id) == pool else pool

    agents = tuple(
        Agent(
            id=a.agent_id,
            resource_pool=(
                reserved_pool(a.pool or settings.default_pool, a.reserved_for)
                if a.reserved_for
                else a.pool or settings.default_pool
            ),
            slots=tuple(Slot(s, device_type="cpu") for s in a.usable_slots()),
        )
        for a in placeable
    )
    allocations = []
    for trial in state.trials.values():
        run = trial.run
        if run is None or run.exited:
            continue
        exp = state.experiments[trial.experiment_id]
        allocations.append(
            Allocation(
                request_id=run.allocation_id,
                experiment_id=str(exp.experiment_id),
                placements=tuple(Placement(a, tuple(s)) for a, s in sorted(run.placements.items())),
                resource_pool=pool_of_request(pool_of[exp.experiment_id], run.allocation_id),
                priority=exp.settings.priority,
                order=run.position,
                preemption_requested=run.preemption is not None or run.kill,
                weight=exp.settings.weight,
            )
        )
    for task in state.tasks.values():
        if task.allocated and task.allocation_id is not None:
            allocations.append(
                Allocation(
                    request_id=task.allocation_id,
                    experiment_id=task_stream(task.task_id),
                    placements=tuple(
                        Placement(a, tuple(s)) for a, s in sorted(task.placements.items())
                    ),
                    resource_pool=pool_of_request(
                        task.config.resources.resource_pool or settings.default_pool,
                        task.allocation_id,
                    ),
                    priority=task.config.resources.priority,
                    order=task.allocated_position,
                    preemptible=False,
                )
            )
    requests = []
    by_request: dict[str, Trial] = {}
    tasks: dict[str, Task] = {}
    for task in waiting:
        request_id = task_allocation_id(task.task_id)
        tasks[request_id] = task
        resources = task.config.resources
        requests.append(
            PendingRequest(
                request_id=request_id,
                experiment_id=task_stream(task.task_id),
                slots_needed=resources.slots,
                order=task.requested_position,
                priority=resources.priority,
                resource_pool=pool_of_request(
                    resources.resource_pool or settings.default_pool, request_id
                ),
                preemptible=False,
            )
        )
    for trial in pending:
        exp = state.experiments[trial.experiment_id]
        request_id = allocation_id(trial.trial_id, trial.run_id + 1)
        by_request[request_id] = trial
        requests.append(
            PendingRequest(
                request_id=request_id,
                experiment_id=str(exp.experiment_id),
                slots_needed=exp.settings.slots_per_trial,
                order=trial.requested_position,
                trial_id=trial.trial_id,
                priority=exp.settings.priority,
                weight=exp.settings.weight,
                resource_pool=pool_of_request(pool_of[exp.experiment_id], request_id),
                max_slots=exp.settings.max_slots,
            )
        )
    pools = (
        {a.resource_pool for a in agents}
        | set(pool_of.values())
        | {r.resource_pool for r in requests}
    )
    view = ClusterView(
        agents=agents,
        pending=tuple(requests),
        allocations=tuple(allocations),
        pools=tuple(
            PoolConfig(name=p, scheduler=settings.scheduler, preemption=settings.preemption)
            for p in sorted(pools)
        ),
        default_pool=settings.default_pool,
    )
    decisions: list[Decision] = []
    running = {a.request_id: a for a in allocations}
    for decision in decide(view):
        if isinstance(decision, Allocate) and decision.request_id in tasks:
            task = tasks[decision.request_id]
            if len(decision.placements) != 1:
                continue  # a task runs on one agent: it waits for one with enough free slots
            placed = TaskAllocated(
                task_id=task.task_id,
                allocation_id=decision.request_id,
                placements={p.agent_id: list(p.slot_ids) for p in decision.placements},
            )
            decisions.append((task_stream(task.task_id), placed))
        elif isinstance(decision, Allocate):
            trial = by_request[decision.request_id]
            event = SlotsAllocated(
                trial_id=trial.trial_id,
                allocation_id=decision.request_id,
                placements={p.agent_id: list(p.slot_ids) for p in decision.placements},
                run_id=trial.run_id + 1,
            )
            decisions.append((trial_stream(trial.trial_id), event))
        elif isinstance(decision, Preempt):
            victim = running[decision.request_id]
            trial_id = state.allocations[decision.request_id]
            decisions.append(
                (
                    trial_stream(trial_id),
                    PreemptionRequested(
                        trial_id=trial_id,
                        allocation_id=decision.request_id,
                        reason=f"priority: {decision.reason}",
                        agent_ids=sorted(p.agent_id for p in victim.placements),
                    ),
                )
            )
    return decisions


def reserved_pool(pool: str, allocation_id: str) -> str:
    """The pool the planner puts an agent reserved for ``allocation_id`` in, with that
    allocation's request alone: such an agent (a Slurm job's, started for one allocation) is
    given that allocation and nothing else, and the allocation only such agents."""
    return f"{pool}/{allocation_id}"


def _finish_experiments(state: ClusterState) -> list[Decision]:
    decisions: list[Decision] = []
    for exp_id in sorted(state.experiments):
        exp = state.experiments[exp_id]
        if exp.state not in lifecycle.STOPPING:
            continue
        if any(state.trials[t].live for t in exp.trials):
            continue
        final = lifecycle.STOPPED[exp.state]
        event = ExperimentStateChanged(experiment_id=exp_id, state=final, reason="all trials done")
        decisions.append((experiment_stream(exp_id), event))
    return decisions


def reap(
    state: ClusterState, last_beat: dict[str, float], now: float, timeout: float
) -> list[Decision]:
    """Agents silent for longer than ``timeout`` are lost, and so are the runs they held.

    ``last_beat`` maps agent id to the time of its latest heartbeat (agents that never beat are
    judged by the time they registered, which the caller supplies the same way).
    """
    decisions: list[Decision] = []
    for agent_id in sorted(state.agents):
        agent = state.agents[agent_id]
        beat = last_beat.get(agent_id)
        if agent.lost or beat is None or now - beat <= timeout:
            continue
        decisions.append((agent_stream(agent_id), AgentLost(agent_id=agent_id)))
        for trial in sorted(state.trials.values(), key=lambda t: t.requested_position):
            run = trial.run
            if run is None or run.exited or agent_id not in run.placements:
                continue
            decisions.extend(_lost(trial, run, f"agent {agent_id} stopped heartbeating"))
        for task in sorted(state.tasks.values(), key=lambda t: t.requested_position):
            if task.allocated and agent_id in task.placements:
                message = f"agent {agent_id} stopped heartbeating"
                decisions.append(_task_exit(task, "lost", message))
    return decisions
