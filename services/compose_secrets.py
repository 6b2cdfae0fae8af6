"""The compose lab cluster's secrets: made once, and each service's in a directory of its own.

``deploy/compose/quickstart.sh`` runs ``python -m services.compose_secrets DIR --operator UID:GID``
as root in a throwaway container of the services image (no network, ``DIR`` bind-mounted), so
the host needs neither cairn's Python packages nor root. It fills ``DIR``::

    DIR/                       0700, the operator's (UID:GID): what a person needs
      admin.password           the initial admin's password (``cairn user login admin``)
      join.token               the join token, for agents on other machines
      metrics.token            the bearer token Prometheus presents for the API's /metrics
      nats-auth/               authority.json (the bus's signing key), admin.creds (a NATS
                               user that may do anything: tools, the lab tests),
                               route.password (what the NATS servers present to each other)
    DIR/<holder>/              0700, the services image's user (uid 1000): one per container
      postgres/password        the PostgreSQL superuser's password       -> postgres
      migrate/db               the superuser's DSN                         -> the migrate job
      db/<service>/            db, db.password (the migrate job writes them) -> that service
      relay/, searcher/,       nats (the NATS URL, naming the creds file),
      scheduler/, tracker/     <service>.creds                             -> that service
      api/                     nats, api.creds, authority.json, join.token,
                               admin.password, metrics.token               -> the API
      agent/join.token                                                     -> every agent
      nats/nats.conf           the NATS servers' config (operator mode: JWTs, no seed; the
                               cluster's routes)               -> nats-1, nats-2, nats-3

Each container bind-mounts only its own directories, read-only, at :data:`MOUNT` (and the
database login at :data:`DB_MOUNT`); no secret is ever in an environment, a command line or an
image.

Invariants: a secret is generated once and kept (a later run makes only what is missing, and
refreshes the services' copies of the operator's files from them); every file is written mode
0600 from its first byte; nothing here prints a secret. An older lab cluster's values (from the
``.env`` that used to hold them) may be handed in on standard input with ``--import-legacy``, so
its PostgreSQL volume and admin keep their passwords.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

from cairn.local.private_files import write_private
from events.log.bus_auth import (
    AUTHORITY_FILE,
    USER_ROLES,
    Authority,
    grants_current,
    read_private,
)
from events.log.limits import BUS_MAX_PAYLOAD
from services import roles

SERVICE_UID = 1000
"""The services image's user (``cairn``), who owns every service's directory."""
MOUNT = "/run/secrets/cairn"
"""Where a container finds its directory of ``DIR``."""
DB_MOUNT = "/run/secrets/db"
"""Where a service finds its database login (``DIR/db/<service>``)."""
POSTGRES_HOST = "postgres:5432"
NATS_SERVERS = ("nats-1", "nats-2", "nats-3")
"""The compose services of the NATS cluster (each its own JetStream store; streams keep a copy
on each, so any one may die)."""
NATS_URL = ",".join(f"nats://{server}:4222" for server in NATS_SERVERS)
"""Every NATS server's address: a client reconnects to another when its server dies."""
ROUTE_USER = "route"
"""The user the NATS servers present to each other on their routes."""
SUPERUSER = "cairn"
DATABASE = "cairn"
BUS_SERVICES = ("relay", "searcher", "scheduler", "tracker", "api")
"""The services with a NATS user of their own (agents join for theirs)."""
ADMIN_PASSWORD = "admin.password"
JOIN_TOKEN = "join.token"
METRICS_TOKEN = "metrics.token"
LEGACY_KEYS = ("POSTGRES_PASSWORD", "CAIRN_ADMIN_PASSWORD")
"""The secrets an older ``.env`` held that a cluster's volumes still depend on."""


class SecretFilesError(Exception):
    """The directory cannot be filled (the message names the path)."""


def _private_dir(path: Path, owner: tuple[int, int]) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(path, *owner)
    path.chmod(0o700)
    return path


def _write(path: Path, text: str, owner: tuple[int, int]) -> None:
    write_private(path, text)
    os.chown(path, *owner)


def _kept(path: Path, make: str, owner: tuple[int, int]) -> str:
    """The secret in ``path``, written from ``make`` if the file is missing or empty."""
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    if not value:
        value = make
        _write(path, value + "\n", owner)
    os.chown(path, *owner)
    return value


def _token() -> str:
    return secrets.token_urlsafe(32)


def server_config(authority: Authority, route_password: str) -> str:
    """The config every NATS server of the cluster shares (each is named by ``--name`` on its
    command line): operator mode, JetStream in ``/data``, routes to every member (a server
    ignores the one to itself) that present ``route_password``, and monitoring (health checks)
    on the container's loopback only."""
    routes = ", ".join(
        f'"nats-route://{ROUTE_USER}:{route_password}@{server}:6222"' for server in NATS_SERVERS
    )
    return (
        'listen: "0.0.0.0:4222"\n'
        f"max_payload: {BUS_MAX_PAYLOAD}\n"
        'http: "127.0.0.1:8222"\n'
        f"{authority.server_config()}"
        "cluster {\n"
        "  name: cairn\n"
        '  listen: "0.0.0.0:6222"\n'
        f'  authorization {{ user: {ROUTE_USER}, password: "{route_password}" }}\n'
        f"  routes: [{routes}]\n"
        "}\n"
        'jetstream {\n  store_dir: "/data"\n}\n'
    )


