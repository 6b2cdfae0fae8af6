"""The Docker runtime: a run whose config sets ``environment.image`` runs in containers.

One container per local rank, as the process runtime starts one process per rank. Each container
gets the same ``CAIRN_*`` environment as a process would, runs the entrypoint in the run's work
directory, and writes checkpoints to the same checkpoint directory; both are mounted at the paths
they have on the agent, so every path in the environment means the same thing inside and out.
The storage directories a run only reads (a TensorBoard's experiments') are mounted read-only at
their paths too.

Where the agent itself runs in a container (the lab cluster), ``share_from`` names that container:
trial containers then join its network namespace (so the API's host name is the one the agent
sees) and get the agent container's mounts that hold the work and checkpoint directories, and no
other (never the agent's Docker socket). Otherwise they use the host's network and bind mounts of
the agent's directories.

Every container carries the labels :data:`LABEL_AGENT` (the agent id) and
:data:`LABEL_ALLOCATION`; a starting agent removes the containers labelled with its own id, and
only those (:func:`remove_own_containers`). The Docker SDK is synchronous: its calls run in
worker threads, and output lines cross into the event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from events.domain.config.cluster import TaskImages
from events.domain.config.host_requests import HostPolicy, capability_name, host_request_errors
from services.agent.log_shipping import LogShipper
from services.agent.processes import RunRanks
from services.agent.runtime import RunSpec, safe_name
from services.confine import Identity

log = structlog.get_logger("agent")

LABEL_AGENT = "ai.cairn.agent"
LABEL_ALLOCATION = "ai.cairn.allocation"
LABEL_TRIAL = "ai.cairn.trial"
LABEL_AGENT_CONTAINER = "ai.cairn.agent-container"
"""On trial containers of an agent that runs in a container: that container (as ``share_from``
names it), so that whoever removes the agent's container can remove its trials too."""
_HOST_ONLY = ("PATH", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "HOME", "TMPDIR")
"""Variables of the agent's environment that name host paths or host devices: a container takes
them only when the experiment sets them itself (``HOME`` is the work directory there, ``TMPDIR``
the container's own ``/tmp``)."""
NO_NEW_PRIVILEGES = "no-new-privileges"


class DockerRuntimeError(Exception):
    """A run could not be started in a container (no engine, no image, refused by the engine)."""


def run_image(
    config: Mapping[str, Any], device: str, default: TaskImages | None = None
) -> str | None:
    """The image a run on ``device`` (``cpu`` or ``cuda``) runs in: the one
    ``environment.image`` names, else the cluster's ``default`` (``tasks.default_image``), else
    None (a process).

    A mapping of images per device falls back to the ``cpu`` image for a device it does not
    name; ``gpu`` is Determined's older name of ``cuda``.
    """
    env = config.get("environment") or {}
    image = env.get("image") if isinstance(env, Mapping) else None
    if isinstance(image, str) and image:
        return image
    if isinstance(image, Mapping):
        chosen = image.get(device) or (image.get("gpu") if device == "cuda" else None)
        if chosen or image.get("cpu"):
            return str(chosen or image.get("cpu"))
    return default.for_device(device) if default is not None else None


