"""The agent's settings: one :class:`AgentConfig` per agent process."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path

from events.domain.config.cluster import TaskImages, TaskPolicy
from events.domain.config.host_requests import HostPolicy


@dataclass
class AgentConfig:
    """The agent's settings (see ``python -m services.agent --help``)."""

    agent_id: str
    api_url: str
    nats_url: str
    """The NATS server, or a cluster's servers separated by commas."""
    nats_replicas: int | None = None
    """Copies of each JetStream stream, when the agent makes them (a bus without credentials);
    ``None``: as many as ``nats_url`` names servers, at most 3."""
    token: str = ""
    """A join token given by value (``CAIRN_AGENT_TOKEN``, for clusters configured that way);
    ``join_token_file`` is preferred."""
    join_token_file: Path | None = None
    """The cluster's join token, presented once on the agent's first start (see
    :mod:`services.agent.credential`)."""
    resource_pool: str = "default"
    work_dir: Path = field(default_factory=lambda: Path.cwd() / ".cairn-agent")
    checkpoint_root: Path | None = None
    artificial_slots: int | None = None
    heartbeat: float = 2.0
    preempt_timeout: float = 30.0
    kill_grace: float = 5.0
    leaving_timeout: float = 2.0
    """Seconds a shutting-down agent tries to record that it is leaving before it stops its runs
    anyway (the API may be stopping too)."""
    hostname: str = field(default_factory=socket.gethostname)
    rendezvous_timeout: float = 300.0
    """Seconds a run placed on several agents waits for all of them to join; then it fails."""
    address: str | None = None
    """Where the other agents of a gang reach this one (default: see ``reachable_address``)."""
    docker_share_from: str | None = None
    """The container the agent runs in, if any: trial containers join its network and get its
    work and checkpoint mounts."""
    hide: tuple[Path, ...] = ()
    """Paths no run's code may see besides the work directory (the cluster's data directory)."""
    host_policy: HostPolicy = field(default_factory=TaskPolicy)
    """What the cluster allows trials of this host (bind mounts, devices, capabilities): the
    cluster config's ``tasks``."""
    default_image: TaskImages | None = None
    """The image a run whose config names none runs in (``tasks.default_image``); ``None``:
    such a run is a process on this machine."""
    reserved_for: str | None = None
    """The one allocation this ephemeral agent (a Slurm job's) was started for: it registers
    for it alone and stops once that allocation has ended here and its exit was reported
    (:mod:`services.agent.reservation`)."""
    reserved_wait: float = 600.0
    """Seconds after registration a reserved agent waits for its allocation to be started
    here before it stops (so an unused Slurm job does not hold its nodes)."""
    preempt_on_term: bool = False
    """A first SIGTERM (and every SIGUSR2) asks the API to preempt this agent's trial runs
    rather than stopping them (a resource manager's warning: Slurm's ``scancel``, time limit or
    ``--signal``); a second SIGTERM shuts down as usual."""
