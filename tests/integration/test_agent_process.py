"""The agent as a real subprocess, against the real API gateway (``services.api`` on a real
PostgreSQL) and a real nats-server, running real trial processes."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from aiohttp import web

from cairn.local.servers import bare_nats_url, nats_auth_dir_of, nats_authority
from events.domain import names
from events.domain.commands import Command
from events.domain.types import (
    KillRequested,
    PreemptionRequested,
    SlotsAllocated,
    SlotsReleased,
    TrialExited,
    TrialRequested,
)
from events.log.bus import Bus
from events.log.envelope import RecordedEvent
from events.log.store import EventStore
from services.agent.slots import cpu_slots
from services.api.app import create_app
from services.api.auth import cluster_secret, join_token
from tests.helpers import ADMIN_PASSWORD, wait_until
from tests.integration.test_api_support import TEST_CLUSTER

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "examples" / "scripted"

SLEEPER = b"""
import os, signal, subprocess, sys, time
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "600"])
with open(os.environ["PID_FILE"], "w") as fh:
    fh.write(str(child.pid))
print("sleeping", flush=True)
time.sleep(600)
"""

RANKS = b"""
import os
import cairn.core
with cairn.core.init() as ctx:
    rank = ctx.distributed.get_rank()
    print(f"rank {rank} of {ctx.distributed.get_size()}", flush=True)
    ctx.train.report_validation_metrics(1, {"validation_loss": 1.0, "rank": rank})
"""


def tarball(files: dict[str, bytes]) -> bytes:
    """A tar.gz holding ``files`` (name -> content) at its root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


CODE = tarball(
    {
        "train.py": (SCRIPTED / "train.py").read_bytes(),
        "digits.py": (ROOT / "examples" / "digits" / "train.py").read_bytes(),
        "sleeper.py": SLEEPER,
        "ranks.py": RANKS,
    }
)


@dataclass
class AgentProc:
    """A ``python -m services.agent`` child process."""

    agent_id: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """The agent's own (structlog JSON) output so far."""
        return self.log_path.read_text(errors="replace")

    async def stop(self, timeout: float = 30.0, *, signal_it: bool = True) -> int:
        """SIGTERMs the agent and waits (without blocking the loop serving the API) for its exit."""
        if signal_it and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            await wait_until(lambda: self.proc.poll() is not None, timeout=timeout)
        except AssertionError:
            self.proc.kill()
            self.proc.wait(10)
        return self.proc.returncode


