"""The job queue: trials and tasks that hold or wait for slots, in the scheduler's order."""

from __future__ import annotations

from events.domain.aggregates.jobs import job_queue
from events.domain.names import task_stream
from events.domain.types import TaskAllocated, TaskExited
from tests.unit.test_planner import Log, agent, experiment
from tests.unit.test_tasks import request

FIRST, LAST = "00000000000000aa", "00000000000000bb"


def rows(log: Log) -> list[tuple[str, str, str, int]]:
    return [(j.kind, j.job_id, j.state, j.priority) for j in job_queue(log.state)]


def test_waiting_jobs_are_ordered_as_the_scheduler_places_them() -> None:
    """Waiting trials and tasks sort by priority then request order, and the first of them is
    the one the planner places when a slot appears; placed jobs lead the queue."""
    log = Log()
    experiment(log, 1, 2, priority=50)
    request(log, FIRST, priority=10)
    request(log, LAST, priority=50)
    assert rows(log) == [
        ("command", FIRST, "QUEUED", 10),
        ("trial", "11", "QUEUED", 50),
        ("trial", "12", "QUEUED", 50),
        ("command", LAST, "QUEUED", 50),
    ]
    agent(log, "a", 1)
    placed = log.step()
    assert [type(e).__name__ for e in placed] == ["TaskAllocated"]
    assert isinstance(placed[0], TaskAllocated) and placed[0].task_id == FIRST
    assert rows(log)[0] == ("command", FIRST, "ASSIGNED", 10)
    assert [r[1] for r in rows(log)[1:]] == ["11", "12", LAST]


def test_a_task_shows_its_owner_slots_and_pool_and_leaves_the_queue_when_it_ends() -> None:
    """A queued task's row carries its owner, slots, pool and command line; once it exited it
    is not a job any more."""
    log = Log()
    request(log, FIRST, slots=2, resource_pool="gpu")
    (job,) = job_queue(log.state)
    assert (job.owner, job.slots, job.resource_pool, job.name) == (
        "alice",
        2,
        "gpu",
        "python prep.py",
    )
    assert job.submitted_at is not None and job.experiment_id is None
    log.add(task_stream(FIRST), TaskExited(task_id=FIRST, outcome="canceled"))
    assert job_queue(log.state) == []
