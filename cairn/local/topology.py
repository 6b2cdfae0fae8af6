"""Which processes an embedded cluster runs, and what each process name means.

A process name is a service's name (``relay``, ``api``, ...), or for a further replica of a decider
or a further agent that name with ``-N`` (``searcher-2``, ``agent-3``). :func:`service_of` is the
one place that reads a process name back as its service.
"""

from __future__ import annotations

SERVICES: tuple[str, ...] = ("relay", "api", "searcher", "scheduler", "tracker", "agent")
"""Services started by ``cairn up``, in start order (each is ``python -m services.<name>``)."""
DECIDERS: tuple[str, ...] = ("relay", "searcher", "scheduler")
"""Services that lead by lease; ``--replicas N`` runs N of each (``searcher``, ``searcher-2``, ...)."""


def replica_names(name: str, replicas: int) -> list[str]:
    """The process names of service ``name``'s replicas: ``name``, then ``name-2``, ``name-3``..."""
    count = replicas if name in DECIDERS else 1
    return [name] + [f"{name}-{n}" for n in range(2, count + 1)]


def service_of(process: str) -> str:
    """The service a process name runs (``searcher-2`` runs ``searcher``, ``agent-2`` the agent)."""
    base, _, number = process.rpartition("-")
    return base if base in (*DECIDERS, "agent") and number.isdigit() else process


def service_names(agents: int) -> list[str]:
    """The services ``cairn up`` starts: :data:`SERVICES`, the agent as ``agent``, ``agent-2``..."""
    extra = [f"agent-{n}" for n in range(2, max(agents, 1) + 1)]
    return [*SERVICES, *extra]
