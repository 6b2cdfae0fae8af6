"""The lab cluster end to end: images built offline, ``docker compose`` up, an adaptive ASHA
experiment through the CLI with its trials in containers, an agent container killed mid-trial
and the trial resumed on the other agent from its checkpoint, then a teardown that leaves no
container, network or volume behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.agent.docker_runtime import LABEL_AGENT, LABEL_TRIAL
from tests.helpers import wait_until_sync as wait_until
from tests.lab.conftest import ROOT

QUICKSTART = ROOT / "deploy" / "compose" / "quickstart.sh"
TRIAL_DIR = Path(__file__).parent / "trial"
PROJECT = "cairnlab"


def _env_file(path: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, _, v in pairs}


@pytest.fixture(scope="module")
def cluster(
    docker_engine: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The compose cluster (its own project and ports), taken down with its volumes after."""
    env_file = ROOT / "deploy" / "compose" / ".env"
    assert not env_file.exists() or _env_file(env_file).get("COMPOSE_PROJECT_NAME") == PROJECT, (
        f"{env_file} belongs to another cluster; move it away to run the lab suite"
    )
    env = {
        **os.environ,
        "COMPOSE_PROJECT_NAME": PROJECT,
        "CAIRN_API_PORT": os.environ.get("CAIRN_LAB_API_PORT", "18080"),
        "CAIRN_NATS_PORT": os.environ.get("CAIRN_LAB_NATS_PORT", "14222"),
        "PYTHON": sys.executable,
    }
    try:
        subprocess.run([str(QUICKSTART), "up"], check=True, env=env, timeout=1800)
        values = _env_file(env_file)
        home = tmp_path_factory.mktemp("cli-home")
        yield {
            **values,
            "url": f"http://127.0.0.1:{values['CAIRN_API_PORT']}",
            "home": str(home),
        }
    finally:
        subprocess.run([str(QUICKSTART), "compose", "logs", "--tail", "200"], env=env)
        subprocess.run([str(QUICKSTART), "down"], env=env, timeout=600)
        env_file.unlink(missing_ok=True)
    left = {
        "containers": docker_engine.containers.list(
            all=True, filters={"label": f"com.docker.compose.project={PROJECT}"}
        ),
        "trial containers": docker_engine.containers.list(all=True, filters={"label": LABEL_AGENT}),
        "networks": docker_engine.networks.list(
            filters={"label": f"com.docker.compose.project={PROJECT}"}
        ),
        "volumes": docker_engine.volumes.list(
            filters={"label": f"com.docker.compose.project={PROJECT}"}
        ),
    }
    assert not any(left.values()), f"left behind: {left}"


def cli(cluster: dict[str, str], *args: str, timeout: float = 120) -> Any:
    """Runs ``cairn --json ARGS`` against the cluster; returns its JSON output."""
    env = {**os.environ, "CAIRN_HOME": cluster["home"], "CAIRN_MASTER": cluster["url"]}
    out = subprocess.run(
        [sys.executable, "-m", "cairn.cli", "--json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert out.returncode == 0, f"cairn {' '.join(args)}: exit {out.returncode}: {out.stderr}"
    return json.loads(out.stdout) if out.stdout.strip() else None


def trial_containers(engine: Any) -> dict[int, str]:
    """Running trial containers: trial id -> the agent that started it."""
    found = engine.containers.list(filters={"label": LABEL_TRIAL})
    return {int(c.labels[LABEL_TRIAL]): c.labels[LABEL_AGENT] for c in found}


def agent_container(engine: Any, agent: str) -> Any:
    """The compose container of ``agent`` (``agent-1`` or ``agent-2``)."""
    (found,) = engine.containers.list(
        all=True,
        filters={
            "label": [
                f"com.docker.compose.project={PROJECT}",
                f"com.docker.compose.service={agent}",
            ]
        },
    )
    return found


def test_asha_in_containers_survives_an_agent_kill(
    docker_engine: Any, cluster: dict[str, str]
) -> None:
    """A trial whose agent container is SIGKILLed resumes on the other agent from its checkpoint,
    and the experiment completes."""
    cli(cluster, "user", "login", "admin", f"--password={cluster['CAIRN_ADMIN_PASSWORD']}")
    created = cli(cluster, "experiment", "create", str(TRIAL_DIR / "adaptive.yaml"), str(TRIAL_DIR))
    exp_id = int(created["id"])

    def victim() -> tuple[int, str] | None:
        for trial_id, agent in trial_containers(docker_engine).items():
            trial = cli(cluster, "trial", "describe", str(trial_id))
            if trial.get("latest_checkpoint"):
                return trial_id, agent
        return None

    chosen = wait_until(victim, timeout=900, every=2.0)
    assert chosen is not None
    trial_id, agent = chosen
    before = cli(cluster, "trial", "describe", str(trial_id))
    killed = agent_container(docker_engine, agent)
    killed.kill()  # SIGKILL: the agent gets no chance to stop or report anything
    survivor = "agent-2" if agent == "agent-1" else "agent-1"

    def resumed_elsewhere() -> list[str]:
        # From the trial's logs: ASHA may stop the resumed run before a poll sees its container.
        lines = [e["line"] for e in cli(cluster, "trial", "logs", str(trial_id))["logs"]]
        return [line for line in lines if "resumed from checkpoint" in line and survivor in line]

    (line, *_) = wait_until(resumed_elsewhere, timeout=600, every=2.0)
    resumed_at = int(re.search(r"at batch (\d+)", line).group(1))  # type: ignore[union-attr]
    # The checkpoint known before the kill bounds the resume point from below; progress reported
    # after that checkpoint (steps_completed) may be lost with the agent.
    known = cli(cluster, "checkpoint", "describe", before["latest_checkpoint"])
    assert resumed_at >= known["steps_completed"] > 0  # from its checkpoint, not from scratch

    killed.start()  # the restarted agent removes what its dead process left running

    def leftover_gone() -> bool:
        mine = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={agent}"})
        return all(c.labels.get(LABEL_TRIAL) != str(trial_id) for c in mine)

    wait_until(leftover_gone, timeout=300, every=2.0)
    cli(cluster, "experiment", "wait", str(exp_id), timeout=1800)
    after = cli(cluster, "trial", "describe", str(trial_id))
    assert after["run_id"] > before["run_id"]  # a new run (a lost agent is not a restart)
    assert after["steps_completed"] > before["steps_completed"]
    described = cli(cluster, "experiment", "describe", str(exp_id))
    assert described["state"] == "COMPLETED"
