"""What a config may ask of an agent's host, against the cluster's task policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from events.domain.config.cluster import TaskPolicy
from events.domain.config.host_requests import capability_name, host_request_errors
from services.agent.docker_runtime import DockerRuntimeError, check_host_requests


class Policy:
    """A task policy allowing ``/datasets``, ``/var``, ``/dev/fuse`` and ``SYS_PTRACE``."""

    allowed_bind_mount_roots = ("/datasets", "/var")
    allowed_devices = ("/dev/fuse",)
    allowed_capabilities = ("CAP_SYS_PTRACE",)


def mounts(*paths: str) -> dict[str, object]:
    """A config binding each path."""
    return {"bind_mounts": [{"host_path": p, "container_path": "/m"} for p in paths]}


def test_nothing_is_allowed_by_default() -> None:
    """Without a policy every bind mount, device and added capability is refused, each naming
    its field and the (empty) allowance."""
    config = {
        **mounts("/datasets/a"),
        "resources": {"devices": [{"host_path": "/dev/fuse", "container_path": "/dev/fuse"}]},
        "environment": {"add_capabilities": ["NET_ADMIN"], "drop_capabilities": ["ALL"]},
    }
    errors = host_request_errors(config, TaskPolicy())
    assert [p for p, _ in errors] == [
        "bind_mounts[0].host_path",
        "resources.devices[0].host_path",
        "environment.add_capabilities[0]",
    ]
    assert "allowed roots [] (the cluster allows no bind mount)" in errors[0][1]


def test_paths_under_allowed_roots_pass_and_dot_dot_does_not_escape() -> None:
    """A root and what lies under it are allowed; a sibling with the root as a name prefix and a
    path that leaves the root through ``..`` are not."""
    assert host_request_errors(mounts("/datasets", "/datasets/x/y"), Policy()) == []
    errors = host_request_errors(mounts("/datasets2", "/datasets/../etc"), Policy())
    assert [m for _, m in errors] == [
        "/datasets2 is outside the allowed roots [/datasets, /var]",
        "/datasets/../etc (/etc) is outside the allowed roots [/datasets, /var]",
    ]


def test_an_engine_socket_is_refused_even_under_an_allowed_root() -> None:
    """``/var`` is allowed, but ``/var/run`` and the socket itself hold Docker's socket."""
    errors = host_request_errors(mounts("/var/run/docker.sock", "/var/run", "/var/lib"), Policy())
    assert [p for p, _ in errors] == ["bind_mounts[0].host_path", "bind_mounts[1].host_path"]
    assert all("container engine's socket" in m for _, m in errors)


def test_devices_and_capabilities_must_be_listed() -> None:
    """Devices match exactly; capabilities match with or without ``CAP_``, in any case."""
    config = {
        "resources": {"devices": [{"host_path": "/dev/fuse"}, {"host_path": "/dev/kvm"}]},
        "environment": {"add_capabilities": ["sys_ptrace", "CAP_SYS_PTRACE", "SYS_ADMIN"]},
    }
    errors = host_request_errors(config, Policy())
    assert [p for p, _ in errors] == [
        "resources.devices[1].host_path",
        "environment.add_capabilities[2]",
    ]
    assert capability_name(" cap_net_raw ") == "NET_RAW"


def test_the_agent_follows_links_a_host_path_goes_through(tmp_path: Path) -> None:
    """A link under an allowed root that points outside it passes the gateway's check (paths
    as written) and is refused by the agent's (paths as the host resolves them)."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    os.symlink("/etc", allowed / "etc")

    class Here:
        allowed_bind_mount_roots = (str(allowed),)
        allowed_devices = ()
        allowed_capabilities = ()

    config = mounts(str(allowed / "etc"))
    assert host_request_errors(config, Here()) == []
    with pytest.raises(DockerRuntimeError, match=r"bind_mounts\[0\].host_path: .* \(/etc\)"):
        check_host_requests(config, Here())
