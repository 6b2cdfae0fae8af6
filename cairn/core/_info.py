"""What the cluster tells a trial process about itself (mirrors ``det.get_cluster_info()``).

The agent starts every trial process with the ``CAIRN_*`` environment of ``docs/protocol.md``;
:func:`get_cluster_info` reads it, and returns ``None`` when the process runs off-cluster.

Besides the variables every agent sets, these optional ones are read when present:
``CAIRN_CLUSTER_ID``, ``CAIRN_USER`` (the experiment's owner), ``CAIRN_TASK_ID`` (default: the
trial id), ``CAIRN_CONTAINER_ADDRS`` (JSON list), ``CAIRN_CONTAINER_RANK`` and
``CAIRN_CONTAINER_SLOT_COUNTS`` (JSON list). Without the ``CAIRN_CONTAINER_*`` variables the
container layout is derived from the rank variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``): one container per machine, each with the same number of
processes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from events import settings

_REQUIRED = (settings.MASTER, settings.ALLOCATION_ID)
"""Without both (and a trial or task id) the process was not started by a cairn agent."""
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class TrialInfo:
    """The trial this process runs.

    Attributes:
        trial_id: the trial's cluster-wide integer id, as in Determined (0 off-cluster).
        experiment_id: the experiment id (0 off-cluster).
        hparams: the trial's hyperparameters.
        trial_seed: the trial's random seed.
        steps_completed: steps of the checkpoint this run resumes from (0 for a fresh start).
        run_id: which run of the trial this is (1, 2, ... one per allocation).
        config: the experiment config as plain JSON data.
    """

    trial_id: int
    experiment_id: int
    hparams: dict[str, Any]
    trial_seed: int = 0
    steps_completed: int = 0
    run_id: int = 1
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def trial_run_id(self) -> int:
        """Determined's name for :attr:`run_id`."""
        return self.run_id

    @property
    def user_data(self) -> dict[str, Any]:
        """The experiment config's free-form ``data`` section (``{}`` when absent)."""
        data = self.config.get("data")
        return dict(data) if isinstance(data, dict) else {}


@dataclass(frozen=True)
class ClusterInfo:
    """Everything the cluster injected into this process.

    Attributes:
        master_url: the API gateway URL (``CAIRN_MASTER``).
        token: the bearer token scoped to this trial (``CAIRN_TOKEN``).
        agent_id: the agent that started this process.
        allocation_id: ``"<trial_id>.<run_id>"`` (e.g. ``"17.1"``).
        slot_ids: the slots of this allocation on this agent (a GPU slot's id is its UUID).
        latest_checkpoint: the checkpoint uuid to resume from, or ``None``.
        checkpoint_dir: the shared_fs/directory root of this trial's checkpoints.
        trial: the trial's own facts.
        on_cluster: False for the stand-in built by an off-cluster ``init()``.
        cluster_id: the cluster's id (``""`` when the agent does not say).
        task_id: the task this process belongs to; a trial is one task.
        task_type: ``"TRIAL"``, or a task's kind (``"COMMAND"``, ``"NOTEBOOK"``); a task's
            ``trial`` has trial and experiment id 0.
        user: the user who owns the experiment (``""`` when the agent does not say).
        container_addrs: the address of each container (machine) of the run, by container rank;
            empty when the run spans machines and the agent did not publish them.
        container_rank: this container's index among the run's containers.
        container_slot_counts: the number of slots of each container, by container rank.
        gpu_uuids: the UUIDs of the GPUs this process may use (``[]`` on CPU slots).
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
    cluster_id: str = ""
    task_id: str = ""
    task_type: str = "TRIAL"
    user: str = ""
    container_addrs: list[str] = field(default_factory=lambda: [LOCALHOST])
    container_rank: int = 0
    container_slot_counts: list[int] = field(default_factory=list)
    gpu_uuids: list[str] = field(default_factory=list)

    @property
    def session_token(self) -> str:
        """Determined's name for :attr:`token`."""
        return self.token

    @property
    def num_slots(self) -> int:
        """The number of slots of this allocation on this agent."""
        return len(self.slot_ids)

    @property
    def num_gpus(self) -> int:
        """The number of GPUs this process may use (0 on CPU slots)."""
        return len(self.gpu_uuids)

    @property
    def user_data(self) -> dict[str, Any]:
        """The experiment config's free-form ``data`` section (``{}`` when absent)."""
        return self.trial.user_data


