"""The embedded cluster's own credentials on a real ``cairn up``: no service holds one in its
environment or command line, every service and the supervisor are undumpable, each service
connects as its own role, the admin password is generated, and an older data directory (a
superuser and nothing else) upgrades."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from cairn.local.servers import start_postgres
from cairn.local.service_credentials import ADMIN_PASSWORD_FILE, SECRETS_DIR
from events.log import migrations
from services import roles
from services.api import tables as api_tables
from services.api.auth import hash_password
from tests.e2e.test_embedded_cluster import ROOT, down, processes, status, up
from tests.inspection import environment_and_command, telling_identity, undumpable

DATABASE = "cairn"


def secrets_of(data_dir: Path) -> dict[str, str]:
    """Every credential of the cluster on ``data_dir``, by what it is."""
    auth = data_dir / "nats-auth"
    found = {
        "postgres superuser password": (data_dir / "pg.password").read_text().strip(),
        "join token": (data_dir / "join.token").read_text().strip(),
        "admin password": (data_dir / ADMIN_PASSWORD_FILE).read_text().strip(),
        "bus signing seed": json.loads((auth / "authority.json").read_text())["signing_seed"],
    }
    for creds in auth.glob("*.creds"):
        seed = creds.read_text().split("-----BEGIN USER NKEY SEED-----\n")[1][:58]
        found[f"NATS seed of {creds.stem}"] = seed
    for role in roles.SERVICE_ROLES:
        path = data_dir / SECRETS_DIR / role.service / "db.password"
        found[f"{role.service} role password"] = path.read_text().strip()
    assert all(len(value) >= 16 for value in found.values()), found
    return found


def live_pids(data_dir: Path) -> dict[str, int]:
    """The supervisor's and every service's pid, by name (the servers aside)."""
    code, report = status(data_dir)
    assert code == 0, report
    pids = {
        name: int(proc["pid"])
        for name, proc in processes(report).items()
        if proc["kind"] == "service"
    }
    pids["supervisor"] = int(report["supervisor_pid"])
    return pids


def up_telling(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """``cairn up`` as :func:`~tests.e2e.test_embedded_cluster.up` does, under an identity whose
    processes' ``/proc`` owners tell whether they are dumpable (root's group set to nogroup)."""
    env = {k: v for k, v in os.environ.items() if k != "CAIRN_HOME"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [
            *telling_identity(), sys.executable, "-m", "cairn", "up", "--data-dir", str(data_dir),
            "--slots", "2", "--api-port", "0", "--stop-timeout", "3",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=150, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"cairn up failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A cluster started on a fresh data directory; yields it and the first ``up``'s output."""
    data_dir = tmp_path_factory.mktemp("credentials") / "home"
    try:
        started = up_telling(data_dir)
        yield data_dir, started.stdout
    finally:
        down(data_dir)


async def login(api_url: str, password: str) -> int:
    """The status of logging in as admin with ``password``."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{api_url}/api/v1/auth/login", json={"username": "admin", "password": password}
        ) as resp,
    ):
        return resp.status


def superuser_dsn(data_dir: Path) -> str:
    """The superuser's DSN, as the supervisor keeps it in its 0600 state file."""
    return str(json.loads((data_dir / "cluster.json").read_text())["dsn"])


def api_url(data_dir: Path) -> str:
    """The running cluster's API URL."""
    return str(status(data_dir)[1]["api_url"])


def test_no_service_process_shows_a_credential(cluster: tuple[Path, str]) -> None:
    """No service's (nor the supervisor's) /proc environ or command line holds a PostgreSQL
    password, a NATS key, the join token or the admin password; what a service holds instead
    is the paths of its own files, which only their owner may read."""
    data_dir, _ = cluster
    secrets = secrets_of(data_dir)
    pids = live_pids(data_dir)
    assert {"relay", "api", "searcher", "scheduler", "tracker", "agent"} <= set(pids)
    for name, pid in pids.items():
        seen = environment_and_command(pid)
        leaked = [what for what, value in secrets.items() if value in seen]
        assert leaked == [], f"{name} (pid {pid}) shows {leaked}"
        if name != "supervisor":  # the read worked: the variables naming its files are there
            assert f"CAIRN_NATS_FILE={data_dir / SECRETS_DIR}" in seen, name
    service_env = environment_and_command(pids["api"])
    assert f"CAIRN_DB_FILE={data_dir / SECRETS_DIR / 'api' / 'db'}" in service_env
    assert "CAIRN_DB_FILE" not in environment_and_command(pids["agent"])  # no database at all
    top = data_dir / SECRETS_DIR
    assert stat.S_IMODE(top.stat().st_mode) == 0o700
    for path in top.rglob("*"):
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.stat().st_mode) == expected, path


def test_every_service_and_the_supervisor_are_undumpable(cluster: tuple[Path, str]) -> None:
    """Every service and the supervisor are undumpable (their /proc files belong to root, so no
    process of their uid reads their environment or memory or attaches to them), while
    PostgreSQL, started the same way, is not: the check tells the two apart."""
    data_dir, _ = cluster
    code, report = status(data_dir)
    assert code == 0, report
    postgres = int(processes(report)["postgres"]["pid"])
    assert not undumpable(postgres)
    for name, pid in live_pids(data_dir).items():
        assert undumpable(pid), f"{name} (pid {pid}) is dumpable"


