"""How a launcher (``cairn up``'s supervisor, or a test's process cluster) hands each service its
credentials: in files of the service's own, never in its environment or on its command line.

Layout, under a launcher's secrets directory (mode 0700)::

    <secrets>/<service>/          0700, one per service (replicas and extra agents share it)
        db, db.password           its PostgreSQL role's DSN and password (not for agents), made
                                  by ``python -m services.migrate --logins <secrets>``
        nats                      its NATS URL (with its credentials, or the path of its NATS
                                  credentials file)

A service learns the paths from ``CAIRN_DB_FILE``, ``CAIRN_NATS_FILE`` and
``CAIRN_ADMIN_PASSWORD_FILE`` (gateway only); the join token and the bus's authority reach the
gateway and agents as paths too (``CAIRN_JOIN_TOKEN_FILE``, ``CAIRN_NATS_AUTHORITY_FILE``). The
variables that would hold a secret itself are removed from its environment (see
:mod:`services.credentials`). Every file is mode 0600.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

from cairn.errors import CairnError
from cairn.local.private_files import write_private
from services import credentials

SECRETS_DIR = "secrets"
"""The secrets directory's name under a data directory."""
NATS_FILE = "nats"
DB_FILE = "db"
ADMIN_PASSWORD_FILE = "admin.password"
"""The initial admin's password, in the data directory (mode 0600)."""
ADMIN_PASSWORD_BYTES = 24
"""Random bytes in a generated admin password (32 characters)."""
_ADMIN_HOLDERS = frozenset({"api"})


class CredentialsHandoverError(CairnError):
    """The services' roles or credential files could not be made (the message says why)."""


def secrets_dir(root: Path) -> Path:
    """The secrets directory under ``root`` (a data or work directory), made mode 0700."""
    return _private_dir(root / SECRETS_DIR)


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def grant_roles(
    superuser_dsn: str, secrets_root: Path, *, env: dict[str, str], timeout: float
) -> None:
    """Runs ``python -m services.migrate`` as the superuser: every migration, every service's
    role with its rights, and each role's login files under ``secrets_root``.

    The superuser's DSN goes to the child on its standard input, never in a file or argument.

    Raises:
        CredentialsHandoverError: it failed or took longer than ``timeout`` seconds.
    """
    command = [
        sys.executable, "-m", "services.migrate", "--db-file", "/dev/stdin",
        "--logins", str(secrets_root),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command,
            input=superuser_dsn,
            capture_output=True,
            text=True,
            env=credentials.without_secrets(env),
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise CredentialsHandoverError(f"migrations did not finish in {timeout:.0f}s") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise CredentialsHandoverError(
            f"migrations and roles failed (exit {done.returncode}):\n{output}"
        )


def service_files(
    secrets_root: Path,
    service: str,
    *,
    nats_url: str,
    admin_password: Path | None,
) -> dict[str, str]:
    """Writes ``service``'s NATS URL under ``secrets_root``; returns the environment variables
    naming its files.

    Args:
        secrets_root: the secrets directory (:func:`secrets_dir`).
        service: the service (``searcher``, not a replica's name ``searcher-2``).
        nats_url: its NATS URL.
        admin_password: the file of the initial admin's password, for the gateway.
    """
    directory = _private_dir(secrets_root / service)
    write_private(directory / NATS_FILE, nats_url + "\n")
    env = {"CAIRN_NATS_FILE": str(directory / NATS_FILE)}
    if (directory / DB_FILE).is_file():
        env["CAIRN_DB_FILE"] = str(directory / DB_FILE)
    if service in _ADMIN_HOLDERS and admin_password is not None:
        env["CAIRN_ADMIN_PASSWORD_FILE"] = str(admin_password)
    return env


def service_env(base: dict[str, str], files: dict[str, str]) -> dict[str, str]:
    """``base`` without any variable that holds a secret, plus ``files`` (the paths)."""
    return {**credentials.without_secrets(base), **files}


def ensure_admin_password(data_dir: Path, given: str | None = None) -> tuple[str, bool]:
    """The embedded cluster's initial admin password, kept in ``DIR/admin.password`` (0600).

    Made at the first start: ``given`` (``CAIRN_ADMIN_PASSWORD``) if set, else generated. Later
    starts read the file and ignore ``given``.

    Returns:
        The password, and whether it was generated just now (to be shown once).
    """
    current = admin_password(data_dir)
    if current is not None:
        return current, False
    data_dir.mkdir(parents=True, exist_ok=True)
    password = given or secrets.token_urlsafe(ADMIN_PASSWORD_BYTES)
    write_private(data_dir / ADMIN_PASSWORD_FILE, password + "\n")
    return password, not given


def admin_password(data_dir: Path) -> str | None:
    """The embedded cluster's admin password from ``DIR/admin.password``, if it can be read."""
    try:
        return (data_dir / ADMIN_PASSWORD_FILE).read_text().strip() or None
    except OSError:
        return None
