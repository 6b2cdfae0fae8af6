"""One run on the agent, from its spec to its exit: the work directory, the confinement,
the rendezvous of a run placed on several agents, the processes or containers, the
watch that stops this agent's part of a gang when another part ended, and the one that stops a
task's run once the log says the task ended (recorded lost while it still ran here).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tarfile
from pathlib import Path

import structlog

from cairn.tasks.tensorboard_sources import write_sources
from events.domain.config.task import TaskConfig
from events.domain.deciders.task import SERVING_KINDS
from services.agent.client import ApiError
from services.agent.confinement import RunDirectoryError, RunPlaces
from services.agent.docker_runtime import DockerRuntimeError, TrialContainers, run_image
from services.agent.docker_runtime import launch as launch_containers
from services.agent.leftovers import record_of
from services.agent.log_shipping import LogShipper
from services.agent.processes import TrialProcesses
from services.agent.resource_manager import PREEMPT_SIGNALS, PREEMPT_SIGNALS_VARIABLE
from services.agent.runtime import (
    RunSpec,
    free_port,
    prepare_work_dir,
    reachable_address,
    start_directory,
    trial_environment,
)
from services.agent.serving import (
    notebook_argv,
    shell_argv,
    tensorboard_argv,
    tensorboard_sources,
    wait_ready,
    watch_idle,
)
from services.agent.state import AgentState, Allocation
from services.confine import ConfinementError

log = structlog.get_logger("agent")

KILLED_BEFORE_START = 137  # reported when a kill arrives before the process was launched
RENDEZVOUS_FAILED = 1  # reported when the agents of a gang did not all join in time
GANG_POLL_SECONDS = 10.0
TASK_POLL_SECONDS = 5.0
"""How often a task's run asks whether its task is still current (:meth:`RunLaunching._watch_task`)."""


