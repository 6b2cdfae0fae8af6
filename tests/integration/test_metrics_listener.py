"""A service's --metrics-address: a malformed one or one already in use stops the service at once
with exit status 2 and a message naming the flag and the address."""

from __future__ import annotations

import socket
from collections.abc import Callable

from cairn.local.servers import ServerProcess
from tests.helpers import spawn


def test_a_malformed_metrics_address_is_refused_naming_the_flag(
    service_env: Callable[..., dict[str, str]],
) -> None:
    """``--metrics-address 9464`` (no host) exits 2 before connecting, naming the flag and the
    form it wants."""
    proc = spawn(
        "services.scheduler",
        "--db",
        "postgresql://nowhere/x",
        "--metrics-address",
        "9464",
        env=service_env(),
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "--metrics-address" in err and "HOST:PORT" in err


def test_a_metrics_address_in_use_stops_the_service_naming_it(
    db_url: str, nats_server: ServerProcess, service_env: Callable[..., dict[str, str]]
) -> None:
    """A port another process listens on makes the tracker exit 2, its log naming the address
    and the flag."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn(
            "services.tracker",
            "--db", db_url,
            "--nats", nats_server.url,
            "--metrics-address", f"127.0.0.1:{port}",
            env=service_env(),
        )  # fmt: skip
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err[-2000:]
    assert f"127.0.0.1:{port}" in err and "--metrics-address" in err
