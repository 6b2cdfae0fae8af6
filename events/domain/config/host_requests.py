"""What an experiment config asks of an agent's host, checked against what the cluster allows.

A config's ``bind_mounts[].host_path``, ``resources.devices[].host_path`` and
``environment.add_capabilities`` reach past the trial's container into the host. Each must be
allowed by the cluster config's task policy (``allowed_bind_mount_roots``, ``allowed_devices``,
``allowed_capabilities``; none allowed by default). The gateway checks at submission, judging
paths as written (``..`` removed); the agent checks again before it starts a container, judging
paths as its host resolves them (symbolic links followed), so a link planted on the host leads
nowhere new. The sockets of container engines are refused whatever the roots allow: whoever holds
one is root on the host.

The checks are pure functions of the config and the policy (the agent's resolve step aside).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

ENGINE_SOCKETS = (
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/var/run/podman/podman.sock",
    "/run/crio/crio.sock",
    "/var/run/crio/crio.sock",
)
"""Container engine sockets no trial may be given, even under an allowed root."""


class HostPolicy(Protocol):
    """What trials may ask of a host: the cluster config's ``tasks`` section
    (:class:`events.domain.config.cluster.TaskPolicy`, whose defaults allow nothing)."""

    @property
    def allowed_bind_mount_roots(self) -> Sequence[str]:
        """Host directories under which bind mounts may lie."""
        ...

    @property
    def allowed_devices(self) -> Sequence[str]:
        """Host device paths trials may be given."""
        ...

    @property
    def allowed_capabilities(self) -> Sequence[str]:
        """Capabilities trials may add (``SYS_PTRACE``)."""
        ...


def capability_name(value: str) -> str:
    """A capability as the policy and Docker name it: upper case, without ``CAP_``."""
    name = value.strip().upper()
    return name.removeprefix("CAP_")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _shown(values: Sequence[str]) -> str:
    return "[" + ", ".join(values) + "]"


def host_request_errors(
    config: Mapping[str, Any],
    policy: HostPolicy,
    *,
    resolve: Callable[[str], str] = os.path.normpath,
) -> list[tuple[str, str]]:
    """Every part of ``config`` that asks for more of the host than ``policy`` allows.

    Args:
        config: the experiment config (validated, as JSON).
        policy: what the cluster allows.
        resolve: how a host path is judged: ``os.path.normpath`` (as written; the gateway) or
            ``os.path.realpath`` (as the host resolves it; the agent).

    Returns:
        ``(path, message)`` pairs, e.g. ``("bind_mounts[0].host_path", "/ is outside the
        allowed roots [/datasets]")``; empty when everything is allowed.
    """
    errors: list[tuple[str, str]] = []
    roots = [resolve(str(r)) for r in policy.allowed_bind_mount_roots]
    sockets = sorted({resolve(s) for s in ENGINE_SOCKETS} | set(ENGINE_SOCKETS))
    for index, mount in enumerate(config.get("bind_mounts") or []):
        if not isinstance(mount, Mapping) or not mount.get("host_path"):
            continue
        where = f"bind_mounts[{index}].host_path"
        raw = str(mount["host_path"])
        path = resolve(raw)
        shown = raw if path == raw else f"{raw} ({path})"
        engine = [s for s in sockets if _under(s, path)]
        if not any(_under(path, root) for root in roots):
            allowed = _shown(roots) if roots else "[] (the cluster allows no bind mount)"
            note = f"; it holds a container engine's socket ({engine[0]})" if engine else ""
            errors.append((where, f"{shown} is outside the allowed roots {allowed}{note}"))
        elif engine:
            errors.append(
                (where, f"{shown} holds a container engine's socket ({engine[0]}), never allowed")
            )
    resources = config.get("resources") or {}
    devices = resources.get("devices") if isinstance(resources, Mapping) else None
    allowed_devices = {resolve(str(d)) for d in policy.allowed_devices}
    for index, device in enumerate(devices or []):
        if not isinstance(device, Mapping) or not device.get("host_path"):
            continue
        raw = str(device["host_path"])
        if resolve(raw) not in allowed_devices:
            allowed = _shown(sorted(allowed_devices)) if allowed_devices else "[] (none allowed)"
            errors.append(
                (
                    f"resources.devices[{index}].host_path",
                    f"{raw} is not an allowed device {allowed}",
                )
            )
    environment = config.get("environment") or {}
    added = environment.get("add_capabilities") if isinstance(environment, Mapping) else None
    allowed_caps = {capability_name(c) for c in policy.allowed_capabilities}
    for index, capability in enumerate(added or []):
        if capability_name(str(capability)) not in allowed_caps:
            allowed = _shown(sorted(allowed_caps)) if allowed_caps else "[] (none allowed)"
            errors.append(
                (
                    f"environment.add_capabilities[{index}]",
                    f"{capability} is not an allowed capability {allowed}",
                )
            )
    return errors