@dataclass
class ContainerPlan:
    """Everything one container of a run is created with (no engine needed to compute it)."""

    image: str
    command: list[str]
    working_dir: str
    environment: dict[str, str]
    labels: dict[str, str]
    name: str
    user: str | None = None
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    network_mode: str = "host"
    devices: list[str] = field(default_factory=list)
    gpu_ids: list[str] = field(default_factory=list)
    shm_size: str | None = None
    cap_add: list[str] = field(default_factory=list)
    cap_drop: list[str] = field(default_factory=lambda: ["ALL"])
    security_opt: list[str] = field(default_factory=lambda: [NO_NEW_PRIVILEGES])

    def create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``docker.DockerClient().containers.create``."""
        kwargs: dict[str, Any] = {
            "image": self.image,
            "command": self.command,
            "working_dir": self.working_dir,
            "environment": self.environment,
            "labels": self.labels,
            "name": self.name,
            "network_mode": self.network_mode,
            "detach": True,
            "stdin_open": False,
            "tty": False,
        }
        if self.user:
            kwargs["user"] = self.user
        if self.volumes:
            kwargs["volumes"] = self.volumes
        if self.devices:
            kwargs["devices"] = self.devices
        if self.shm_size:
            kwargs["shm_size"] = self.shm_size
        if self.cap_add:
            kwargs["cap_add"] = self.cap_add
        if self.cap_drop:
            kwargs["cap_drop"] = self.cap_drop
        if self.security_opt:
            kwargs["security_opt"] = self.security_opt
        if self.gpu_ids:
            from docker.types import DeviceRequest

            kwargs["device_requests"] = [
                DeviceRequest(driver="nvidia", device_ids=self.gpu_ids, capabilities=[["gpu"]])
            ]
        return kwargs


def container_environment(
    env: Mapping[str, str], run: RunSpec, work: Path | None = None
) -> dict[str, str]:
    """A process environment (from ``trial_environment``) as a container takes it.

    The agent's host paths (``PATH``, ``PYTHONPATH``, ...) are left to the image unless the
    experiment's ``environment_variables`` set them; every ``CAIRN_*`` variable, the ranks and
    the experiment's variables pass as they are. ``HOME`` is the work directory (the container's
    user has no home in the image) unless the experiment sets it.
    """
    out = {k: v for k, v in env.items() if k not in _HOST_ONLY or k in run.environment}
    if work is not None and "HOME" not in run.environment:
        out["HOME"] = str(work)
    return out


def _bind_mounts(config: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    mounts: dict[str, dict[str, str]] = {}
    for item in config.get("bind_mounts") or []:
        if not isinstance(item, Mapping) or not item.get("host_path"):
            continue
        mode = "ro" if item.get("read_only") else "rw"
        propagation = item.get("propagation")
        if propagation and propagation != "rprivate":
            mode = f"{mode},{propagation}"
        mounts[str(item["host_path"])] = {"bind": str(item["container_path"]), "mode": mode}
    return mounts


def _devices(config: Mapping[str, Any]) -> list[str]:
    resources = config.get("resources") or {}
    out = []
    for item in (resources.get("devices") or []) if isinstance(resources, Mapping) else []:
        if isinstance(item, Mapping) and item.get("host_path"):
            container = item.get("container_path") or item["host_path"]
            out.append(f"{item['host_path']}:{container}:{item.get('mode') or 'mrw'}")
    return out


def plan_containers(
    run: RunSpec,
    image: str,
    envs: list[dict[str, str]],
    *,
    agent_id: str,
    work: Path,
    gpu_slots: Mapping[str, str],
    start: Path | None = None,
    share_from: str | None = None,
    shared_mounts: Mapping[str, dict[str, str]] | None = None,
    user: str | None = None,
    reads: Sequence[Path] = (),
) -> list[ContainerPlan]:
    """The containers of ``run``: one per entry of ``envs`` (one per local rank).

    Args:
        run: the run.
        image: the image (see :func:`run_image`).
        envs: each rank's environment, from ``trial_environment``.
        agent_id: this agent (labelled on every container).
        work: the run's work directory (mounted at the same path).
        gpu_slots: slot id -> CUDA device id of this agent's GPUs.
        start: the entrypoint's working directory, in ``work`` (a task's ``work_dir``;
            ``None``: ``work`` itself).
        share_from: the agent's own container, when it runs in one.
        shared_mounts: with ``share_from``, its mounts that hold the work and checkpoint
            directories and ``reads`` (see :func:`mounts_holding`).
        user: ``uid:gid`` the entrypoint runs as (None: the image's user).
        reads: storage directories the run only reads (a TensorBoard's experiments'), bound
            read-only at their paths where the agent is not in a container.

    Every container drops every capability but those the config adds (allowed by the cluster:
    see :func:`check_host_requests`) and runs with ``no-new-privileges``.
    """
    config = run.config
    resources = config.get("resources") or {}
    shm = resources.get("shm_size") if isinstance(resources, Mapping) else None
    gpu_ids = [gpu_slots[s] for s in run.slot_ids if s in gpu_slots]
    environment = config.get("environment") or {}
    added = environment.get("add_capabilities") if isinstance(environment, Mapping) else None
    cap_add = sorted({capability_name(str(c)) for c in added or []})
    volumes = _bind_mounts(config)
    if share_from is not None:
        for source, bind in (shared_mounts or {}).items():
            volumes.setdefault(source, dict(bind))
    else:
        volumes.setdefault(str(work), {"bind": str(work), "mode": "rw"})
        volumes.setdefault(str(run.checkpoint_dir), {"bind": str(run.checkpoint_dir), "mode": "rw"})
        for path in reads:
            volumes.setdefault(str(path), {"bind": str(path), "mode": "ro"})
    plans = []
    for index, env in enumerate(envs):
        rank = env.get("RANK", str(index))
        plans.append(
            ContainerPlan(
                image=image,
                command=list(run.argv),
                working_dir=str(start or work),
                environment=container_environment(env, run, work),
                labels={
                    LABEL_AGENT: agent_id,
                    LABEL_ALLOCATION: run.allocation_id,
                    LABEL_TRIAL: str(run.trial_id),
                    **({LABEL_AGENT_CONTAINER: share_from} if share_from else {}),
                },
                name=f"cairn-{safe_name(agent_id)}-{safe_name(run.allocation_id)}-{rank}",
                user=user,
                volumes=volumes,
                network_mode=f"container:{share_from}" if share_from else "host",
                devices=_devices(config),
                gpu_ids=gpu_ids,
                shm_size=str(shm) if shm else None,
                cap_add=cap_add,
            )
        )
    return plans


def mounts_holding(
    container_attrs: Mapping[str, Any], paths: list[Path], *, reads: Sequence[Path] = ()
) -> dict[str, Any]:
    """The mounts of a container (its ``inspect`` answer) under which one of ``paths`` or
    ``reads`` lies.

    Returns:
        ``volumes`` entries (volume name or host path -> bind and mode) for those mounts: a
        mount holding one of ``paths`` keeps its mode, one holding only ``reads`` is read-only.
    """

    def holds(dest: Path, among: Sequence[Path]) -> bool:
        return any(p == dest or dest in p.parents for p in among)

    out: dict[str, dict[str, str]] = {}
    for mount in container_attrs.get("Mounts") or []:
        dest = Path(str(mount.get("Destination") or "/nonexistent"))
        writes = holds(dest, paths)
        if not writes and not holds(dest, reads):
            continue
        source = mount.get("Name") if mount.get("Type") == "volume" else mount.get("Source")
        if source:
            mode = "rw" if writes and mount.get("RW") else "ro"
            out[str(source)] = {"bind": str(dest), "mode": mode}
    return out


def docker_client() -> Any:
    """A client of the Docker engine named by the environment (``DOCKER_HOST`` or the socket).

    Raises:
        DockerRuntimeError: the SDK is missing or the engine does not answer.
    """
    try:
        import docker
        import docker.errors
    except ImportError as exc:  # pragma: no cover - the SDK is a dependency
        raise DockerRuntimeError("the docker SDK for Python is not installed") from exc
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except docker.errors.DockerException as exc:
        raise DockerRuntimeError(f"the Docker engine does not answer: {exc}") from exc
    return client


def remove_own_containers(client: Any, agent_id: str) -> list[str]:
    """Force-removes every container labelled with ``agent_id`` (running or not).

    Containers of other agents, and containers cairn did not start, are never touched.

    Returns:
        The allocation ids of the containers removed.
    """
    import docker.errors

    removed = []
    found = client.containers.list(all=True, filters={"label": f"{LABEL_AGENT}={agent_id}"})
    for container in found:
        if container.labels.get(LABEL_AGENT) != agent_id:
            continue  # the filter already says so; this guards the one thing that must hold
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
        removed.append(container.labels.get(LABEL_ALLOCATION, container.name))
    return removed


def _lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines of a byte stream cut anywhere (the last unterminated line included)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace").rstrip("\r")
    if pending:
        yield pending.decode(errors="replace")


class TrialContainers(RunRanks):
    """The containers of one run on this agent, with their output shipped like a process's.

    Offers what :class:`services.agent.processes.TrialProcesses` offers the agent (``done``,
    ``send_signal``, ``wait_for_exit``, ``wait``, ``exit_code``), so preemption and kill
    (:mod:`services.agent.signals`) reach the containers' main processes the same way.

    Args:
        client: the Docker client.
        allocation_id: the run.
        shipper: where output lines go.
        kill_grace: seconds between SIGTERM and SIGKILL when one rank fails.
    """

    def __init__(self, client: Any, allocation_id: str, shipper: LogShipper, kill_grace: float):
        super().__init__(allocation_id, shipper, kill_grace)
        self.client = client
        self.containers: list[Any] = []
        self._readers: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pids(self) -> list[int]:
        """No host process ids: containers are found again by their labels."""
        return []

    @property
    def ids(self) -> list[str]:
        """The containers' ids."""
        return [c.id for c in self.containers]

    async def launch(self, plans: list[ContainerPlan]) -> None:
        """Creates and starts one container per plan.

        Raises:
            DockerRuntimeError: the image is missing or the engine refused a container (the
                containers already started are removed).
        """
        self._loop = asyncio.get_running_loop()
        try:
            for rank, plan in enumerate(plans):
                container = await asyncio.to_thread(self._create, plan)
                self.containers.append(container)
                await asyncio.to_thread(container.start)
                label = rank if len(plans) > 1 else 0
                for stream in ("stdout", "stderr"):
                    reader = threading.Thread(
                        target=self._read,
                        args=(container, label, stream),
                        name=f"logs-{self.allocation_id}-{rank}-{stream}",
                        daemon=True,
                    )
                    reader.start()
                    self._readers.append(reader)
        except Exception as exc:
            await asyncio.to_thread(self._remove_all)
            if isinstance(exc, DockerRuntimeError):
                raise
            raise DockerRuntimeError(f"the Docker engine refused the container: {exc}") from exc

    def _create(self, plan: ContainerPlan) -> Any:
        import docker.errors

        try:
            self.client.images.get(plan.image)
        except docker.errors.ImageNotFound:
            log.info("image not on this host; pulling", image=plan.image)
            try:
                self.client.images.pull(plan.image)
            except docker.errors.DockerException as exc:
                raise DockerRuntimeError(
                    f"environment.image: {plan.image!r} is not on this host and cannot be "
                    f"pulled ({exc})"
                ) from exc
        with contextlib.suppress(docker.errors.NotFound):  # a leftover of an earlier try
            self.client.containers.get(plan.name).remove(force=True)
        return self.client.containers.create(**plan.create_kwargs())

    def _read(self, container: Any, rank: int, stream: str) -> None:
        loop = self._loop
        assert loop is not None
        try:
            chunks = container.logs(
                stdout=stream == "stdout", stderr=stream == "stderr", stream=True, follow=True
            )
            for line in _lines(chunks):
                loop.call_soon_threadsafe(self.shipper.add, rank, stream, line)
        except Exception as exc:  # the container vanished under the reader
            log.warning("container log stream ended", allocation_id=self.allocation_id, error=exc)

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to the main process of every container still running."""
        for container in self.containers:
            with contextlib.suppress(Exception):  # already gone or exited: nothing to signal
                container.kill(signal=signal.Signals(sig).name)

    def _wait_one(self, container: Any) -> int:
        try:
            return int(container.wait()["StatusCode"])
        except Exception as exc:
            log.error("lost the container", allocation_id=self.allocation_id, error=str(exc))
            return 137

    async def wait(self) -> int:
        """Waits for every container; stops the others when one rank fails; removes them.

        Returns:
            The run's exit status: the first non-zero status (137 for SIGKILL), else 0.
        """
        waits = {asyncio.create_task(asyncio.to_thread(self._wait_one, c)) for c in self.containers}
        first_failure: int | None = None
        pending = waits
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                status = task.result()
                if status != 0 and first_failure is None:
                    first_failure = status
                    if pending:
                        self._stop_the_others()
        self.exit_code = first_failure or 0
        self._exited.set()
        for reader in self._readers:
            await asyncio.to_thread(reader.join, 5.0)
        await asyncio.sleep(0)  # lets the lines the readers scheduled reach the shipper
        await asyncio.to_thread(self._remove_all)
        return self.exit_code

    def _remove_all(self) -> None:
        for container in self.containers:
            with contextlib.suppress(Exception):
                container.remove(force=True)


def container_user(identity: Identity | None) -> str:
    """``uid:gid`` a run's containers run as: its identity, or (an agent that is not root and
    so cannot give files to another uid) the agent's own.

    Raises:
        DockerRuntimeError: that would be uid 0.
    """
    uid, gid = (identity.uid, identity.gid) if identity else (os.getuid(), os.getgid())
    if uid == 0 or gid == 0:
        raise DockerRuntimeError("a trial container never runs as root (uid or gid 0)")
    return f"{uid}:{gid}"


def check_host_requests(config: Mapping[str, Any], policy: HostPolicy) -> None:
    """Refuses a config asking for host paths, devices or capabilities the cluster does not
    allow, judging paths as this host resolves them (links followed).

    Raises:
        DockerRuntimeError: naming each field and value.
    """
    errors = host_request_errors(config, policy, resolve=os.path.realpath)
    if errors:
        raise DockerRuntimeError(
            "the cluster does not allow " + "; ".join(f"{p}: {m}" for p, m in errors)
        )


async def launch(
    client: Any,
    run: RunSpec,
    image: str,
    envs: list[dict[str, str]],
    shipper: LogShipper,
    *,
    agent_id: str,
    work: Path,
    gpu_slots: Mapping[str, str],
    kill_grace: float,
    share_from: str | None,
    identity: Identity | None,
    policy: HostPolicy,
    start: Path | None = None,
    reads: Sequence[Path] = (),
) -> tuple[TrialContainers, Any]:
    """Starts ``run`` in containers of ``image``, connecting to the engine first if need be.

    Args:
        start: where the entrypoint starts, in ``work`` (``None``: ``work``).
        reads: storage directories the run only reads, mounted read-only (where the agent
            runs in a container, the mounts of it that hold them).
        identity: who the containers run as (see :func:`container_user`).
        policy: what the cluster allows trials of the host (checked again here).

    Returns:
        The run's containers and the client (kept by the agent for its next runs).

    Raises:
        DockerRuntimeError: the config asks for what the cluster does not allow, no engine, no
            image, or the engine refused a container.
    """
    check_host_requests(run.config, policy)
    user = container_user(identity)
    if client is None:
        client = await asyncio.to_thread(docker_client)
    shared = None
    if share_from:
        try:
            attrs = (await asyncio.to_thread(client.containers.get, share_from)).attrs
        except Exception as exc:
            raise DockerRuntimeError(f"the agent's container {share_from!r}: {exc}") from exc
        shared = mounts_holding(attrs, [work, run.checkpoint_dir], reads=reads)
    plans = plan_containers(
        run,
        image,
        envs,
        agent_id=agent_id,
        work=work,
        gpu_slots=gpu_slots,
        start=start,
        share_from=share_from,
        shared_mounts=shared,
        user=user,
        reads=reads,
    )
    containers = TrialContainers(client, run.allocation_id, shipper, kill_grace)
    await containers.launch(plans)
    log.info("run started in containers", allocation_id=run.allocation_id, image=image)
    return containers, client


async def remove_leftover_containers(agent_id: str) -> Any:
    """Removes the containers an earlier process of this agent left (see the module doc).

    Returns:
        A Docker client, or None when no engine answers here (then no container of this agent
        can be running on it either).
    """
    try:
        client = await asyncio.to_thread(docker_client)
    except DockerRuntimeError as exc:
        log.debug("no Docker engine; container runs are unavailable", error=str(exc))
        return None
    removed = await asyncio.to_thread(remove_own_containers, client, agent_id)
    if removed:
        log.warning("removed containers left by an earlier agent process", allocations=removed)
    return client
