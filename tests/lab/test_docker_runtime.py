"""The Docker runtime against a real engine: output, exit codes, signals, mounts, cleanup."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.agent.docker_runtime import (
    LABEL_AGENT,
    LABEL_ALLOCATION,
    TrialContainers,
    agent_user,
    plan_containers,
    remove_own_containers,
)
from services.agent.runtime import LogShipper, RunSpec, trial_environment
from services.agent.signals import preempt, terminate
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


def _run(tmp_path: Path, mode: str) -> tuple[RunSpec, Path]:
    work = tmp_path / "work"
    work.mkdir()
    (work / "script.py").write_text(SCRIPT)
    raw = {
        "allocation_id": f"5.1.{uuid.uuid4().hex[:6]}",
        "trial_id": 5,
        "entrypoint": ["python3", "script.py", mode],
        "token": "t",
        "slot_ids": ["s0"],
        "config": {},
    }
    run = RunSpec.from_api(raw, "a", tmp_path / "checkpoints")
    run.checkpoint_dir.mkdir(parents=True)
    return run, work


async def _start(
    client: Any, image: str, agent_id: str, tmp_path: Path, mode: str
) -> tuple[TrialContainers, LogShipper, RunSpec]:
    run, work = _run(tmp_path, mode)
    envs = trial_environment(run, agent_id=agent_id, api_url="http://x", gpu_slots={}, base={})
    plans = plan_containers(
        run, image, envs, agent_id=agent_id, work=work, gpu_slots={}, user=agent_user()
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