@dataclass
class Cluster:
    """The real gateway on a free port, the bus, and helpers that play searcher and scheduler."""

    store: EventStore
    bus: Bus
    url: str
    admin: str
    agent_token: str
    nats_url: str
    tmp: Path
    session: aiohttp.ClientSession
    agents: list[AgentProc] = field(default_factory=list)
    trials: int = 0

    async def submit(self, hparams: dict[str, Any], entrypoint: str = "python3 train.py") -> int:
        """Creates an experiment through the API (code uploaded as base64 tar.gz)."""
        config = {
            "name": "agent-test",
            "entrypoint": entrypoint,
            "hyperparameters": hparams,
            "searcher": {"name": "single", "metric": "validation_loss"},
            "checkpoint_storage": {"type": "shared_fs", "host_path": str(self.tmp / "ckpt")},
            "environment": {"environment_variables": ["PID_FILE=child.pid"]},
        }
        body = {"config": config, "code": base64.b64encode(CODE).decode()}
        headers = {"Authorization": f"Bearer {self.admin}"}
        async with self.session.post(
            f"{self.url}/api/v1/experiments", json=body, headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
            return int((await resp.json())["id"])

    async def allocate(
        self,
        agent_id: str,
        hparams: dict[str, Any] | None = None,
        *,
        entrypoint: str = "python3 train.py",
        slots: int = 1,
        slot_ids: list[str] | None = None,
    ) -> tuple[int, str]:
        """Submits an experiment, requests its trial and places it; returns (trial, allocation)."""
        hp = hparams or {}
        experiment_id = await self.submit(hp, entrypoint)
        trial_id = experiment_id * 10 + 1
        await self.store.append(
            f"experiment-{experiment_id}",
            [
                TrialRequested(
                    experiment_id=experiment_id,
                    trial_id=trial_id,
                    seq=1,
                    request_id=f"r-{trial_id}",
                    hparams=hp,
                    trial_seed=7,
                )
            ],
        )
        allocation_id = names.allocation_id(trial_id, 1)
        slot_ids = slot_ids or [s.slot_id for s in cpu_slots(agent_id, slots)]
        await self.store.append(
            names.trial_stream(trial_id),
            [
                SlotsAllocated(
                    trial_id=trial_id,
                    allocation_id=allocation_id,
                    placements={agent_id: slot_ids},
                )
            ],
        )
        return trial_id, allocation_id

    async def command(
        self,
        agent_id: str,
        kind: str,
        allocation_id: str,
        *,
        command_id: str = "",
        msg_id: str = "",
    ) -> None:
        """Publishes a command on the agent's subject, as the relay would."""
        cid = command_id or f"{kind}:{allocation_id}:{agent_id}"
        trial_id = names.parse_allocation_id(allocation_id)[0]
        cmd = Command(agent_id, cid, kind, allocation_id, trial_id, 1)
        await self.bus.publish_command(cmd.subject, cmd.payload(), msg_id or cid)

    async def events(self, trial_id: int) -> list[RecordedEvent]:
        """The trial's stream."""
        return list(await self.store.read_stream(names.trial_stream(trial_id)))

    async def of_type(self, trial_id: int, event_type: str) -> list[dict[str, Any]]:
        """Payloads of one event type on the trial's stream."""
        return [e.payload for e in await self.events(trial_id) if e.type == event_type]

    async def exited(self, trial_id: int, timeout: float = 30.0) -> dict[str, Any]:
        """Waits for the run's TrialExited and returns it."""

        async def seen() -> bool:
            return bool(await self.of_type(trial_id, "TrialExited"))

        await wait_until(seen, timeout=timeout, every=0.1)
        return (await self.of_type(trial_id, "TrialExited"))[0]

    async def logs(self, allocation_id: str) -> list[dict[str, Any]]:
        """Stored log lines of the run."""
        rows = await self.store.fetch(
            "SELECT rank, stream, line FROM task_logs WHERE allocation_id = $1 ORDER BY ts, seq",
            allocation_id,
        )
        return [dict(r) for r in rows]

    def pid_file(self, allocation_id: str) -> Path:
        """Where ``sleeper.py`` of run ``allocation_id`` writes its child's pid (its working
        directory, the only place its unprivileged identity may write besides checkpoints)."""
        found = sorted(self.tmp.glob(f"work-*/allocations/{allocation_id}/child.pid"))
        return found[0] if found else self.tmp / "no-child.pid"

    async def start_agent(
        self,
        agent_id: str = "a1",
        *extra: str,
        slots: int | None = 1,
        path: str = "",
        faults: str = "",
    ) -> AgentProc:
        """Starts an agent (with ``CAIRN_FAULTS=faults``) and waits until it is registered and
        subscribed."""
        ready = self.tmp / f"{agent_id}.ready"
        ready.unlink(missing_ok=True)  # left by an earlier process of the same agent
        log_path = self.tmp / f"{agent_id}.log"
        env = dict(os.environ)
        env.update(
            PYTHONPATH=str(ROOT),
            CAIRN_AGENT_TOKEN=self.agent_token,
            CAIRN_READY_FILE=str(ready),
            CAIRN_FAULTS=faults,
        )
        if path:
            env["PATH"] = f"{path}{os.pathsep}{env['PATH']}"
        flags = ["--artificial-slots", str(slots)] if slots is not None else []
        argv = [
            sys.executable, "-m", "services.agent",
            "--api-url", self.url, "--nats", self.nats_url, "--agent-id", agent_id,
            *flags, "--work-dir", str(self.tmp / f"work-{agent_id}"),
            "--heartbeat", "0.3", "--kill-grace", "1", *extra,
        ]  # fmt: skip
        with log_path.open("wb") as out:  # Popen returns at once; the agent outlives this call
            proc = subprocess.Popen(  # noqa: ASYNC220
                argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        agent = AgentProc(agent_id, proc, log_path)
        self.agents.append(agent)
        await wait_until(lambda: ready.exists() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, agent.log()
        return agent


@pytest.fixture
async def cluster(
    store: EventStore, bus: Bus, nats_server: Any, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """The real gateway on a fresh database, plus the bus and a scratch dir."""
    auth_dir = nats_auth_dir_of(nats_server.url)
    assert auth_dir is not None
    app = create_app(
        store,
        None,
        secret=await cluster_secret(store),
        nats_authority=nats_authority(auth_dir),
        cluster=TEST_CLUSTER,
        admin_password=ADMIN_PASSWORD,
    )

    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{url}/api/v1/auth/login", json={"username": "admin", "password": ADMIN_PASSWORD}
        ) as resp:
            admin = str((await resp.json())["token"])
        c = Cluster(
            store,
            bus,
            url,
            admin,
            await join_token(store),
            bare_nats_url(nats_server.url),
            tmp_path,
            session,
        )
        try:
            yield c
        finally:
            for agent in c.agents:
                await agent.stop()
            await runner.cleanup()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left to a non-reaping init counts as dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_registers_offering_stable_cpu_slots_and_heartbeats(cluster: Cluster) -> None:
    """The agent registers its artificial CPU slots (ids derived from its id) and heartbeats."""
    await cluster.start_agent("reg", slots=2)
    registered = [
        e.payload
        for e in await cluster.store.read_stream("agent-reg")
        if e.type == "AgentRegistered"
    ]
    assert len(registered) == 1
    assert [s["slot_id"] for s in registered[0]["slots"]] == [
        s.slot_id for s in cpu_slots("reg", 2)
    ]
    assert {s["device"] for s in registered[0]["slots"]} == {"cpu"}

    async def beat() -> bool:
        row = await cluster.store.fetchrow(
            "SELECT running FROM agent_heartbeats WHERE agent_id = 'reg'"
        )
        return row is not None

    await wait_until(beat, timeout=10)


async def test_start_runs_scripted_trial_and_duplicate_start_is_a_no_op(cluster: Cluster) -> None:
    """A start command runs the scripted example to completion: TrialStarted, metrics,
    checkpoints, logs and exit code 0 arrive; a repeated start changes nothing."""
    agent = await cluster.start_agent("a1")
    hp = {"steps": 20, "report_every": 5, "checkpoint_every": 10, "sleep": 0.01}
    trial, alloc = await cluster.allocate("a1", hp)
    await cluster.command("a1", "start", alloc)
    exited = await cluster.exited(trial)
    assert exited["exit_code"] == 0 and exited["outcome"] == "completed"

    assert len(await cluster.of_type(trial, "TrialStarted")) == 1
    validations = await cluster.of_type(trial, "ValidationReported")
    assert [v["steps_completed"] for v in validations] == [5, 10, 15, 20]
    losses = [v["metrics"]["validation_loss"] for v in validations]
    assert losses == sorted(losses, reverse=True)
    assert len(await cluster.of_type(trial, "WorkloadCompleted")) == 4
    checkpoints = await cluster.of_type(trial, "CheckpointSaved")
    assert [c["steps_completed"] for c in checkpoints] == [10, 20]
    assert "state.json" in checkpoints[0]["resources"]
    ckpt_dir = cluster.tmp / "ckpt" / checkpoints[-1]["uuid"]
    assert json.loads((ckpt_dir / "metadata.json").read_text())["steps_completed"] == 20

    async def logged() -> bool:
        return any("done at step 20" in r["line"] for r in await cluster.logs(alloc))

    await wait_until(logged, timeout=10)
    lines = await cluster.logs(alloc)
    assert {r["stream"] for r in lines} == {"stdout"}
    assert sum("training from step 0" in r["line"] for r in lines) == 1

    # The same command again (a redelivery NATS did not deduplicate) and another command id
    # naming the same allocation: both acked as no-ops.
    await cluster.command("a1", "start", alloc, msg_id="redelivered")
    await cluster.command("a1", "start", alloc, command_id=f"start:{alloc}:a1:again")
    await wait_until(
        lambda: "command already executed" in agent.log() and "start is a no-op" in agent.log(),
        timeout=10,
    )
    assert len(await cluster.of_type(trial, "TrialStarted")) == 1
    assert len(await cluster.of_type(trial, "TrialExited")) == 1
    assert sum("training from step 0" in r["line"] for r in await cluster.logs(alloc)) == 1


async def test_preempt_makes_the_trial_checkpoint_and_exit_zero(cluster: Cluster) -> None:
    """On preemption the trial learns it from the long poll, checkpoints and exits 0."""
    await cluster.start_agent("p1")
    hp = {"steps": 100000, "report_every": 5, "checkpoint_every": 0, "sleep": 0.01}
    trial, alloc = await cluster.allocate("p1", hp)
    await cluster.command("p1", "start", alloc)

    async def reporting() -> bool:
        return bool(await cluster.of_type(trial, "ValidationReported"))

    await wait_until(reporting, timeout=20)
    await cluster.store.append(
        names.trial_stream(trial),
        [PreemptionRequested(trial_id=trial, allocation_id=alloc, reason="test", agent_ids=["p1"])],
    )
    await cluster.command("p1", "preempt", alloc)
    exited = await cluster.exited(trial)
    assert exited["exit_code"] == 0 and exited["outcome"] == "preempted"
    checkpoints = await cluster.of_type(trial, "CheckpointSaved")
    assert len(checkpoints) == 1 and checkpoints[0]["steps_completed"] >= 5
    lines = [r["line"] for r in await cluster.logs(alloc)]
    assert any(line.startswith("preempted at step") for line in lines), lines


async def test_preempted_trial_that_ignores_the_signal_is_terminated(cluster: Cluster) -> None:
    """A trial that does not exit within --preempt-timeout gets SIGTERM (exit 143)."""
    await cluster.start_agent("p2", "--preempt-timeout", "0.5")
    trial, alloc = await cluster.allocate("p2", entrypoint="python3 sleeper.py")
    await cluster.command("p2", "start", alloc)
    await wait_until(lambda: cluster.pid_file(alloc).exists(), timeout=20)
    await cluster.store.append(
        names.trial_stream(trial),
        [PreemptionRequested(trial_id=trial, allocation_id=alloc, reason="test", agent_ids=["p2"])],
    )
    await cluster.command("p2", "preempt", alloc)
    exited = await cluster.exited(trial)
    assert exited["exit_code"] == 128 + signal.SIGTERM and exited["outcome"] == "preempted"


async def test_kill_escalates_to_sigkill_for_the_whole_process_group(cluster: Cluster) -> None:
    """Kill sends SIGTERM, then SIGKILL after the grace, to the trial and its children."""
    agent = await cluster.start_agent("k1")
    trial, alloc = await cluster.allocate("k1", entrypoint="python3 sleeper.py --ignore-term")
    await cluster.command("k1", "start", alloc)
    await wait_until(lambda: cluster.pid_file(alloc).exists(), timeout=20)
    pid_file = cluster.pid_file(alloc)
    await wait_until(lambda: pid_file.read_text().strip() != "", timeout=5)
    grandchild = int(pid_file.read_text())
    started = time.monotonic()
    await cluster.store.append(
        names.trial_stream(trial),
        [KillRequested(trial_id=trial, allocation_id=alloc, reason="test", agent_ids=["k1"])],
    )
    await cluster.command("k1", "kill", alloc)
    exited = await cluster.exited(trial)
    assert exited["exit_code"] == 128 + signal.SIGKILL and exited["outcome"] == "killed"
    assert time.monotonic() - started >= 1.0  # the grace was honoured
    assert "sending SIGKILL" in agent.log()
    assert not _alive(grandchild)


async def test_nonzero_exit_code_is_reported_as_is(cluster: Cluster) -> None:
    """A trial failing with exit code 3 is reported as exited 3 (outcome failed)."""
    await cluster.start_agent("f1")
    hp = {"steps": 10, "report_every": 1, "checkpoint_every": 0, "fail_at_step": 3}
    trial, alloc = await cluster.allocate("f1", hp)
    await cluster.command("f1", "start", alloc)
    exited = await cluster.exited(trial)
    assert exited["exit_code"] == 3 and exited["outcome"] == "failed"
    assert [c["steps_completed"] for c in await cluster.of_type(trial, "CheckpointSaved")] == [3]


async def test_inactive_allocation_is_not_started(cluster: Cluster) -> None:
    """A start for an allocation that is no longer current is acked and not run."""
    agent = await cluster.start_agent("i1")
    trial, alloc = await cluster.allocate("i1", {"steps": 1})
    slot_ids = [s.slot_id for s in cpu_slots("i1", 1)]
    await cluster.store.append(
        names.trial_stream(trial),
        [
            SlotsAllocated(
                trial_id=trial,
                allocation_id=names.allocation_id(trial, 2),
                placements={"i1": slot_ids},
                run_id=2,
            )
        ],
    )
    await cluster.command("i1", "start", alloc)
    await wait_until(lambda: "no longer active" in agent.log(), timeout=10)
    assert not await cluster.of_type(trial, "TrialStarted")


async def test_two_slots_run_one_process_per_rank_and_only_the_chief_reports(
    cluster: Cluster,
) -> None:
    """With two slots the agent starts ranks 0 and 1; only rank 0's report lands."""
    await cluster.start_agent("m1", slots=2)
    trial, alloc = await cluster.allocate("m1", entrypoint="python3 ranks.py", slots=2)
    await cluster.command("m1", "start", alloc)
    exited = await cluster.exited(trial)
    assert exited["exit_code"] == 0
    validations = await cluster.of_type(trial, "ValidationReported")
    assert [v["metrics"]["rank"] for v in validations] == [0.0]

    async def both() -> bool:
        lines = await cluster.logs(alloc)
        return {(r["rank"], r["line"]) for r in lines} >= {(0, "rank 0 of 2"), (1, "rank 1 of 2")}

    await wait_until(both, timeout=10)


async def test_sigterm_stops_the_agent_after_stopping_and_reporting_its_runs(
    cluster: Cluster,
) -> None:
    """SIGTERM to the agent records that it is leaving (before any exit), terminates its trial,
    reports the exit as the agent's own stop (outcome ``lost``, not the trial's failure), and
    exits 0."""
    agent = await cluster.start_agent("s1")
    trial, alloc = await cluster.allocate("s1", {"steps": 100000, "sleep": 0.01})
    await cluster.command("s1", "start", alloc)

    async def started() -> bool:
        return bool(await cluster.of_type(trial, "TrialStarted"))

    await wait_until(started, timeout=20)
    agent.proc.send_signal(signal.SIGTERM)
    exited = await cluster.exited(trial)
    assert (exited["outcome"], exited["exit_code"]) == ("lost", 128 + signal.SIGTERM)
    assert await agent.stop(signal_it=False) == 0, agent.log()
    [leaving] = [e for e in await cluster.store.read_stream("agent-s1") if e.type == "AgentLeaving"]
    [ended] = [
        e for e in await cluster.store.read_stream(f"trial-{trial}") if e.type == "TrialExited"
    ]
    assert leaving.position < ended.position, "the agent said it was leaving before the exit"


async def test_trial_stops_itself_once_its_run_is_declared_lost(cluster: Cluster) -> None:
    """A run the scheduler declares lost while its process still trains (and never asks
    ``should_preempt``) ends itself promptly through the Core API: exit status 75, with a line
    saying why in its logs; the agent's later exit report appends nothing."""
    await cluster.start_agent("g1")
    hparams = {"steps": 100000, "sleep": 0.01, "ignore_preemption": True}
    trial, alloc = await cluster.allocate("g1", hparams)
    await cluster.command("g1", "start", alloc)

    async def started() -> bool:
        return bool(await cluster.of_type(trial, "TrialStarted"))

    await wait_until(started, timeout=20)
    [allocated] = await cluster.of_type(trial, "SlotsAllocated")
    await cluster.store.append(
        f"trial-{trial}",
        [
            TrialExited(trial_id=trial, run_id=1, allocation_id=alloc, outcome="lost"),
            SlotsReleased(trial_id=trial, allocation_id=alloc, placements=allocated["placements"]),
        ],
    )

    async def stopped() -> bool:
        return any(
            "no longer its trial's current run" in row["line"] for row in await cluster.logs(alloc)
        )

    await wait_until(stopped, timeout=30)
    agent = cluster.agents[-1]
    await wait_until(lambda: '"exit_code": 75' in agent.log(), timeout=30)
    await wait_until(lambda: '"exit reported"' in agent.log(), timeout=30)
    exits = await cluster.of_type(trial, "TrialExited")
    assert [x["outcome"] for x in exits] == ["lost"], "the late exit report appended nothing"


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "0, GPU-11111111-aaaa, NVIDIA H100 80GB HBM3"
echo "1, GPU-22222222-bbbb, NVIDIA H100 80GB HBM3"
"""


async def test_gpus_found_by_nvidia_smi_become_cuda_slots(cluster: Cluster) -> None:
    """Without --artificial-slots the agent offers the GPUs nvidia-smi lists (a stand-in script
    here) and a run sees only its own GPUs in CUDA_VISIBLE_DEVICES."""
    bin_dir = cluster.tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    await cluster.start_agent("g1", slots=None, path=str(bin_dir))
    registered = [
        e.payload
        for e in await cluster.store.read_stream("agent-g1")
        if e.type == "AgentRegistered"
    ]
    assert registered[0]["slots"] == [
        {"slot_id": "GPU-11111111-aaaa", "device": "cuda", "name": "NVIDIA H100 80GB HBM3"},
        {"slot_id": "GPU-22222222-bbbb", "device": "cuda", "name": "NVIDIA H100 80GB HBM3"},
    ]
    entrypoint = "python3 -c \"import os; print('visible=' + os.environ['CUDA_VISIBLE_DEVICES'])\""
    trial, alloc = await cluster.allocate(
        "g1", entrypoint=entrypoint, slot_ids=["GPU-22222222-bbbb"]
    )
    await cluster.command("g1", "start", alloc)
    assert (await cluster.exited(trial))["exit_code"] == 0

    async def logged() -> bool:
        return any(r["line"] == "visible=GPU-22222222-bbbb" for r in await cluster.logs(alloc))

    await wait_until(logged, timeout=10)


async def test_digits_example_trains_under_the_agent(cluster: Cluster) -> None:
    """The PyTorch digits example runs under the agent (``python3`` resolves to an interpreter
    with torch), reports validation metrics including ``batches``, and checkpoints model.pt."""
    await cluster.start_agent("d1")
    hp = {"lr": 0.003, "hidden": 64, "dropout": 0.1, "batch_size": 32, "max_batches": 200}
    trial, alloc = await cluster.allocate("d1", hp, entrypoint="python3 digits.py")
    await cluster.command("d1", "start", alloc)
    exited = await cluster.exited(trial, timeout=60)
    assert exited["exit_code"] == 0, [r["line"] for r in await cluster.logs(alloc)]
    validations = await cluster.of_type(trial, "ValidationReported")
    assert [v["metrics"]["batches"] for v in validations] == [100.0, 200.0]
    assert validations[-1]["metrics"]["validation_accuracy"] > 0.8
    checkpoints = await cluster.of_type(trial, "CheckpointSaved")
    assert [c["steps_completed"] for c in checkpoints] == [100, 200]
    assert "model.pt" in checkpoints[-1]["resources"]


# --- a restarted agent: a new incarnation, and the exit reports of its killed predecessor ----


async def registrations(c: Cluster, agent_id: str) -> list[tuple[int, str]]:
    """(position, incarnation) of each AgentRegistered of the agent."""
    return [
        (e.position, e.payload["incarnation"])
        for e in await c.store.read_stream(f"agent-{agent_id}")
        if e.type == "AgentRegistered"
    ]


async def test_heartbeats_and_started_report_name_the_process_and_number_the_beats(
    cluster: Cluster,
) -> None:
    """TrialStarted carries the agent's incarnation and the first heartbeat number listing the
    run; the stored heartbeat of that incarnation reaches that number and lists the run."""
    await cluster.start_agent("h1")
    trial, alloc = await cluster.allocate("h1", {"steps": 100_000, "sleep": 0.01})
    await cluster.command("h1", "start", alloc)

    async def started() -> bool:
        return bool(await cluster.of_type(trial, "TrialStarted"))

    await wait_until(started, timeout=30)
    [payload] = await cluster.of_type(trial, "TrialStarted")
    [(_, incarnation)] = await registrations(cluster, "h1")
    assert len(incarnation) == 32 and payload["agent_incarnation"] == incarnation
    assert payload["listed_from"] >= 1

    async def listed() -> bool:
        row = await cluster.store.fetchrow(
            "SELECT incarnation, seq, running FROM agent_heartbeats WHERE agent_id = 'h1'"
        )
        return (
            row is not None
            and row["incarnation"] == incarnation
            and row["seq"] >= payload["listed_from"]
            and alloc in row["running"]
        )

    await wait_until(listed, timeout=15)


async def test_exit_report_cut_short_by_sigkill_is_delivered_by_the_next_process(
    cluster: Cluster,
) -> None:
    """SIGKILL the agent after its run completed but before the exit report was sent: the next
    process of the agent reports it (completed, exit 0) before registering as a new incarnation."""
    first = await cluster.start_agent("k1", faults="agent.before_exit_report=300")
    trial, alloc = await cluster.allocate("k1", {"steps": 5, "sleep": 0.01})
    await cluster.command("k1", "start", alloc)
    await wait_until(lambda: "FAULT-POINT agent.before_exit_report" in first.log(), timeout=30)
    kept = list((cluster.tmp / "work-k1" / "unreported-exits").glob("*.json"))
    assert len(kept) == 1 and alloc in kept[0].read_text()
    first.proc.send_signal(signal.SIGKILL)
    assert await first.stop(signal_it=False) == -signal.SIGKILL
    assert await cluster.of_type(trial, "TrialExited") == []  # the report really was lost

    await cluster.start_agent("k1")
    exited = await cluster.exited(trial)
    assert (exited["outcome"], exited["exit_code"]) == ("completed", 0)
    regs = await registrations(cluster, "k1")
    assert len(regs) == 2 and regs[0][1] != regs[1][1], "same slots, new incarnation: new fact"
    [exit_event] = [e for e in await cluster.events(trial) if e.type == "TrialExited"]
    assert exit_event.position < regs[1][0], "the leftover exit is reported before registering"
    assert list((cluster.tmp / "work-k1" / "unreported-exits").glob("*.json")) == []


async def test_reserved_agent_preempts_its_trial_on_sigterm_and_exits_zero(
    cluster: Cluster,
) -> None:
    """An agent run by Slurm (``--reserved-for A --preempt-on-term``) that gets SIGTERM while
    its trial trains has the run preempted (the trial checkpoints and exits 0: outcome
    ``preempted``, not ``lost``) and then exits by itself with status 0."""
    trial, alloc = await cluster.allocate(
        "slurm-1-n1", {"steps": 100000, "report_every": 5, "checkpoint_every": 0, "sleep": 0.01}
    )
    agent = await cluster.start_agent("slurm-1-n1", "--reserved-for", alloc, "--preempt-on-term")
    [registered] = [
        e.payload
        for e in await cluster.store.read_stream("agent-slurm-1-n1")
        if e.type == "AgentRegistered"
    ]
    assert registered["reserved_for"] == alloc
    await cluster.command("slurm-1-n1", "start", alloc)

    async def reporting() -> bool:
        return bool(await cluster.of_type(trial, "ValidationReported"))

    await wait_until(reporting, timeout=20)
    agent.proc.send_signal(signal.SIGTERM)
    exited = await cluster.exited(trial)
    assert (exited["outcome"], exited["exit_code"]) == ("preempted", 0), agent.log()
    [preemption] = await cluster.of_type(trial, "PreemptionRequested")
    assert preemption["reason"] == "the resource manager signalled the job: SIGTERM"
    assert len(await cluster.of_type(trial, "CheckpointSaved")) == 1
    assert await agent.stop(signal_it=False) == 0, agent.log()


async def test_reserved_agent_exits_zero_once_its_run_ended_and_was_reported(
    cluster: Cluster,
) -> None:
    """A reserved agent whose run completes stops by itself (status 0) once the exit report was
    taken; one whose allocation never starts stops after ``--reserved-wait`` seconds."""
    trial, alloc = await cluster.allocate("slurm-2-n1", {"steps": 5, "report_every": 5})
    agent = await cluster.start_agent("slurm-2-n1", "--reserved-for", alloc)
    await cluster.command("slurm-2-n1", "start", alloc)
    assert (await cluster.exited(trial))["outcome"] == "completed"
    assert await agent.stop(signal_it=False) == 0, agent.log()
    assert "reserved agent stopping" in agent.log()

    idle = await cluster.start_agent(
        "slurm-3-n1", "--reserved-for", "999.1", "--reserved-wait", "0.5"
    )
    assert await idle.stop(signal_it=False) == 0, idle.log()
    assert "was not started here within 0.5 seconds" in idle.log()


async def test_sigusr2_under_preempt_on_term_preempts_the_trial_but_keeps_the_agent(
    cluster: Cluster,
) -> None:
    """SIGUSR2 (Slurm's warning before the time limit) has the trial preempted; the agent
    itself keeps running."""
    agent = await cluster.start_agent("u1", "--preempt-on-term")
    hp = {"steps": 100000, "report_every": 5, "checkpoint_every": 0, "sleep": 0.01}
    trial, alloc = await cluster.allocate("u1", hp)
    await cluster.command("u1", "start", alloc)

    async def reporting() -> bool:
        return bool(await cluster.of_type(trial, "ValidationReported"))

    await wait_until(reporting, timeout=20)
    agent.proc.send_signal(signal.SIGUSR2)
    assert (await cluster.exited(trial))["outcome"] == "preempted"
    assert agent.proc.poll() is None, agent.log()
