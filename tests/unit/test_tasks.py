"""Command tasks in the log: the task fold, its deciders, and the planner placing tasks."""

from __future__ import annotations

from typing import Any

from events.domain.aggregates import fold_task
from events.domain.aggregates.task import ASSIGNED, QUEUED, RUNNING, TERMINATED
from events.domain.commands import derive
from events.domain.deciders import Refusal
from events.domain.deciders.task import (
    KillTask,
    ReportTaskExited,
    ReportTaskStarted,
    RunCommand,
    StartNotebook,
    StartShell,
    decide_kill_task,
    decide_run_command,
    decide_start_notebook,
    decide_start_shell,
    decide_task_exited,
    decide_task_started,
)
from events.domain.names import task_allocation_id, task_of_allocation, task_stream
from events.domain.types import (
    AgentRegistered,
    TaskAllocated,
    TaskExited,
    TaskRequested,
    TaskStarted,
)
from events.domain.types.agent import Slot
from events.log.envelope import Event
from services.scheduler.planner import Report, Reports, Settings, plan, reap
from services.scheduler.state import ClusterState
from tests.unit.test_planner import Log, agent, experiment, types

TASK = "0123456789abcdef"
ALLOC = task_allocation_id(TASK)


def request(log: Log, task_id: str = TASK, **resources: Any) -> None:
    config = {"resources": resources} if resources else {}
    events = decide_run_command(
        fold_task(task_id, []),
        RunCommand(task_id=task_id, owner="alice", argv=("python", "prep.py"), config=config),
    )
    assert not isinstance(events, Refusal)
    for event in events:
        log.add(task_stream(task_id), event)


def task_events(log: Log, task_id: str = TASK) -> list[Any]:
    return [e for e in log.events if e.stream_id == task_stream(task_id)]


def test_task_fold_goes_queued_assigned_running_terminated() -> None:
    """The fold follows a command from request to exit and ignores anything after its exit."""
    log = Log()
    request(log)
    assert fold_task(TASK, task_events(log)).state == QUEUED
    log.add(task_stream(TASK), TaskAllocated(task_id=TASK, allocation_id=ALLOC, placements={}))
    assert fold_task(TASK, task_events(log)).state == ASSIGNED
    log.add(task_stream(TASK), TaskStarted(task_id=TASK, allocation_id=ALLOC, agent_id="a"))
    assert fold_task(TASK, task_events(log)).state == RUNNING
    log.add(
        task_stream(TASK),
        TaskExited(task_id=TASK, allocation_id=ALLOC, outcome="failed", exit_code=3),
    )
    log.add(task_stream(TASK), TaskAllocated(task_id=TASK, allocation_id="x", placements={}))
    view = fold_task(TASK, task_events(log))
    assert (view.state, view.exit_code, view.outcome, view.allocation_id) == (
        TERMINATED,
        3,
        "failed",
        ALLOC,
    )


def test_run_command_refuses_bad_config_naming_the_field() -> None:
    """A negative slot count, an unknown field and an empty argv are refused with their path."""
    empty = fold_task(TASK, [])
    bad_slots = decide_run_command(
        empty, RunCommand(TASK, "alice", ("true",), {"resources": {"slots": -1}})
    )
    assert isinstance(bad_slots, Refusal) and bad_slots.field == "config.resources.slots"
    unknown = decide_run_command(empty, RunCommand(TASK, "alice", ("true",), {"bogus": 1}))
    assert isinstance(unknown, Refusal) and unknown.field == "config.bogus"
    no_argv = decide_run_command(empty, RunCommand(TASK, "alice", ()))
    assert isinstance(no_argv, Refusal) and no_argv.field == "argv"
    bad_id = decide_run_command(empty, RunCommand("../x", "alice", ("true",)))
    assert isinstance(bad_id, Refusal) and bad_id.reason == "invalid"


def test_run_command_records_validated_config_with_defaults() -> None:
    """The accepted config is recorded with its defaults (one slot, default priority)."""
    events = decide_run_command(fold_task(TASK, []), RunCommand(TASK, "alice", ("echo", "hi")))
    assert not isinstance(events, Refusal)
    (requested,) = events
    assert isinstance(requested, TaskRequested)
    assert requested.config["resources"]["slots"] == 1
    assert (requested.kind, requested.owner, requested.description) == (
        "command",
        "alice",
        "echo hi",
    )


def test_a_task_is_requested_and_folded_in_the_workspace_it_was_started_in() -> None:
    """Each kind's decider records the command's workspace (the default one when it names
    none) and the fold keeps it."""
    empty = fold_task(TASK, [])
    decisions = [
        decide_run_command(empty, RunCommand(TASK, "alice", ("true",), workspace_id=4)),
        decide_start_notebook(empty, StartNotebook(TASK, "alice", workspace_id=4)),
        decide_start_shell(empty, StartShell(TASK, "alice", workspace_id=4)),
    ]
    for decision in decisions:
        assert not isinstance(decision, Refusal)
        (requested,) = decision
        assert isinstance(requested, TaskRequested) and requested.workspace_id == 4
        log = Log()
        log.add(task_stream(TASK), requested)
        assert fold_task(TASK, task_events(log)).workspace_id == 4
    default = decide_run_command(empty, RunCommand(TASK, "alice", ("true",)))
    assert not isinstance(default, Refusal)
    assert [e.workspace_id for e in default if isinstance(e, TaskRequested)] == [1]