class RunLaunching(AgentState):
    """Starts a run, waits for it, and reports how it ended."""

    async def _lifecycle(self, alloc: Allocation) -> None:
        aid = alloc.allocation_id
        try:
            await self._run_allocation(alloc)
        except asyncio.CancelledError:
            if alloc.procs is not None:
                alloc.procs.send_signal(signal.SIGKILL)
            raise
        except Exception:
            log.exception("run failed inside the agent", allocation_id=aid)
        finally:
            if alloc.active:
                alloc.state = "exited"
            alloc.launched.set()
            alloc.finished.set()

    async def _run_allocation(self, alloc: Allocation) -> None:
        aid = alloc.allocation_id
        try:
            raw = await self.client.spec(aid, self.id)
        except ApiError as exc:
            if exc.status == 0 or exc.status >= 500 or exc.status in (408, 429):
                log.warning("spec unavailable; the command will be retried", allocation_id=aid)
                alloc.retry = True
            else:
                log.error("spec refused; not starting", allocation_id=aid, error=str(exc))
                alloc.state = "skipped"
            return
        if not raw.get("active", False):
            log.info("allocation no longer active; not starting", allocation_id=aid)
            alloc.state = "skipped"
            return
        work: Path | None = None
        places: RunPlaces | None = None
        try:
            if alloc.kill_requested:
                message = f"{alloc.stop_reason} before the process started"
                await self._report_exit(
                    aid, KILLED_BEFORE_START, message, agent_shutdown=alloc.agent_shutdown
                )
                return
            try:
                default_root = self.config.checkpoint_root or self.config.work_dir / "checkpoints"
                run = RunSpec.from_api(raw, self.id, default_root)
                alloc.preempt_timeout = run.preemption_timeout
                work = prepare_work_dir(self.config.work_dir, aid)
                if run.code_ref:
                    await self.code.unpack(run.code_ref, work)
                start = work
                if run.task_id is not None:
                    task_config = TaskConfig.model_validate(run.config)
                    start = start_directory(work, task_config.work_dir)
                serves: tuple[str, int] | None = None
                reads: list[Path] = []
                if run.task_id is not None and run.task_kind in SERVING_KINDS:
                    serves = (
                        self.config.address or reachable_address(self.config.api_url),
                        free_port(),
                    )
                    if run.task_kind == "tensorboard":
                        sources, reads = tensorboard_sources(run.tensorboard_sources, default_root)
                        written = await asyncio.to_thread(write_sources, work, sources)
                        run.argv = tensorboard_argv(
                            run.task_id,
                            address=serves[0],
                            port=serves[1],
                            work=work,
                            sources=written,
                        )
                    elif run.task_kind == "shell":
                        run.argv = shell_argv(
                            run.task_id, address=serves[0], port=serves[1], work=start
                        )
                    else:
                        run.argv = notebook_argv(
                            run.task_id, address=serves[0], port=serves[1], work=work, start=start
                        )
                device = "cuda" if any(s in self.gpu_slots for s in run.slot_ids) else "cpu"
                image = run_image(run.config, device, self.config.default_image)
                identity = self.confinement.identity_for(run.identity, container=image is not None)
                places = await asyncio.to_thread(
                    self.confinement.prepare,
                    work=work,
                    identity=identity,
                    checkpoint_dir=run.checkpoint_dir,
                    experiment_id=run.experiment_id if run.task_id is None else None,
                    trial_id=run.trial_id if run.task_id is None else None,
                    reads=reads,
                )
                if run.num_nodes > 1:
                    failure = await self._rendezvous(alloc, run)
                    if failure is not None:
                        log.error("run not started", allocation_id=aid, reason=failure)
                        status = KILLED_BEFORE_START if alloc.kill_requested else RENDEZVOUS_FAILED
                        await self._report_exit(
                            aid, status, failure, agent_shutdown=alloc.agent_shutdown
                        )
                        return
                envs = trial_environment(
                    run, agent_id=self.id, api_url=self.config.api_url, gpu_slots=self.gpu_slots
                )
                for env in envs:
                    env.update(self.confinement.environment(identity, places))
                    if self.config.preempt_on_term:
                        env[PREEMPT_SIGNALS_VARIABLE] = PREEMPT_SIGNALS
                shipper = LogShipper(self.client, aid, f"{self.id}:{self.incarnation}")
                procs: TrialProcesses | TrialContainers
                if image is not None:
                    procs, self._docker = await launch_containers(
                        self._docker,
                        run,
                        image,
                        envs,
                        shipper,
                        agent_id=self.id,
                        work=work,
                        start=start,
                        gpu_slots=self.gpu_slots,
                        kill_grace=self.config.kill_grace,
                        share_from=self.config.docker_share_from,
                        identity=identity,
                        policy=self.config.host_policy,
                        reads=places.reads,
                    )
                else:
                    procs = TrialProcesses(aid, shipper, self.config.kill_grace)
                    argv = self.confinement.argv(run.argv, identity, places)
                    await procs.launch(argv, start, envs)
                try:
                    record = record_of(aid, procs.pids)
                    await asyncio.to_thread(self.run_processes.keep, record)
                except OSError:
                    procs.send_signal(signal.SIGKILL)  # never run what a restart could not find
                    await procs.wait()
                    raise
            except (
                ValueError,
                KeyError,
                TypeError,
                ApiError,
                OSError,
                tarfile.TarError,
                DockerRuntimeError,
                ConfinementError,
                RunDirectoryError,
            ) as exc:
                log.error("cannot start the run", allocation_id=aid, error=str(exc))
                status = 127 if isinstance(exc, FileNotFoundError) else 1
                await self._report_exit(aid, status, f"agent could not start the run: {exc}")
                return
            shipper.start()
            alloc.procs = procs
            alloc.state = "running"
            log.info(
                "run launched",
                allocation_id=aid,
                pids=procs.pids,
                argv=run.argv,
                uid=identity.uid if identity is not None else os.getuid(),
            )
            alloc.launched.set()
            if alloc.kill_requested:
                alloc.kill_requested = False
                self._kill(alloc, alloc.stop_reason)
            elif alloc.preempt_requested:
                self._preempt(aid)
            started = asyncio.create_task(
                self.client.started(
                    aid, self.id, self.incarnation, alloc.listed_from, f"started:{aid}:{self.id}"
                )
            )
            gang = self._spawn(self._watch_gang(alloc)) if run.num_nodes > 1 else None
            watch = self._spawn(self._watch_task(alloc)) if run.task_id is not None else None
            serving = self._spawn(self._serve(alloc, run, serves)) if serves else None
            status = await procs.wait()
            for helper in (serving, watch):
                if helper is not None:
                    helper.cancel()
            if gang is not None:
                if status == 0 and run.node_rank > 0 and not alloc.kill_requested:
                    # A worker part that finished waits for the chief's part to end the run:
                    # its report would end it while the chief still reports and checkpoints.
                    log.info("part finished; waiting for the chief's", allocation_id=aid)
                    await asyncio.wait({gang})
                gang.cancel()
            log.info("run exited", allocation_id=aid, exit_code=status)
            # Kept at once: shipping the last logs and the started report may wait long on an
            # API that is down, and the agent may be killed meanwhile (``cairn down``).
            report = await self._keep_exit(
                aid, status, alloc.stop_reason, agent_shutdown=alloc.agent_shutdown
            )
            try:
                await started  # the API must see TrialStarted before TrialExited
            except ApiError as exc:
                log.error("started report refused", allocation_id=aid, error=str(exc))
            await shipper.close()
            await self._send_exit(report)
        finally:
            alloc.state = "exited"
            if work is not None:
                await asyncio.to_thread(shutil.rmtree, work, True)
            if places is not None:
                await asyncio.to_thread(self.confinement.release, places)

    async def _serve(self, alloc: Allocation, run: RunSpec, serves: tuple[str, int]) -> None:
        """Reports a task's server ready once its port accepts connections, then watches it
        for its ``idle_timeout`` and reports it idle (the API decides the kill)."""
        aid, (address, port) = alloc.allocation_id, serves
        procs = alloc.procs
        if procs is None or run.task_id is None:
            return
        try:
            if not await wait_ready(address, port, lambda: procs.done):
                return
            await self.client.ready(aid, self.id, address, port, f"ready:{aid}:{self.id}")
            log.info("task ready", allocation_id=aid, address=address, port=port)
            await watch_idle(
                run.task_id,
                address,
                port,
                TaskConfig.model_validate(run.config),
                run.serve_token,
                lambda idle: self.client.idle(aid, self.id, idle, f"idle:{aid}:{self.id}"),
            )
        except ApiError as exc:
            log.error("task server report refused", allocation_id=aid, error=str(exc))

    async def _rendezvous(self, alloc: Allocation, run: RunSpec) -> str | None:
        """Joins the rendezvous of a run placed on several agents and waits for the others.

        Sets the chief's endpoint on ``run`` and returns ``None`` once every agent joined, or
        returns why the run cannot start: the others did not all join within
        ``rendezvous_timeout`` seconds, the run ended meanwhile, or it was killed or preempted
        (the log's kill or preemption request then decides the outcome).
        """
        aid = alloc.allocation_id
        address = self.config.address or reachable_address(self.config.api_url)
        deadline = asyncio.get_running_loop().time() + self.config.rendezvous_timeout
        answer = await self.client.rendezvous_join(
            aid, self.id, address, free_port(), f"rendezvous:{aid}:{self.id}"
        )
        log.info("rendezvous joined", allocation_id=aid, address=address, nodes=answer.nodes)
        while True:
            if alloc.kill_requested or alloc.preempt_requested:
                return f"{alloc.stop_reason} during the rendezvous"
            if not answer.current:
                return "the run ended during the rendezvous"
            if answer.complete:
                if answer.chief_address is None or answer.chief_port is None:
                    raise ValueError(f"rendezvous of {aid} is complete but names no chief")
                if answer.node_rank is None:
                    raise ValueError(f"rendezvous of {aid} is complete but names no node rank")
                run.master_addr = answer.chief_address
                run.master_port = answer.chief_port
                run.node_address = address
                run.node_rank = answer.node_rank
                run.num_nodes = answer.num_nodes
                log.info(
                    "rendezvous complete",
                    allocation_id=aid,
                    chief=f"{run.master_addr}:{run.master_port}",
                    node_rank=run.node_rank,
                )
                return None
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                missing = [a for a in answer.nodes if a not in answer.joined]
                return (
                    f"rendezvous timed out after {self.config.rendezvous_timeout:g}s: "
                    f"agent(s) {', '.join(missing)} never joined"
                )
            answer = await self.client.rendezvous(aid, self.id, min(left, GANG_POLL_SECONDS))

    async def _watch_task(self, alloc: Allocation) -> None:
        """Stops a task's run once its task has ended in the log while it still runs here (it
        was recorded lost: its agent was judged silent, or never listed it in time). The log's
        verdict stands, so the process must not serve on unseen. Returns once the run ended or
        was stopped; an API that does not answer is asked again later."""
        aid = alloc.allocation_id
        while alloc.active:
            await asyncio.sleep(TASK_POLL_SECONDS)
            try:
                answer = await self.client.preemption(aid, 0)
            except ApiError as exc:
                log.warning("task watch failing", allocation_id=aid, error=str(exc))
                continue
            if not answer.current:
                if alloc.procs is not None and not alloc.procs.done:
                    log.warning("the task ended in the log; stopping its run", allocation_id=aid)
                    self._kill(alloc, "the task ended while it ran (recorded lost)")
                return

    async def _watch_gang(self, alloc: Allocation) -> None:
        """Stops this agent's part of a gang once the run is no longer current (another agent's
        part failed or was lost, or the chief's part ended it): the survivors must not train on
        alone. Returns once the run is no longer current."""
        aid = alloc.allocation_id
        while alloc.active:
            try:
                answer = await self.client.preemption(aid, GANG_POLL_SECONDS)
            except ApiError as exc:
                log.warning("gang watch failing", allocation_id=aid, error=str(exc))
                await asyncio.sleep(1.0)
                continue
            if not answer.current:
                if alloc.procs is not None and not alloc.procs.done:
                    log.warning("another part of the gang ended; stopping", allocation_id=aid)
                    self._kill(alloc, "another part of the gang ended")
                return
