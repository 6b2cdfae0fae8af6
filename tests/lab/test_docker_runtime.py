"""The Docker runtime against a real engine: output, exit codes, signals, mounts, cleanup, and
the confinement of the trial's containers (identity, privileges, host paths)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from events.domain.config.cluster import TaskPolicy
from services.agent.docker_runtime import (
    LABEL_AGENT,
    LABEL_ALLOCATION,
    DockerRuntimeError,
    TrialContainers,
    container_user,
    launch,
    plan_containers,
    remove_own_containers,
)
from services.agent.log_shipping import LogShipper
from services.agent.runtime import RunSpec, trial_environment
from services.agent.signals import preempt, terminate
from services.confine import SHARED_DIR_MODE, Identity
from tests.agent_specs import spec_answer
from tests.helpers import wait_until

SCRIPT = """
import os, pathlib, signal, sys, time
mode = sys.argv[1]
print("trial", os.environ["CAIRN_TRIAL_ID"], "in", os.getcwd(), flush=True)
print("to stderr", file=sys.stderr, flush=True)
ckpt = pathlib.Path(os.environ["CAIRN_CHECKPOINT_DIR"]) / "done"
if mode == "exit":
    ckpt.write_text("saved")
    sys.exit(3)
if mode == "term":
    def on_term(signum, frame):
        print("got SIGTERM", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
if mode == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "status":
    wanted = ("Uid", "Gid", "Groups", "NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    status = {}
    for line in open("/proc/self/status").read().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            status[key] = value.strip()
    status["home"] = os.environ.get("HOME")
    status["docker_sock"] = os.path.exists("/var/run/docker.sock")
    print("STATUS " + __import__("json").dumps(status), flush=True)
    sys.exit(0)
print("ready", flush=True)
time.sleep(600)
"""


@pytest.fixture
def agent_id() -> Iterator[str]:
    """A fresh agent id; its containers are removed after the test whatever happened."""
    from services.agent.docker_runtime import docker_client

    name = f"lab-{uuid.uuid4().hex[:8]}"
    yield name
    remove_own_containers(docker_client(), name)


IDENTITY = Identity(2_000_000_301, 2_000_000_301, "lab")


def _run(tmp_path: Path, mode: str, config: dict[str, Any] | None = None) -> tuple[RunSpec, Path]:
    """A run of the script in ``mode``, its work and checkpoint directories prepared as the
    agent prepares them for :data:`IDENTITY`."""
    tmp_path.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / "script.py").write_text(SCRIPT)
    for path in (work, work / "script.py"):
        os.chown(path, IDENTITY.uid, IDENTITY.gid)
    raw = {
        "allocation_id": f"5.1.{uuid.uuid4().hex[:6]}",
        "trial_id": 5,
        "entrypoint": ["python3", "script.py", mode],
        "token": "t",
        "slot_ids": ["s0"],
        "config": config or {},
    }
    run = RunSpec.from_api(spec_answer(**raw), "a", tmp_path / "checkpoints")
    run.checkpoint_dir.mkdir(parents=True)
    run.checkpoint_dir.chmod(SHARED_DIR_MODE)
    return run, work


async def _start(
    client: Any, image: str, agent_id: str, tmp_path: Path, mode: str
) -> tuple[TrialContainers, LogShipper, RunSpec]:
    run, work = _run(tmp_path, mode)
    envs = trial_environment(run, agent_id=agent_id, api_url="http://x", gpu_slots={}, base={})
    plans = plan_containers(
        run, image, envs, agent_id=agent_id, work=work, gpu_slots={}, user=container_user(IDENTITY)
    )
    shipper = LogShipper(client=None, allocation_id=run.allocation_id, key_prefix="k")  # type: ignore[arg-type]
    containers = TrialContainers(client, run.allocation_id, shipper, kill_grace=2.0)
    await containers.launch(plans)
    return containers, shipper, run


def _lines(shipper: LogShipper) -> list[tuple[str, str]]:
    return [(e["stream"], e["line"]) for _, e in shipper._buffer]


async def test_exit_code_logs_and_checkpoint_mount(
    docker_engine: Any, base_image: str, agent_id: str, tmp_path: Path
) -> None:
    """A container run ships stdout and stderr, reports its exit code, writes the checkpoint
    directory on the host, and is removed once it has exited."""
    containers, shipper, run = await _start(docker_engine, base_image, agent_id, tmp_path, "exit")
    ids = containers.ids
    assert await containers.wait() == 3
    lines = _lines(shipper)
    assert ("stdout", f"trial 5 in {tmp_path / 'work'}") in lines
    assert ("stderr", "to stderr") in lines
    assert (run.checkpoint_dir / "done").read_text() == "saved"
    assert not docker_engine.containers.list(all=True, filters={"id": ids[0]})


async def test_terminate_reaches_the_process_in_the_container(
    docker_engine: Any, base_image: str, agent_id: str, tmp_path: Path
) -> None:
    """A kill sends SIGTERM to the trial's process, which exits on its own within the grace."""
    containers, shipper, _ = await _start(docker_engine, base_image, agent_id, tmp_path, "term")
    waiter = asyncio.create_task(containers.wait())
    await wait_until(lambda: ("stdout", "ready") in _lines(shipper), timeout=60)
    await terminate(containers, grace=30.0)
    assert await waiter == 143
    assert ("stdout", "got SIGTERM") in _lines(shipper)


async def test_sigkill_after_the_grace(
    docker_engine: Any, base_image: str, agent_id: str, tmp_path: Path
) -> None:
    """A trial that ignores SIGTERM is SIGKILLed once the preemption timeout and grace pass."""
    containers, shipper, _ = await _start(docker_engine, base_image, agent_id, tmp_path, "ignore")
    waiter = asyncio.create_task(containers.wait())
    await wait_until(lambda: ("stdout", "ready") in _lines(shipper), timeout=60)
    await preempt(containers, timeout=0.5, grace=1.0)
    assert await waiter == 137


async def test_restart_removes_only_its_own_containers(
    docker_engine: Any, base_image: str, agent_id: str
) -> None:
    """A restarted agent removes the containers labelled with its id, never another agent's or
    an unlabelled one."""
    other = f"{agent_id}-other"
    made = []
    try:
        for labels in (
            {LABEL_AGENT: agent_id, LABEL_ALLOCATION: "1.1.1"},
            {LABEL_AGENT: other, LABEL_ALLOCATION: "2.1.1"},
            {},
        ):
            made.append(
                docker_engine.containers.run(
                    base_image, ["sleep", "600"], labels=labels, detach=True, network_mode="none"
                )
            )
        removed = remove_own_containers(docker_engine, agent_id)
        assert removed == ["1.1.1"]
        alive = {c.id for c in docker_engine.containers.list(all=True)}
        assert made[0].id not in alive
        assert made[1].id in alive and made[2].id in alive
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                container.remove(force=True)


async def test_container_runs_unprivileged_without_capabilities_or_new_privileges(
    docker_engine: Any, base_image: str, agent_id: str, tmp_path: Path
) -> None:
    """The trial's process in its container runs as the run's non-root uid and gid, with
    NoNewPrivs set, every capability set empty, its work directory as HOME and no Docker
    socket."""
    containers, shipper, _ = await _start(docker_engine, base_image, agent_id, tmp_path, "status")
    assert await containers.wait() == 0
    [line] = [text for _, text in _lines(shipper) if text.startswith("STATUS ")]
    status = json.loads(line.removeprefix("STATUS "))
    assert {int(u) for u in status["Uid"].split()} == {IDENTITY.uid}
    assert {int(g) for g in status["Gid"].split()} == {IDENTITY.gid}
    assert status["NoNewPrivs"] == "1"
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[name] == "0000000000000000", (name, status)
    assert status["home"] == str(tmp_path / "work")
    assert status["docker_sock"] is False


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"bind_mounts": [{"host_path": "/", "container_path": "/host"}]}, "bind_mounts[0]"),
        (
            {"bind_mounts": [{"host_path": "/var/run/docker.sock", "container_path": "/s"}]},
            "bind_mounts[0]",
        ),
        (
            {"resources": {"devices": [{"host_path": "/dev/kmsg", "container_path": "/dev/k"}]}},
            "resources.devices[0]",
        ),
        ({"environment": {"add_capabilities": ["SYS_ADMIN"]}}, "environment.add_capabilities[0]"),
    ],
)
async def test_the_agent_refuses_host_paths_devices_and_capabilities_not_allowed(
    docker_engine: Any,
    base_image: str,
    agent_id: str,
    tmp_path: Path,
    config: dict[str, Any],
    field: str,
) -> None:
    """A run whose config mounts a host path, a device or a capability the cluster does not
    allow (however it reached the agent) is refused before any container exists."""
    run, work = _run(tmp_path, "exit", config)
    envs = trial_environment(run, agent_id=agent_id, api_url="http://x", gpu_slots={}, base={})
    shipper = LogShipper(client=None, allocation_id=run.allocation_id, key_prefix="k")  # type: ignore[arg-type]
    with pytest.raises(DockerRuntimeError, match=re.escape(field)):
        await launch(
            docker_engine, run, base_image, envs, shipper, agent_id=agent_id, work=work,
            gpu_slots={}, kill_grace=1.0, share_from=None, identity=IDENTITY,
            policy=TaskPolicy(),
        )  # fmt: skip
    labelled = {"label": f"{LABEL_AGENT}={agent_id}"}
    assert docker_engine.containers.list(all=True, filters=labelled) == []