def test_kill_of_a_running_task_names_its_agents_and_repeats_decide_nothing() -> None:
    """Killing an allocated task sends the kill to its agent once; an ended task ignores kills."""
    log = Log()
    request(log)
    log.add(
        task_stream(TASK), TaskAllocated(task_id=TASK, allocation_id=ALLOC, placements={"a": ["0"]})
    )
    killed = decide_kill_task(fold_task(TASK, task_events(log)), KillTask(actor="alice"))
    assert not isinstance(killed, Refusal)
    assert killed[0].agent_ids == ["a"]  # type: ignore[attr-defined]
    log.add(task_stream(TASK), killed[0])
    assert decide_kill_task(fold_task(TASK, task_events(log)), KillTask(actor="alice")) == []
    exited = decide_task_exited(
        fold_task(TASK, task_events(log)), ReportTaskExited(ALLOC, "a", 143)
    )
    assert not isinstance(exited, Refusal) and exited[0].outcome == "killed"  # type: ignore[attr-defined]
    log.add(task_stream(TASK), exited[0])
    assert decide_kill_task(fold_task(TASK, task_events(log)), KillTask(actor="alice")) == []
    assert isinstance(decide_kill_task(fold_task("ffffffffffffffff", []), KillTask("a")), Refusal)


def test_reports_from_an_agent_not_holding_the_task_are_refused() -> None:
    """Only an agent placed in the allocation reports its start and exit; a repeat is a no-op;
    a command its agent stopped while shutting down is lost, not failed."""
    log = Log()
    request(log)
    log.add(
        task_stream(TASK), TaskAllocated(task_id=TASK, allocation_id=ALLOC, placements={"a": []})
    )
    view = fold_task(TASK, task_events(log))
    refused = decide_task_started(view, ReportTaskStarted(ALLOC, "b"))
    assert isinstance(refused, Refusal) and refused.reason == "conflict"
    started = decide_task_started(view, ReportTaskStarted(ALLOC, "a"))
    assert not isinstance(started, Refusal)
    log.add(task_stream(TASK), started[0])
    assert (
        decide_task_started(fold_task(TASK, task_events(log)), ReportTaskStarted(ALLOC, "a")) == []
    )
    view = fold_task(TASK, task_events(log))
    done = decide_task_exited(view, ReportTaskExited(ALLOC, "a", 0))
    assert not isinstance(done, Refusal) and done[0].outcome == "completed"  # type: ignore[attr-defined]
    shutdown = decide_task_exited(view, ReportTaskExited(ALLOC, "a", 143, agent_shutdown=True))
    assert not isinstance(shutdown, Refusal) and shutdown[0].outcome == "lost"  # type: ignore[attr-defined]


def test_planner_places_a_task_on_a_free_slot_and_frees_it_on_exit() -> None:
    """A queued task takes a slot; a trial waits until the task's exit frees it."""
    log = Log()
    agent(log, "a", 1)
    request(log)
    made = log.step()
    assert types(made) == ["TaskAllocated"]
    placed = made[0]
    assert isinstance(placed, TaskAllocated) and placed.placements == {"a": ["0"]}
    assert log.state.slot_use == {("a", "0"): ALLOC}
    experiment(log, 1, 1)
    assert log.step() == []  # the task holds the only slot and is never preempted
    log.add(
        task_stream(TASK),
        TaskExited(task_id=TASK, allocation_id=ALLOC, outcome="completed", exit_code=0),
    )
    assert log.state.slot_use == {}
    assert types(log.step()) == ["SlotsAllocated"]


def test_a_zero_slot_task_runs_beside_trials_holding_every_slot() -> None:
    """``resources.slots: 0`` is placed on an agent with no free slot and holds none."""
    log = Log()
    agent(log, "a", 1)
    experiment(log, 1, 1)
    assert types(log.step()) == ["SlotsAllocated"]
    request(log, slots=0)
    made = log.step()
    assert types(made) == ["TaskAllocated"]
    assert made[0].placements == {"a": []}  # type: ignore[attr-defined]


def test_task_priority_orders_tasks_and_trials_by_the_same_policy() -> None:
    """A more important task is placed before an older, less important trial."""
    log = Log()
    experiment(log, 1, 1, priority=50)
    request(log, priority=10)
    agent(log, "a", 1)
    assert types(log.step()) == ["TaskAllocated"]


