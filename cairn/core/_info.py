"""What the cluster tells a trial process about itself (mirrors ``det.get_cluster_info()``).

The agent starts every trial process with the ``CAIRN_*`` environment of ``docs/protocol.md``;
:func:`get_cluster_info` reads it, and returns ``None`` when the process runs off-cluster.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

_REQUIRED = ("CAIRN_MASTER", "CAIRN_TRIAL_ID", "CAIRN_ALLOCATION_ID")


@dataclass(frozen=True)
class TrialInfo:
    """The trial this process runs.

    Attributes:
        trial_id: the trial id, ``"<experiment>.<n>"`` (``"local"`` off-cluster).
        experiment_id: the experiment id (0 off-cluster).
        hparams: the trial's hyperparameters.
        trial_seed: the trial's random seed.
        steps_completed: steps of the checkpoint this run resumes from (0 for a fresh start).
        run_id: which run of the trial this is (1, 2, ... one per allocation).
        config: the experiment config as plain JSON data.
    """

    trial_id: str
    experiment_id: int
    hparams: dict[str, Any]
    trial_seed: int = 0
    steps_completed: int = 0
    run_id: int = 1
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterInfo:
    """Everything the cluster injected into this process.

    Attributes:
        master_url: the API gateway URL (``CAIRN_MASTER``).
        token: the bearer token scoped to this trial (``CAIRN_TOKEN``).
        agent_id: the agent that started this process.
        allocation_id: ``"<trial_id>.<run_id>"``.
        slot_ids: the slots of this allocation on this agent.
        latest_checkpoint: the checkpoint uuid to resume from, or ``None``.
        checkpoint_dir: the shared_fs/directory root of this trial's checkpoints.
        trial: the trial's own facts.
        on_cluster: False for the stand-in built by an off-cluster ``init()``.
    """

    master_url: str
    token: str
    agent_id: str
    allocation_id: str
    slot_ids: list[str]
    latest_checkpoint: str | None
    checkpoint_dir: str | None
    trial: TrialInfo
    on_cluster: bool = True

    @property
    def task_type(self) -> str:
        """Always ``"TRIAL"`` (the only task type cairn runs)."""
        return "TRIAL"


def _json(name: str, default: Any, env: dict[str, str]) -> Any:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc}") from exc


def _int(name: str, default: int, env: dict[str, str]) -> int:
    raw = env.get(name, "")
    return int(raw) if raw.strip() else default


def get_cluster_info(environ: dict[str, str] | None = None) -> ClusterInfo | None:
    """Reads the ``CAIRN_*`` environment.

    Args:
        environ: the environment to read (``os.environ`` by default).

    Returns:
        The cluster info, or ``None`` when this process was not started by a cairn agent.
    """
    env = dict(os.environ if environ is None else environ)
    if not all(env.get(name) for name in _REQUIRED):
        return None
    trial = TrialInfo(
        trial_id=env["CAIRN_TRIAL_ID"],
        experiment_id=_int("CAIRN_EXPERIMENT_ID", 0, env),
        hparams=dict(_json("CAIRN_HPARAMS", {}, env)),
        trial_seed=_int("CAIRN_TRIAL_SEED", 0, env),
        steps_completed=_int("CAIRN_STEPS_COMPLETED", 0, env),
        run_id=_int("CAIRN_RUN_ID", 1, env),
        config=dict(_json("CAIRN_EXPERIMENT_CONFIG", {}, env)),
    )
    return ClusterInfo(
        master_url=env["CAIRN_MASTER"].rstrip("/"),
        token=env.get("CAIRN_TOKEN", ""),
        agent_id=env.get("CAIRN_AGENT_ID", ""),
        allocation_id=env["CAIRN_ALLOCATION_ID"],
        slot_ids=[str(s) for s in _json("CAIRN_SLOT_IDS", [], env)],
        latest_checkpoint=env.get("CAIRN_LATEST_CHECKPOINT") or None,
        checkpoint_dir=env.get("CAIRN_CHECKPOINT_DIR") or None,
        trial=trial,
    )
