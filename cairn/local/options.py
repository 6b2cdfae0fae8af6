"""What ``cairn up`` asks of the embedded cluster, with the defaults the CLI and the supervisor
share (each default is written here once)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_API_PORT = 8080
STOP_TIMEOUT = 10.0


@dataclass
class ClusterOptions:
    """What ``cairn up`` was asked for.

    Attributes:
        data_dir: the cluster's data directory (made absolute).
        slots: artificial CPU slots for the agent; ``None`` lets the agent discover GPUs.
        api_port: preferred API port; a free one if it is taken, any free one when 0.
        timeout: seconds for the whole start-up (servers, database, every service ready).
        stop_timeout: seconds a service gets to exit after SIGTERM before it is SIGKILLed.
        replicas: replicas of each decider (:data:`cairn.local.topology.DECIDERS`); all but the
            lease holder stand by.
        agents: how many agents to start (``agent``, ``agent-2``, ...), each with ``slots``.
    """

    data_dir: Path
    slots: int | None = None
    api_port: int = DEFAULT_API_PORT
    timeout: float = 60.0
    stop_timeout: float = STOP_TIMEOUT
    replicas: int = 1
    agents: int = 1
