"""The process runtime: a run's spec, code download, work directory and environment.

A run gets ``<work_dir>/allocations/<allocation_id>/`` with the experiment's code unpacked in
it (tarballs are cached by ``code_ref`` under ``<work_dir>/code/``). Its entrypoint runs there
with the ``CAIRN_*`` environment of ``docs/protocol.md``: one process, or one per slot
(``RANK``/``LOCAL_RANK``/``WORLD_SIZE``; rank 0 is the chief) when the run has several slots on
this agent. Each process leads its own process group (:mod:`services.agent.processes`). Output
is captured line by line and shipped to ``POST /allocations/{id}/logs`` in batches (at most 500
lines or 1 s: :mod:`services.agent.log_shipping`).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import sys
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import structlog
from pydantic import ValidationError

from cairn.compat import python_path_with_shim
from events.domain.archive import extract_tar
from events.domain.config.storage import checkpoint_root as checkpoint_root
from events.domain.deciders.task import SERVING_KINDS
from services.agent.client import ApiClient
from services.agent.serving import SERVE_TOKEN_VARIABLES
from services.confine import Identity
from services.contracts.agent import SpecResponse, TensorboardSpecSource

log = structlog.get_logger("agent")

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_RANK_VARIABLES = frozenset(
    {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"}
)


def repo_root() -> Path:
    """The directory holding the ``cairn`` package (put on the trials' ``PYTHONPATH``)."""
    spec = importlib.util.find_spec("cairn")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).resolve().parent
    return Path(__file__).resolve().parents[2]


def safe_name(value: str) -> str:
    """``value`` usable as one path component."""
    return _SAFE.sub("_", value) or "_"


def entrypoint_argv(entrypoint: str | list[str] | None) -> list[str]:
    """The argv of an entrypoint: a string is shell-split, a list is taken as is.

    Raises:
        ValueError: no entrypoint.
    """
    if entrypoint is None:
        raise ValueError("the experiment has no entrypoint")
    argv = shlex.split(entrypoint) if isinstance(entrypoint, str) else [str(a) for a in entrypoint]
    if not argv:
        raise ValueError("the entrypoint is empty")
    return argv


LAUNCHERS = {
    "cairn.launch.torch_distributed": "cairn.launch.torch_distributed",
    "cairn.launch.horovod": "cairn.launch.horovod",
    "determined.launch.torch_distributed": "cairn.launch.torch_distributed",
    "determined.launch.horovod": "cairn.launch.horovod",
    "cairn.launch.deepspeed": "cairn.launch.deepspeed",
    "determined.launch.deepspeed": "cairn.launch.deepspeed",
}
"""Launcher modules (Determined's names map to cairn's): an entrypoint that runs one is started
once per agent, and the launcher starts the ranks of that agent itself."""


