"""A service takes its credentials from files and keeps none in its environment, and the initial
admin has no default password: an earlier version's default is replaced by the one given."""

from __future__ import annotations

import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import aiohttp

from cairn.local.private_files import write_private
from events.log.store import EventStore
from services import credentials
from services.api.auth import LEGACY_ADMIN_PASSWORD, check_password, ensure_admin, hash_password
from services.api.tables import migrate as migrate_api
from tests.helpers import spawn, wait_until
from tests.inspection import environment_and_command


def free_port() -> int:
    """A TCP port free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def secret_file(directory: Path, name: str, value: str) -> Path:
    """``value`` written to ``directory/name``, mode 0600."""
    path = directory / name
    write_private(path, value + "\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path


async def test_a_service_reads_its_credentials_from_files_only(
    db_url: str, service_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """``python -m services.api`` given only the paths of its DSN, join token and admin
    password serves with them, and neither its environment nor its command line holds any."""
    admin_password, join_token = "file-admin-password-0123", "file-join-token-0123"
    port = free_port()
    ready = tmp_path / "ready"
    env = service_env(
        CAIRN_DB_FILE=str(secret_file(tmp_path, "db", db_url)),
        CAIRN_JOIN_TOKEN_FILE=str(secret_file(tmp_path, "join-token", join_token)),
        CAIRN_ADMIN_PASSWORD_FILE=str(secret_file(tmp_path, "admin", admin_password)),
        CAIRN_READY_FILE=str(ready),
    )
    for name in credentials.SECRET_VARIABLES:
        env.pop(name, None)
    proc = spawn("services.api", "--port", str(port), env=env)
    try:
        await wait_until(ready.exists, timeout=30)
        url = f"http://127.0.0.1:{port}/api/v1"
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{url}/auth/login", json={"username": "admin", "password": admin_password}
            ) as resp:
                assert resp.status == 200
            async with http.post(
                f"{url}/agents/probe/join",
                json={},
                headers={"Authorization": f"Bearer {join_token}"},
            ) as resp:
                assert resp.status == 200, await resp.text()
        seen = environment_and_command(proc.pid)
        password = db_url.split(":")[2].split("@")[0]
        for secret in (password, join_token, admin_password):
            assert secret not in seen
        assert f"CAIRN_DB_FILE={tmp_path / 'db'}" in seen  # the read worked
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_a_missing_credential_file_stops_the_service_with_its_name(
    service_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """A service whose DSN file cannot be read exits 2 naming the variable and the file."""
    missing = tmp_path / "no-such-db-file"
    env = service_env(CAIRN_DB_FILE=str(missing))
    env.pop("CAIRN_DB", None)
    proc = spawn("services.relay", env=env)
    assert proc.wait(timeout=30) == 2
    assert proc.stderr is not None
    said = proc.stderr.read()
    assert "CAIRN_DB" in said and str(missing) in said


def test_make_undumpable_clears_the_flag_in_this_process_only_until_exec(tmp_path: Path) -> None:
    """After make_undumpable a process reports itself undumpable; a program it then runs is
    dumpable again (trials an agent starts are not affected)."""
    code = (
        "import subprocess, sys\n"
        "from services import credentials\n"
        "assert credentials.dumpable()\n"
        "credentials.make_undumpable()\n"
        "assert not credentials.dumpable()\n"
        "child = 'from services import credentials; print(credentials.dumpable())'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True,"
        " check=True).stdout.strip())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


async def test_no_admin_without_a_password(store: EventStore) -> None:
    """Given no initial password, no admin is created: there is no default to log in with."""
    await migrate_api(store)
    await ensure_admin(store, None)
    assert await store.fetchval("SELECT count(*) FROM api_users") == 0


async def test_the_legacy_default_admin_password_is_replaced(store: EventStore) -> None:
    """An admin left with an earlier version's default password gets the one given; an admin
    whose password was changed keeps it."""
    await migrate_api(store)
    await store.execute(
        "INSERT INTO api_users (username, password_hash, admin) VALUES ('admin', $1, true)",
        hash_password(LEGACY_ADMIN_PASSWORD),
    )
    await ensure_admin(store, "a-generated-password-0123")
    assert not await check_password(store, "admin", LEGACY_ADMIN_PASSWORD)
    assert await check_password(store, "admin", "a-generated-password-0123")
    await ensure_admin(store, "yet-another-password-0123")
    assert await check_password(store, "admin", "a-generated-password-0123")


def test_cairn_up_generates_a_long_admin_password_once(tmp_path: Path) -> None:
    """The embedded cluster's admin password is generated at the first start (32 characters,
    mode 0600) and read back, not replaced, at later ones; CAIRN_ADMIN_PASSWORD, when set at
    the first start, is used instead and not shown."""
    from cairn.local.service_credentials import ADMIN_PASSWORD_FILE, ensure_admin_password

    password, generated = ensure_admin_password(tmp_path / "a")
    assert generated and len(password) >= 32
    assert stat.S_IMODE((tmp_path / "a" / ADMIN_PASSWORD_FILE).stat().st_mode) == 0o600
    assert ensure_admin_password(tmp_path / "a", "ignored-later") == (password, False)
    assert ensure_admin_password(tmp_path / "b", "chosen-by-compose!") == (
        "chosen-by-compose!",
        False,
    )
