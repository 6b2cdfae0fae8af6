"""The lab cluster end to end: images built offline, ``docker compose`` up, an adaptive ASHA
experiment through the CLI with its trials in containers, an agent container killed mid-trial
and the trial resumed on the other agent from its checkpoint, then a teardown that leaves no
container, network or volume behind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from services.agent.docker_runtime import LABEL_AGENT, LABEL_TRIAL
from tests.helpers import wait_until_sync as wait_until
from tests.lab.compose import Lab

TRIAL_DIR = Path(__file__).parent / "trial"


def trial_containers(engine: Any) -> dict[int, str]:
    """Running trial containers: trial id -> the agent that started it."""
    found = engine.containers.list(filters={"label": LABEL_TRIAL})
    return {int(c.labels[LABEL_TRIAL]): c.labels[LABEL_AGENT] for c in found}


def test_asha_in_containers_survives_an_agent_kill(docker_engine: Any, lab: Lab) -> None:
    """A trial whose agent container is SIGKILLed resumes on the other agent from its checkpoint,
    and the experiment completes."""
    created = lab.cli("experiment", "create", str(TRIAL_DIR / "adaptive.yaml"), str(TRIAL_DIR))
    exp_id = int(created["id"])

    def victim() -> tuple[int, str] | None:
        for trial_id, agent in trial_containers(docker_engine).items():
            trial = lab.cli("trial", "describe", str(trial_id))
            if trial.get("latest_checkpoint"):
                return trial_id, agent
        return None

    chosen = wait_until(victim, timeout=900, every=2.0)
    assert chosen is not None
    trial_id, agent = chosen
    before = lab.cli("trial", "describe", str(trial_id))
    (killed,) = lab.containers(docker_engine, agent)
    killed.kill()  # SIGKILL: the agent gets no chance to stop or report anything
    survivor = "agent-2" if agent == "agent-1" else "agent-1"

    def resumed_elsewhere() -> list[str]:
        # From the trial's logs: ASHA may stop the resumed run before a poll sees its container.
        lines = [e["line"] for e in lab.cli("trial", "logs", str(trial_id))["logs"]]
        return [line for line in lines if "resumed from checkpoint" in line and survivor in line]

    (line, *_) = wait_until(resumed_elsewhere, timeout=600, every=2.0)
    resumed_at = int(re.search(r"at batch (\d+)", line).group(1))  # type: ignore[union-attr]
    # The checkpoint known before the kill bounds the resume point from below; progress reported
    # after that checkpoint (steps_completed) may be lost with the agent.
    known = lab.cli("checkpoint", "describe", before["latest_checkpoint"])
    assert resumed_at >= known["steps_completed"] > 0  # from its checkpoint, not from scratch

    killed.start()  # the restarted agent removes what its dead process left running

    def leftover_gone() -> bool:
        mine = docker_engine.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={agent}"})
        return all(c.labels.get(LABEL_TRIAL) != str(trial_id) for c in mine)

    wait_until(leftover_gone, timeout=300, every=2.0)
    lab.cli("experiment", "wait", str(exp_id), timeout=1800)
    after = lab.cli("trial", "describe", str(trial_id))
    assert after["run_id"] > before["run_id"]  # a new run (a lost agent is not a restart)
    assert after["steps_completed"] > before["steps_completed"]
    described = lab.cli("experiment", "describe", str(exp_id))
    assert described["state"] == "COMPLETED"