def test_each_service_connects_as_its_own_role(cluster: tuple[Path, str]) -> None:
    """The database sessions of the running cluster are those of the services' roles, none of
    them a superuser's; the superuser's only session is this test's."""
    data_dir, _ = cluster
    dsn = superuser_dsn(data_dir)

    async def users() -> set[str]:
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "SELECT DISTINCT usename FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                DATABASE,
            )
        finally:
            await conn.close()
        return {str(r["usename"]) for r in rows}

    expected = {roles.role_name(DATABASE, r.service) for r in roles.SERVICE_ROLES}
    assert asyncio.run(users()) == expected


def test_a_fresh_cluster_generates_its_admin_password(cluster: tuple[Path, str]) -> None:
    """The first ``cairn up`` generates the admin password into ``admin.password`` (0600) and
    shows it once; ``admin``/``admin`` is refused and the generated one logs in; a second
    ``cairn up`` does not show it again."""
    data_dir, first = cluster
    path = data_dir / ADMIN_PASSWORD_FILE
    password = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(password) >= 32
    assert password in first
    url = api_url(data_dir)
    assert asyncio.run(login(url, "admin")) == 401
    assert asyncio.run(login(url, password)) == 200
    again = up(data_dir)
    assert "nothing to do" in again.stdout and password not in again.stdout


def make_older_data_dir(data_dir: Path) -> str:
    """A data directory as an earlier version left it: a PostgreSQL superuser and no other
    role, the log's migrations up to the plain append function, the admin with the default
    password, and one event; returns that event's id."""
    server = start_postgres(data_dir / "pg")
    event_id = str(uuid.uuid4())

    async def fill() -> None:
        admin = await asyncpg.connect(server.url)
        try:
            await admin.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await admin.close()
        from events.log.db import connect

        conn = await connect(server.url.rsplit("/", 1)[0] + f"/{DATABASE}")
        try:
            old_core = [m for m in migrations.CORE if m[0] <= "0006_append_function"]
            await migrations.apply(conn, "core", old_core)
            await migrations.apply(conn, api_tables.NAMESPACE, api_tables.MIGRATIONS)
            await conn.execute(
                "INSERT INTO api_users (username, password_hash, admin) VALUES ('admin', $1, true)",
                hash_password("admin"),
            )
            await conn.execute(
                "SELECT cairn_append('experiment-4242', ARRAY[$1::uuid],"
                " ARRAY['ExperimentSubmitted'], ARRAY[1],"
                " ARRAY['{\"experiment_id\": 4242, \"config\": {}}'], ARRAY['{}'], 0, NULL, NULL,"
                " 'cairn_events')",
                event_id,
            )
        finally:
            await conn.close()

    try:
        asyncio.run(fill())
    finally:
        server.stop()
    return event_id


def test_an_older_data_dir_upgrades(tmp_path: Path) -> None:
    """``cairn up`` on a data directory from before roles existed: its log is kept, the roles
    are made and every service runs as its own, appends run as the log's writer role, and the
    admin's default password is replaced by the generated one."""
    data_dir = tmp_path / "old"
    event_id = make_older_data_dir(data_dir)
    assert not (data_dir / ADMIN_PASSWORD_FILE).exists()
    try:
        first = up(data_dir)
        password = (data_dir / ADMIN_PASSWORD_FILE).read_text().strip()
        assert password in first.stdout
        url = api_url(data_dir)
        assert asyncio.run(login(url, "admin")) == 401
        assert asyncio.run(login(url, password)) == 200
        found = asyncio.run(upgraded(superuser_dsn(data_dir)))
        assert found["events"] == [event_id]
        assert found["owner"] == (migrations.LOG_WRITER, True)
        assert found["users"] == {roles.role_name(DATABASE, r.service) for r in roles.SERVICE_ROLES}
    finally:
        down(data_dir)


async def upgraded(dsn: str) -> dict[str, Any]:
    """What the upgrade left: the marker stream's event ids, the append function's owner and
    whether it runs as its owner, and the users of the services' sessions."""
    conn = await asyncpg.connect(dsn)
    try:
        events = await conn.fetch(
            "SELECT event_id::text FROM events WHERE stream_id = 'experiment-4242'"
        )
        owner = await conn.fetchrow(
            "SELECT pg_get_userbyid(proowner) AS owner, prosecdef FROM pg_proc"
            " WHERE proname = 'cairn_append'"
        )
        users = await conn.fetch(
            "SELECT DISTINCT usename FROM pg_stat_activity"
            " WHERE datname = $1 AND pid <> pg_backend_pid()",
            DATABASE,
        )
    finally:
        await conn.close()
    return {
        "events": [str(r["event_id"]) for r in events],
        "owner": (str(owner["owner"]), bool(owner["prosecdef"])),
        "users": {str(r["usename"]) for r in users},
    }
