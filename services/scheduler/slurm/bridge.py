"""The scheduler's Slurm consumer: records what :func:`.decide.decide` decides and carries out
its effects.

Leader-only, fenced by the scheduler's lease like the planner. Each catch-up decides on the
log folded to its head and on the latest ``squeue`` reading (taken by a loop beside it every
``poll_seconds``), and appends its facts in the transaction that moves its checkpoint. The
effects cannot join that transaction, so each is ordered to survive a crash at any point:

- ``sbatch`` runs before its ``SlurmJobSubmitted`` commits. If the commit is lost the job
  exists unrecorded: this process remembers it and records it on the next try, and a restarted
  one finds it in ``squeue`` by its name and adopts it (a reading is taken before anything is
  decided), so an allocation never gets two live jobs and no job is left running unknown.
- ``scancel`` runs after its ``SlurmJobCancelRequested`` commits, and is sent again while
  ``squeue`` still shows the job running, so a crash in between only delays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping

import structlog

from events.domain import lifecycle
from events.domain.aggregates import CLUSTER_TYPES, Cluster
from events.domain.aggregates.slurm import SLURM_FACTS, SlurmAllocations
from events.domain.config.resource_pools import ResourcePool
from events.domain.names import slurm_stream, task_stream, trial_stream
from events.domain.types import (
    SlurmJobCancelRequested,
    SlurmJobObserved,
    SlurmJobRefused,
    SlurmJobSubmitted,
    TaskExited,
    TrialStateChanged,
)
from events.log import faults
from events.log.consumer import Consumer
from events.log.envelope import Event, RecordedEvent
from events.log.store import EventStore, Transaction
from services.scheduler.planner import run_ended
from services.scheduler.slurm.commands import Queue, SlurmCommandError, SlurmCommands
from services.scheduler.slurm.decide import (
    Action,
    Adopt,
    Cancel,
    EndRun,
    GiveUp,
    Observe,
    Submit,
    decide,
    run_state,
)
from services.scheduler.slurm.requests import SlurmRequest
from services.scheduler.slurm.script import ShapeError, batch_script, job_dir, shape

log = structlog.get_logger("scheduler.slurm")

LINGER_SECONDS = 30.0
"""Seconds a job may keep running after its run ended (its agents report and exit) before it is
cancelled."""
RESEND_SECONDS = 30.0
"""Seconds between two ``scancel`` of a job that keeps running after its cancellation."""


class SlurmBridge(Consumer):
    """Submits, observes and cancels the Slurm pools' jobs (see the module)."""

    name = "scheduler-slurm"
    types = CLUSTER_TYPES | frozenset(SLURM_FACTS)
    envelopes = frozenset({"trial", "task", "slurm"})
    tick_always = True

    def __init__(
        self,
        store: EventStore,
        pools: Mapping[str, ResourcePool],
        default_pool: str,
        commands: SlurmCommands,
    ) -> None:
        self.store = store
        self.pools = dict(pools)
        self.default_pool = default_pool
        self.commands = commands
        self.cluster = Cluster()
        self.slurm = SlurmAllocations()
        self.folded = 0
        self.queue: Queue | None = None
        self.queue_from = 0
        self.queue_read = asyncio.Event()
        self._unrecorded: dict[str, str] = {}
        """Allocation -> a job submitted whose record did not commit (yet)."""
        self._to_cancel: list[str] = []
        self._run_ended: dict[str, float] = {}
        self._cancel_sent: dict[str, float] = {}

    # --- folding ----------------------------------------------------------------------------

    async def rebuild(self) -> None:
        """Refolds from the start of the log up to this consumer's checkpoint."""
        self.cluster = Cluster()
        self.slurm = SlurmAllocations()
        self.folded = 0
        checkpoint = await self.store.checkpoint(self.name)
        async for event in self.store.iter_all(0, types=self.types, envelopes=self.envelopes):
            if event.position > checkpoint:
                break
            self._apply(event)
        self.folded = max(self.folded, checkpoint)

    def _apply(self, event: RecordedEvent) -> None:
        self.cluster.apply(event)
        self.slurm.apply(event)
        self.folded = event.position

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        self._apply(event)

    async def on_rollback(self) -> None:
        await self.rebuild()

    async def on_lost_race(self) -> None:
        """Keeps the state: both folds skip the events they applied when a page is read again."""

    # --- squeue -----------------------------------------------------------------------------

    async def poll(self, stop: asyncio.Event) -> None:
        """Reads ``squeue`` every ``poll_seconds`` (the shortest of the pools') until ``stop``."""
        every = min(p.slurm.poll_seconds for p in self.pools.values())
        failures = 0
        while not stop.is_set():
            began = self.cluster.position
            try:
                self.queue = await self.commands.queue()
                self.queue_from = began
                self.queue_read.set()
                failures = 0
            except SlurmCommandError as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("squeue failed", error=str(exc), failures=failures)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)

    # --- deciding ---------------------------------------------------------------------------

    async def before_commit(self, tx: Transaction) -> None:
        if self.queue is None:
            return  # nothing is decided before squeue was read once by this process
        now = time.monotonic()
        actions = decide(
            self.cluster,
            self.slurm,
            self.pools,
            self.default_pool,
            self.queue,
            self.queue_from,
            lingering=self._lingering(now),
        )
        appends: dict[str, list[Event]] = {}
        for action in actions:
            for stream, event in await self._facts(action):
                appends.setdefault(stream, []).append(event)
        for stream, events in appends.items():
            await tx.append(stream, events, expected_version=self._version(stream))
        if appends:
            log.info("slurm decided", actions=sorted({type(a).__name__ for a in actions}))
        self._resend(now)

    def _version(self, stream: str) -> int:
        if stream.startswith("slurm-"):
            alloc = self.slurm.allocations.get(stream.removeprefix("slurm-"))
            return alloc.version if alloc is not None else 0
        return self.cluster.version(stream)

    def _lingering(self, now: float) -> frozenset[str]:
        """Live jobs whose run ended more than :data:`LINGER_SECONDS` ago."""
        ended: set[str] = set()
        for alloc, job in self.slurm.live_jobs():
            if run_state(self.cluster, alloc.allocation_id) == (True, True):
                ended.add(job.job_id)
        self._run_ended = {j: self._run_ended.get(j, now) for j in ended}
        return frozenset(j for j, at in self._run_ended.items() if now - at >= LINGER_SECONDS)

    def _resend(self, now: float) -> None:
        """Jobs cancelled before that ``squeue`` still shows running get ``scancel`` again."""
        for _, job in self.slurm.live_jobs():
            if not job.cancel_requested:
                continue
            sent = self._cancel_sent.get(job.job_id)
            if sent is None or now - sent >= RESEND_SECONDS:
                self._to_cancel.append(job.job_id)

    async def _facts(self, action: Action) -> list[tuple[str, Event]]:
        """The events recording ``action`` (running ``sbatch`` for a submission)."""
        if isinstance(action, Submit):
            return await self._submit(action)
        if isinstance(action, Adopt):
            log.info(
                "slurm job adopted", allocation=action.request.allocation_id, job=action.job.job_id
            )
            submitted = _submitted(
                action.request, self.pools, action.job.job_id, action.submission, adopted=True
            )
            return [submitted]
        if isinstance(action, Observe):
            seen = action.job
            return [
                (
                    slurm_stream(action.allocation_id),
                    SlurmJobObserved(
                        allocation_id=action.allocation_id,
                        job_id=seen.job_id,
                        state=seen.state,
                        reason=seen.reason,
                        nodes=list(seen.nodes),
                    ),
                )
            ]
        if isinstance(action, Cancel):
            self._to_cancel.append(action.job_id)
            log.info("slurm job to cancel", job=action.job_id, reason=action.reason)
            return [
                (
                    slurm_stream(action.allocation_id),
                    SlurmJobCancelRequested(
                        allocation_id=action.allocation_id,
                        job_id=action.job_id,
                        reason=action.reason,
                    ),
                )
            ]
        if isinstance(action, EndRun):
            return self._end_run(action)
        return self._give_up(action)

    async def _submit(self, action: Submit) -> list[tuple[str, Event]]:
        request = action.request
        pool = self.pools[request.pool]
        stream = slurm_stream(request.allocation_id)
        try:
            shape(request, pool.slurm)
            job_id = self._unrecorded.get(request.allocation_id)
            if job_id is None:
                script = batch_script(
                    request,
                    pool.slurm,
                    action.submission,
                    request.pool,
                    slurm_conf=os.environ.get("SLURM_CONF"),
                )
                job_id = await self.commands.submit(
                    script, job_dir(pool.slurm, request.allocation_id) / str(action.submission)
                )
                self._unrecorded[request.allocation_id] = job_id
                await faults.point("scheduler.slurm.after_sbatch")  # submitted, not recorded
        except (ShapeError, SlurmCommandError) as exc:
            log.warning("slurm refused", allocation=request.allocation_id, error=str(exc))
            refused = SlurmJobRefused(
                allocation_id=request.allocation_id, pool=request.pool, error=str(exc)[:2000]
            )
            return [(stream, refused)]
        log.info("slurm job submitted", allocation=request.allocation_id, job=job_id)
        return [_submitted(request, self.pools, job_id, action.submission)]

    def _end_run(self, action: EndRun) -> list[tuple[str, Event]]:
        if action.task_id is not None:
            exited = TaskExited(
                task_id=action.task_id,
                allocation_id=action.allocation_id,
                outcome="failed" if action.outcome == "failed" else "lost",
                message=action.message,
            )
            return [(task_stream(action.task_id), exited)]
        found = self.cluster.run_of(action.allocation_id)
        if found is None or action.trial_id is None:
            return []
        trial, run = found
        return run_ended(trial, run, action.message, action.outcome)

    def _give_up(self, action: GiveUp) -> list[tuple[str, Event]]:
        request = action.request
        if request.task_id is not None:
            exited = TaskExited(task_id=request.task_id, outcome="failed", message=action.reason)
            return [(task_stream(request.task_id), exited)]
        assert request.trial_id is not None
        changed = TrialStateChanged(
            trial_id=request.trial_id, state=lifecycle.ERROR, reason=action.reason
        )
        return [(trial_stream(request.trial_id), changed)]

    async def after_commit(self) -> None:
        """Forgets submissions now recorded and sends the cancellations decided."""
        for alloc_id in list(self._unrecorded):
            alloc = self.slurm.allocations.get(alloc_id)
            if alloc is not None and alloc.find(self._unrecorded[alloc_id]) is not None:
                del self._unrecorded[alloc_id]
        cancels, self._to_cancel = self._to_cancel, []
        now = time.monotonic()
        for job_id in dict.fromkeys(cancels):
            self._cancel_sent[job_id] = now
            try:
                await self.commands.cancel(job_id)
            except SlurmCommandError as exc:
                log.warning("scancel failed", job=job_id, error=str(exc))


def _submitted(
    request: SlurmRequest,
    pools: Mapping[str, ResourcePool],
    job_id: str,
    submission: int,
    *,
    adopted: bool = False,
) -> tuple[str, Event]:
    """The ``SlurmJobSubmitted`` recording ``job_id`` as ``request``'s job."""
    job = shape(request, pools[request.pool].slurm)
    event = SlurmJobSubmitted(
        allocation_id=request.allocation_id,
        job_id=job_id,
        pool=request.pool,
        trial_id=request.trial_id,
        task_id=request.task_id,
        nodes=job.nodes,
        slots_per_node=job.slots_per_node,
        submission=submission,
        adopted=adopted,
    )
    return slurm_stream(request.allocation_id), event