def launcher_argv(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` with a Determined launcher module renamed to cairn's, and whether it runs a
    launcher (``python3 -m cairn.launch.torch_distributed ...``)."""
    if len(argv) >= 3 and Path(argv[0]).name.startswith("python") and argv[1] == "-m":
        module = LAUNCHERS.get(argv[2])
        if module is not None:
            return [argv[0], "-m", module, *argv[3:]], True
    return argv, False


@dataclass
class RunSpec:
    """One run as the agent launches it (built from ``GET /allocations/{id}/spec``)."""

    allocation_id: str
    trial_id: int
    experiment_id: int
    run_id: int
    argv: list[str]
    code_ref: str | None
    hparams: dict[str, Any]
    trial_seed: int
    latest_checkpoint: str | None
    steps_completed: int
    token: str
    checkpoint_dir: Path
    environment: dict[str, str]
    slot_ids: list[str]
    rank_offset: int
    world_size: int
    config: dict[str, Any] = field(default_factory=dict)
    preemption_timeout: float | None = None
    user: str = ""
    cluster_id: str = ""
    launcher: bool = False
    """The entrypoint is a launcher: one process on this agent starts the local ranks."""
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = None
    """The chief's address and port once the rendezvous completed (several agents only)."""
    master_port: int | None = None
    node_address: str | None = None
    """This agent's address in the gang, as the other agents reach it (several agents only)."""
    identity: Identity | None = None
    """The unix identity the owner's code runs as (the spec's ``agent_user_group``)."""
    task_id: str | None = None
    """Set for a task's run (a command), which is no trial's."""
    task_kind: str | None = None
    """A task's kind (``command``, ``notebook``, ``tensorboard``, ``shell``)."""
    serve_token: str | None = None
    """The token a serving task's server requires (the spec's ``serve_token``)."""
    tensorboard_sources: list[TensorboardSpecSource] = field(default_factory=list)
    """What a TensorBoard task shows (the spec's)."""

    @classmethod
    def from_api(cls, raw: Mapping[str, Any], agent_id: str, default_storage: Path) -> RunSpec:
        """Parses a spec answer (:class:`services.contracts.agent.SpecResponse`) and builds the
        run from it (:meth:`from_spec`).

        Raises:
            MalformedSpecError: a field is missing, unknown or of the wrong type.
            ValueError: the spec cannot be launched (no entrypoint).
            ConfinementError: the spec's identity is root.
        """
        try:
            spec = SpecResponse.model_validate(raw)
        except ValidationError as exc:
            raise MalformedSpecError(raw.get("allocation_id"), exc) from None
        return cls.from_spec(spec, agent_id, default_storage)

    @classmethod
    def from_spec(cls, spec: SpecResponse, agent_id: str, default_storage: Path) -> RunSpec:
        """The run this agent launches of ``spec``: its own slots and ranks, the entrypoint's
        argv and the checkpoint directory.

        Raises:
            ValueError: the spec cannot be launched (no entrypoint).
            ConfinementError: the spec's identity is root.
        """
        slot_ids = list(spec.slot_ids)
        placements = spec.placements
        rank_offset, world = 0, max(len(slot_ids), 1)
        node_rank, num_nodes = 0, 1
        if agent_id in placements:
            slot_ids = list(placements[agent_id]) or slot_ids
            agents = sorted(placements)
            node_rank, num_nodes = agents.index(agent_id), len(agents)
            rank_offset = sum(len(placements[a]) for a in agents[:node_rank])
            world = max(sum(len(v) for v in placements.values()), 1)
        config = dict(spec.config)
        argv: list[str]
        if spec.task_kind in SERVING_KINDS:
            argv, launcher = [], False  # the agent builds a server's command line (its port)
        else:
            argv, launcher = launcher_argv(entrypoint_argv(spec.entrypoint))
        return cls(
            allocation_id=spec.allocation_id,
            trial_id=spec.trial_id,
            experiment_id=spec.experiment_id,
            run_id=spec.run_id,
            argv=argv,
            code_ref=spec.code_ref or None,
            hparams=dict(spec.hparams),
            trial_seed=spec.trial_seed,
            latest_checkpoint=spec.latest_checkpoint or None,
            steps_completed=spec.steps_completed,
            token=spec.token,
            checkpoint_dir=checkpoint_root(spec.checkpoint_storage, default_storage),
            environment=dict(spec.environment_variables),
            slot_ids=slot_ids,
            rank_offset=rank_offset,
            world_size=world,
            config=config,
            preemption_timeout=(
                float(config["preemption_timeout"])
                if config.get("preemption_timeout") is not None
                else None
            ),
            user=spec.user,
            cluster_id=spec.cluster_id,
            launcher=launcher,
            node_rank=node_rank,
            num_nodes=num_nodes,
            identity=identity_of(spec.agent_user_group),
            task_id=spec.task_id,
            task_kind=spec.task_kind,
            serve_token=spec.serve_token,
            tensorboard_sources=list(spec.tensorboard_sources),
        )


class MalformedSpecError(ValueError):
    """The gateway's spec of an allocation does not parse as
    :class:`services.contracts.agent.SpecResponse` (a field missing, unknown or mistyped): the
    agent and the gateway disagree on the protocol, so the run is not launched.

    Args:
        allocation_id: the allocation the spec claims to be of, if it names one.
        error: pydantic's account of each bad field.
    """

    def __init__(self, allocation_id: object, error: ValidationError) -> None:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<spec>'}: {e['msg']}" for e in error.errors()
        )
        super().__init__(
            f"malformed spec of allocation {allocation_id!r} from the gateway ({problems}); "
            "is the agent the gateway's release?"
        )
        self.problems = error.errors()


def identity_of(group: Any) -> Identity | None:
    """The identity an ``agent_user_group`` names (``None`` when it names none).

    Raises:
        ConfinementError: it names uid or gid 0.
    """
    if not isinstance(group, Mapping) or group.get("agent_uid") is None:
        return None
    return Identity(
        int(group["agent_uid"]), int(group["agent_gid"]), str(group.get("agent_user") or "")
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port() -> int:
    """A TCP port free on every interface of this machine (for a gang's rendezvous store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def reachable_address(api_url: str) -> str:
    """The address of this machine on the route to the API (what the gang's other agents
    reach it by, as they reach the API); ``127.0.0.1`` when the API is local."""
    host = urlsplit(api_url).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((socket.gethostbyname(host), 9))  # UDP: nothing is sent
            return str(sock.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface that holds ``address`` (``None``: none)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    return None


def trial_environment(
    run: RunSpec,
    *,
    agent_id: str,
    api_url: str,
    gpu_slots: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> list[dict[str, str]]:
    """The environment of each process of ``run`` (one per local rank).

    Args:
        run: the run.
        agent_id: this agent.
        api_url: the API URL the trial reports to (``CAIRN_MASTER``).
        gpu_slots: slot id -> CUDA device id for this agent's GPUs.
        base: the environment to start from (the agent's own, minus its ``CAIRN_*`` secrets).
    """
    env = {
        k: v
        for k, v in (os.environ if base is None else base).items()
        if not k.startswith("CAIRN_") and k not in _RANK_VARIABLES
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(run.environment)
    python_path = [str(repo_root())]
    if env.get("PYTHONPATH"):
        python_path.extend(env["PYTHONPATH"].split(os.pathsep))
    # Determined's names for training code (``import determined``), last on the path and only
    # where no real ``determined`` is importable (see cairn.compat).
    env["PYTHONPATH"] = os.pathsep.join(python_path_with_shim(python_path))
    if gpu_slots:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_slots[s] for s in run.slot_ids if s in gpu_slots)
    if run.task_id is not None:
        env.update(
            {
                "CAIRN_MASTER": api_url.rstrip("/"),
                "CAIRN_TASK_ID": run.task_id,
                "CAIRN_TASK_TYPE": (run.task_kind or "command").upper(),
                "CAIRN_ALLOCATION_ID": run.allocation_id,
                "CAIRN_AGENT_ID": agent_id,
                "CAIRN_SLOT_IDS": json.dumps(run.slot_ids),
                "CAIRN_USER": run.user,
                "CAIRN_CLUSTER_ID": run.cluster_id,
            }
        )
        if run.serve_token:  # the server's only credential: see services.agent.serving
            env[SERVE_TOKEN_VARIABLES.get(run.task_kind or "", "JUPYTER_TOKEN")] = run.serve_token
        return [env]
    env.update(
        {
            "CAIRN_MASTER": api_url.rstrip("/"),
            "CAIRN_TOKEN": run.token,
            "CAIRN_EXPERIMENT_ID": str(run.experiment_id),
            "CAIRN_TRIAL_ID": str(run.trial_id),
            "CAIRN_RUN_ID": str(run.run_id),
            "CAIRN_ALLOCATION_ID": run.allocation_id,
            "CAIRN_AGENT_ID": agent_id,
            "CAIRN_SLOT_IDS": json.dumps(run.slot_ids),
            "CAIRN_HPARAMS": json.dumps(run.hparams),
            "CAIRN_TRIAL_SEED": str(run.trial_seed),
            "CAIRN_LATEST_CHECKPOINT": run.latest_checkpoint or "",
            "CAIRN_STEPS_COMPLETED": str(run.steps_completed),
            "CAIRN_CHECKPOINT_DIR": str(run.checkpoint_dir),
            "CAIRN_EXPERIMENT_CONFIG": json.dumps(run.config),
            "CAIRN_USER": run.user,
            "CAIRN_CLUSTER_ID": run.cluster_id,
        }
    )
    local = max(len(run.slot_ids), 1)
    if local == 1 and run.world_size == 1 and not run.launcher:
        return [env]
    gang = {
        "WORLD_SIZE": str(run.world_size),
        "LOCAL_WORLD_SIZE": str(local),
        "GROUP_RANK": str(run.node_rank),
        "CAIRN_NODE_RANK": str(run.node_rank),
        "CAIRN_NUM_NODES": str(run.num_nodes),
        "CAIRN_RANK_OFFSET": str(run.rank_offset),
    }
    if run.master_addr is not None and run.master_port is not None:
        gang["MASTER_ADDR"], gang["MASTER_PORT"] = run.master_addr, str(run.master_port)
    else:
        gang["MASTER_ADDR"] = env.get("MASTER_ADDR", "127.0.0.1")
        gang["MASTER_PORT"] = env.get("MASTER_PORT") or str(_free_port())
    # Gloo binds the address this machine's host name resolves to, which is loopback on many
    # hosts (Debian's 127.0.1.1): its peers on other hosts would be told to connect there. The
    # interface of the address the other agents reach this one by is the right one.
    ifname = interface_of(run.node_address) if run.node_address else None
    if ifname is not None and not env.get("GLOO_SOCKET_IFNAME"):
        gang["GLOO_SOCKET_IFNAME"] = ifname
    env.update(gang)
    if run.launcher:
        return [env]  # the launcher starts this agent's ranks and sets RANK/LOCAL_RANK itself
    envs = []
    for local_rank in range(local):
        one = dict(env)
        one.update({"RANK": str(run.rank_offset + local_rank), "LOCAL_RANK": str(local_rank)})
        envs.append(one)
    return envs


class CodeCache:
    """Experiment code tarballs, downloaded once per ``code_ref`` and unpacked per run.

    Args:
        client: the API client.
        root: the cache directory.
    """

    def __init__(self, client: ApiClient, root: Path) -> None:
        self._client = client
        self._root = root
        self._locks: dict[str, asyncio.Lock] = {}

    async def unpack(self, code_ref: str, dest: Path) -> None:
        """Unpacks ``code_ref`` into ``dest`` (downloading it first if it is not cached).

        Raises:
            ApiError: the code could not be downloaded.
            tarfile.TarError: the tarball is corrupt.
        """
        self._root.mkdir(parents=True, exist_ok=True)
        tarball = self._root / f"{safe_name(code_ref)}.tar.gz"
        lock = self._locks.setdefault(code_ref, asyncio.Lock())
        async with lock:
            if not tarball.exists():
                log.info("downloading code", code_ref=code_ref)
                await self._client.download_code(code_ref, tarball)
        try:
            await asyncio.to_thread(extract_tar, tarball, dest)
        except (tarfile.TarError, EOFError, OSError):
            tarball.unlink(missing_ok=True)  # a corrupt cache entry is fetched again next time
            raise


def start_directory(work: Path, work_dir: str | None) -> Path:
    """Where a run whose context is unpacked in ``work`` starts: ``work``, or its directory
    ``work_dir`` (a task's ``config.work_dir``, relative to the context).

    Judged as the host resolves it (symbolic links followed), so a link in the context cannot
    take the start outside it.

    Raises:
        ValueError: ``work_dir`` is no directory inside the context (the message names the
            field and the value, for the task's exit message).
    """
    if work_dir is None:
        return work
    try:
        root = work.resolve()
        path = (work / work_dir).resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise ValueError(f"work_dir: {work_dir!r} cannot be resolved: {exc}") from None
    if path != root and root not in path.parents:
        raise ValueError(f"work_dir: {work_dir!r} leads outside the task's context directory")
    if not path.is_dir():
        raise ValueError(
            f"work_dir: {work_dir!r} is not a directory of the task's context "
            "(the directory given with --context; a directory holding no file is not uploaded)"
        )
    return work / path.relative_to(root)  # the path a container sees the context at, too


def prepare_work_dir(root: Path, allocation_id: str) -> Path:
    """A fresh, empty ``<root>/allocations/<allocation_id>/``."""
    path = root / "allocations" / safe_name(allocation_id)
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