def test_a_task_killed_while_queued_is_canceled_without_running() -> None:
    """With no free slot, a kill request ends the queued task as canceled; it is never placed."""
    log = Log()
    request(log)
    killed = decide_kill_task(fold_task(TASK, task_events(log)), KillTask(actor="alice"))
    assert not isinstance(killed, Refusal) and killed[0].agent_ids == []  # type: ignore[attr-defined]
    log.add(task_stream(TASK), killed[0])
    agent(log, "a", 1)
    made: list[Event] = log.settle()
    assert types(made) == ["TaskExited"]
    assert made[0].outcome == "canceled"  # type: ignore[attr-defined]
    assert plan(log.state, Settings()) == []


def test_a_task_on_an_agent_that_stops_heartbeating_is_lost() -> None:
    """Reaping a silent agent ends the task it ran as lost and frees its slot."""
    log = Log()
    agent(log, "a", 1)
    request(log)
    log.step()
    decisions = reap(log.state, {"a": 0.0}, now=100.0, timeout=15.0)
    assert [type(e).__name__ for _, e in decisions] == ["AgentLost", "TaskExited"]
    assert decisions[1][1].outcome == "lost"  # type: ignore[attr-defined]


def placed_on_i1(log: Log) -> float:
    """Registers agent ``a`` (incarnation i1, one slot), places the task there, and returns
    when the placement was recorded (seconds since the epoch)."""
    log.add("agent-a", AgentRegistered(agent_id="a", slots=[Slot(slot_id="0")], incarnation="i1"))
    request(log)
    assert types(log.step()) == ["TaskAllocated"]
    return log.events[-1].recorded_at.timestamp()


def heard(
    at: float, *running: str, incarnation: str = "i1", exits: frozenset[str] = frozenset()
) -> Reports:
    """Agent ``a``'s heartbeat 7 of ``incarnation``, recorded at ``at``, listing ``running``."""
    report = Report(incarnation=incarnation, seq=7, running=frozenset(running), at=at)
    return Reports(agents={"a": report}, exits_unfolded=exits)


def lost_verdicts(state: ClusterState, reports: Reports) -> list[TaskExited]:
    return [
        e
        for _, e in plan(state, Settings(task_start_timeout=60.0), reports)
        if isinstance(e, TaskExited)
    ]


def test_a_task_its_agent_never_lists_is_lost_once_after_the_start_timeout() -> None:
    """A task whose start command never reached its (live) agent is not judged before the
    start timeout, nor while the agent lists it, nor on another process's heartbeat, nor with
    its exit in the log unfolded; past the timeout it is lost, once: folded (or replayed from
    the log) the verdict is never decided again."""
    log = Log()
    placed_at = placed_on_i1(log)
    assert lost_verdicts(log.state, heard(placed_at + 59)) == []
    assert lost_verdicts(log.state, heard(placed_at + 600, ALLOC)) == []
    assert lost_verdicts(log.state, heard(placed_at + 600, incarnation="i2")) == []
    assert lost_verdicts(log.state, heard(placed_at + 600, exits=frozenset({ALLOC}))) == []
    assert fold_task(TASK, task_events(log)).state == ASSIGNED

    (verdict,) = lost_verdicts(log.state, heard(placed_at + 61))
    assert (verdict.outcome, verdict.allocation_id) == ("lost", ALLOC)
    assert verdict.message.startswith("never started: agent a did not receive its start command")
    log.add(task_stream(TASK), verdict)
    assert log.state.slot_use == {}
    assert lost_verdicts(log.state, heard(placed_at + 61)) == []
    replayed = ClusterState()
    for recorded in log.events:
        replayed.apply(recorded)
    assert lost_verdicts(replayed, heard(placed_at + 61)) == []


def test_a_started_task_its_agent_stops_listing_is_lost() -> None:
    """A started task that its agent's process no longer lists (its exit report was refused)
    is lost past the start timeout, saying the agent no longer runs it."""
    log = Log()
    placed_at = placed_on_i1(log)
    log.add(task_stream(TASK), TaskStarted(task_id=TASK, allocation_id=ALLOC, agent_id="a"))
    assert lost_verdicts(log.state, heard(placed_at + 120, ALLOC)) == []
    (verdict,) = lost_verdicts(log.state, heard(placed_at + 120))
    assert verdict.message == "agent a no longer runs it (heartbeat 7 does not list it)"


def test_agent_commands_derived_from_task_allocation_and_kill() -> None:
    """TaskAllocated starts the task on its agent; TaskKillRequested kills it there."""
    log = Log()
    agent(log, "a", 1)
    request(log)
    log.step()
    allocated = log.events[-1]
    (start,) = derive(allocated)
    assert (start.kind, start.agent_id, start.allocation_id, start.task_id) == (
        "start",
        "a",
        ALLOC,
        TASK,
    )
    killed = decide_kill_task(fold_task(TASK, task_events(log)), KillTask(actor="alice"))
    assert not isinstance(killed, Refusal)
    (kill,) = derive(log.add(task_stream(TASK), killed[0]))
    assert (kill.kind, kill.command_id) == ("kill", f"kill:{ALLOC}:a")
    assert task_of_allocation(ALLOC) == TASK and task_of_allocation("17.1") is None
