"""Notebook and shell tasks in the log: the request, the ready report the proxy reads, the idle
kill."""

from __future__ import annotations

from typing import Any

from events.domain.aggregates import fold_task
from events.domain.deciders import Refusal
from events.domain.deciders.task import (
    ReportTaskExited,
    ReportTaskIdle,
    ReportTaskReady,
    StartNotebook,
    StartShell,
    decide_start_notebook,
    decide_start_shell,
    decide_task_exited,
    decide_task_idle,
    decide_task_ready,
)
from events.domain.names import task_allocation_id, task_stream
from events.domain.types import TaskAllocated, TaskKillRequested, TaskReady, TaskStarted
from tests.unit.test_planner import Log

TASK = "0123456789abcdef"
ALLOC = task_allocation_id(TASK)


def started_notebook(log: Log, **config: Any) -> None:
    events = decide_start_notebook(
        fold_task(TASK, []), StartNotebook(task_id=TASK, owner="alice", config=config)
    )
    assert not isinstance(events, Refusal)
    for event in events:
        log.add(task_stream(TASK), event)
    log.add(
        task_stream(TASK),
        TaskAllocated(task_id=TASK, allocation_id=ALLOC, placements={"a": []}),
    )
    log.add(task_stream(TASK), TaskStarted(task_id=TASK, allocation_id=ALLOC, agent_id="a"))


def folded(log: Log) -> Any:
    return fold_task(TASK, [e for e in log.events if e.stream_id == task_stream(TASK)])


def append(log: Log, events: Any) -> None:
    assert not isinstance(events, Refusal), events
    for event in events:
        log.add(task_stream(TASK), event)


def test_notebook_request_records_kind_and_refuses_a_bad_idle_timeout_naming_it() -> None:
    """A notebook is a task of kind ``notebook``; a malformed idle_timeout is a 400 naming it."""
    log = Log()
    started_notebook(log, idle_timeout="1h30m")
    task = folded(log)
    assert task.kind == "notebook" and task.config.idle_seconds == 5400
    assert task.description.startswith("JupyterLab")
    refused = decide_start_notebook(
        fold_task("00000000000000aa", []),
        StartNotebook(task_id="00000000000000aa", owner="a", config={"idle_timeout": "soon"}),
    )
    assert isinstance(refused, Refusal) and refused.field == "config.idle_timeout"


def test_ready_is_recorded_once_from_the_holding_agent_and_the_fold_keeps_the_address() -> None:
    """TaskReady from the agent holding the task sets its address once; another agent is
    refused, a repeat decides nothing, and an ended task is no longer ready."""
    log = Log()
    started_notebook(log)
    assert not folded(log).ready
    other = decide_task_ready(folded(log), ReportTaskReady(ALLOC, "b", "10.0.0.9", 80))
    assert isinstance(other, Refusal)
    append(log, decide_task_ready(folded(log), ReportTaskReady(ALLOC, "a", "127.0.0.1", 4242)))
    task = folded(log)
    assert task.ready and (task.address, task.port) == ("127.0.0.1", 4242)
    assert decide_task_ready(task, ReportTaskReady(ALLOC, "a", "127.0.0.2", 1)) == []
    append(log, decide_task_exited(task, ReportTaskExited(ALLOC, "a", 0)))
    assert folded(log).ended and not folded(log).ready
    assert [e.type for e in log.events].count(TaskReady.event_type) == 1


def test_a_command_cannot_report_ready() -> None:
    """Only a kind that serves HTTP has an address for the proxy."""
    log = Log()
    started_notebook(log)
    task = folded(log)
    task.kind = "command"
    refused = decide_task_ready(task, ReportTaskReady(ALLOC, "a", "127.0.0.1", 4242))
    assert isinstance(refused, Refusal) and refused.field == "kind"


def test_idle_past_the_timeout_kills_the_notebook_and_its_exit_says_why() -> None:
    """An idle report short of idle_timeout decides nothing; past it, a kill naming the idle
    timeout, after which the exit (0: Jupyter stops cleanly) is ``killed`` with that reason;
    no timeout never kills."""
    log = Log()
    started_notebook(log, idle_timeout="30s")
    assert decide_task_idle(folded(log), ReportTaskIdle(ALLOC, "a", 29)) == []
    append(log, decide_task_idle(folded(log), ReportTaskIdle(ALLOC, "a", 31)))
    kill = log.events[-1].decode()
    assert isinstance(kill, TaskKillRequested) and "idle_timeout 30s" in kill.reason
    assert kill.agent_ids == ["a"]
    assert decide_task_idle(folded(log), ReportTaskIdle(ALLOC, "a", 60)) == []
    append(log, decide_task_exited(folded(log), ReportTaskExited(ALLOC, "a", 0, "killed")))
    task = folded(log)
    assert task.outcome == "killed" and "idle for 31s" in task.message

    never = Log()
    started_notebook(never)
    assert decide_task_idle(folded(never), ReportTaskIdle(ALLOC, "a", 10**6)) == []


def test_a_shell_is_a_served_task_whose_idle_kill_names_its_timeout() -> None:
    """A shell is a task of kind ``shell`` that serves (its agent may report it ready), is
    described as a shell by default, refuses a bad config naming it, and an idle report past
    its idle_timeout asks for its kill naming the timeout."""
    shell = "00000000000000bb"
    alloc = task_allocation_id(shell)
    log = Log()
    append_to = task_stream(shell)
    events = decide_start_shell(
        fold_task(shell, []), StartShell(task_id=shell, owner="sam", config={"idle_timeout": "5s"})
    )
    assert not isinstance(events, Refusal)
    for event in [
        *events,
        TaskAllocated(task_id=shell, allocation_id=alloc, placements={"a": []}),
        TaskStarted(task_id=shell, allocation_id=alloc, agent_id="a"),
    ]:
        log.add(append_to, event)

    def view() -> Any:
        return fold_task(shell, [e for e in log.events if e.stream_id == append_to])

    assert view().kind == "shell" and view().description == "Shell (00000000)"
    for event in decide_task_ready(view(), ReportTaskReady(alloc, "a", "127.0.0.1", 4243)):
        log.add(append_to, event)
    assert view().ready
    assert decide_task_idle(view(), ReportTaskIdle(alloc, "a", 4)) == []
    (kill,) = decide_task_idle(view(), ReportTaskIdle(alloc, "a", 5))
    assert isinstance(kill, TaskKillRequested) and "idle_timeout 5s" in kill.reason
    refused = decide_start_shell(
        fold_task("00000000000000cc", []),
        StartShell(task_id="00000000000000cc", owner="sam", config={"resources": {"slots": -1}}),
    )
    assert isinstance(refused, Refusal) and refused.field == "config.resources.slots"
    bad_id = decide_start_shell(fold_task("xyz", []), StartShell(task_id="xyz", owner="sam"))
    assert isinstance(bad_id, Refusal) and bad_id.field == "task_id"