def fill(
    root: Path,
    *,
    operator: tuple[int, int],
    services: tuple[int, int] = (SERVICE_UID, SERVICE_UID),
    legacy: Mapping[str, str] | None = None,
) -> None:
    """Makes whatever is missing of ``root``'s secrets (see the module's docstring).

    Args:
        root: the secrets directory.
        operator: uid and gid of the person who runs the cluster (owner of ``root``).
        services: uid and gid of the services' directories (the services image's user).
        legacy: an older cluster's ``POSTGRES_PASSWORD`` / ``CAIRN_ADMIN_PASSWORD``, used for
            files that do not exist yet.

    Raises:
        SecretFilesError: the bus's authority cannot be read.
    """
    old = dict(legacy or {})
    service = services
    _private_dir(root, operator)
    admin_password = _kept(
        root / ADMIN_PASSWORD, old.get("CAIRN_ADMIN_PASSWORD") or _token(), operator
    )
    join_token = _kept(root / JOIN_TOKEN, _token(), operator)
    metrics_token = _kept(root / METRICS_TOKEN, _token(), operator)
    auth_dir = _private_dir(root / "nats-auth", operator)
    authority_file = auth_dir / AUTHORITY_FILE
    if authority_file.exists():
        try:
            authority = Authority.from_json(read_private(authority_file, what="NATS authority"))
        except Exception as exc:
            raise SecretFilesError(f"{authority_file}: {exc}") from exc
    else:
        authority = Authority.create()
        _write(authority_file, authority.to_json(), operator)
    route_password = _kept(auth_dir / "route.password", _token(), operator)
    if not (auth_dir / "admin.creds").exists():
        _write(auth_dir / "admin.creds", authority.user_creds("cairn-admin", "admin"), operator)

    pg_password = _kept(
        _private_dir(root / "postgres", service) / "password",
        old.get("POSTGRES_PASSWORD") or _token(),
        service,
    )
    superuser_dsn = (
        f"postgresql://{SUPERUSER}:{quote(pg_password, safe='')}@{POSTGRES_HOST}/{DATABASE}"
    )
    _write(_private_dir(root / "migrate", service) / "db", superuser_dsn + "\n", service)
    logins = _private_dir(root / "db", service)
    for role in roles.SERVICE_ROLES:
        _private_dir(logins / role.service, service)

    for name in BUS_SERVICES:
        directory = _private_dir(root / name, service)
        creds = directory / f"{name}.creds"
        if not creds.exists() or not grants_current(creds.read_text(), USER_ROLES[name]):
            _write(creds, authority.user_creds(f"cairn-{name}", USER_ROLES[name]), service)
        _write(directory / "nats", f"{NATS_URL}?creds={MOUNT}/{creds.name}\n", service)
    api = root / "api"
    _write(api / AUTHORITY_FILE, authority.to_json(), service)
    _write(api / JOIN_TOKEN, join_token + "\n", service)
    _write(api / ADMIN_PASSWORD, admin_password + "\n", service)
    _write(api / METRICS_TOKEN, metrics_token + "\n", service)
    _write(_private_dir(root / "agent", service) / JOIN_TOKEN, join_token + "\n", service)
    nats_conf = server_config(authority, route_password)
    _write(_private_dir(root / "nats", service) / "nats.conf", nats_conf, service)


def _owner(text: str) -> tuple[int, int]:
    uid, _, gid = text.partition(":")
    try:
        return int(uid), int(gid or uid)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected UID:GID, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (1 when the directory cannot be filled)."""
    parser = argparse.ArgumentParser(prog="python -m services.compose_secrets", description=__doc__)
    parser.add_argument("root", type=Path, help="the secrets directory")
    parser.add_argument(
        "--operator", type=_owner, required=True, help="UID:GID of the cluster's operator"
    )
    parser.add_argument(
        "--import-legacy",
        action="store_true",
        help="read an older cluster's secrets from standard input (a JSON object of "
        + ", ".join(LEGACY_KEYS)
        + ")",
    )
    args = parser.parse_args(argv)
    legacy: dict[str, str] = {}
    if args.import_legacy:
        given = json.loads(sys.stdin.read() or "{}")
        legacy = {k: str(v) for k, v in given.items() if k in LEGACY_KEYS and v}
    try:
        fill(args.root, operator=args.operator, legacy=legacy)
    except (SecretFilesError, OSError) as exc:
        print(f"cannot make the lab cluster's secrets: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