def _int(name: str, default: int, env: dict[str, str]) -> int:
    """A rank variable of the launcher's (``RANK``, ``WORLD_SIZE``...), not one of cairn's."""
    raw = env.get(name, "")
    if not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} is not an integer: {raw!r}") from None


def _containers(env: dict[str, str], slot_ids: list[str]) -> tuple[list[str], int, list[int]]:
    """(addresses, rank, slot counts) of the run's containers (see the module docstring)."""
    size = max(_int("WORLD_SIZE", 1, env), 1)
    local = max(_int("LOCAL_WORLD_SIZE", size, env), 1)
    count = max(size // local, 1)
    rank = settings.CONTAINER_RANK.get(env)
    if rank is None:
        rank = _int("RANK", 0, env) // local
    counts = settings.CONTAINER_SLOT_COUNTS.get(env)
    if counts is None:
        counts = [len(slot_ids)] if count == 1 else [local] * count
    addrs = settings.CONTAINER_ADDRS.get(env)
    if addrs is None:
        addrs = [env.get("MASTER_ADDR") or LOCALHOST] if count == 1 else []
    return addrs, rank, counts


def _gpu_uuids(env: dict[str, str], slot_ids: list[str]) -> list[str]:
    """The GPU slots the agent made visible: it names each by UUID in CUDA_VISIBLE_DEVICES."""
    visible = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return [d for d in visible if d in slot_ids]


def get_cluster_info(environ: dict[str, str] | None = None) -> ClusterInfo | None:
    """Reads the ``CAIRN_*`` environment.

    Args:
        environ: the environment to read (``os.environ`` by default).

    Returns:
        The cluster info, or ``None`` when this process was not started by a cairn agent.

    Raises:
        ValueError: a variable is malformed (names the variable).
    """
    env = dict(os.environ if environ is None else environ)
    if not all(setting.is_set(env) for setting in _REQUIRED):
        return None
    if not (settings.TRIAL_ID.is_set(env) or settings.TASK_ID.is_set(env)):
        return None
    trial = TrialInfo(
        trial_id=settings.TRIAL_ID.get(env),
        experiment_id=settings.EXPERIMENT_ID.get(env),
        hparams=settings.HPARAMS.get(env),
        trial_seed=settings.TRIAL_SEED.get(env),
        steps_completed=settings.STEPS_COMPLETED.get(env),
        run_id=settings.RUN_ID.get(env),
        config=settings.EXPERIMENT_CONFIG.get(env),
    )
    slot_ids = settings.SLOT_IDS.get(env)
    addrs, rank, counts = _containers(env, slot_ids)
    return ClusterInfo(
        master_url=(settings.MASTER.get(env) or "").rstrip("/"),
        token=settings.TOKEN.get(env),
        agent_id=settings.AGENT_ID.get(env) or "",
        allocation_id=settings.ALLOCATION_ID.get(env) or "",
        slot_ids=slot_ids,
        latest_checkpoint=settings.LATEST_CHECKPOINT.get(env),
        checkpoint_dir=settings.CHECKPOINT_DIR.get(env),
        trial=trial,
        cluster_id=settings.CLUSTER_ID.get(env),
        task_id=settings.TASK_ID.get(env) or str(trial.trial_id),
        task_type=settings.TASK_TYPE.get(env),
        user=settings.USER.get(env) or "",
        container_addrs=addrs,
        container_rank=rank,
        container_slot_counts=counts,
        gpu_uuids=_gpu_uuids(env, slot_ids),
    )
