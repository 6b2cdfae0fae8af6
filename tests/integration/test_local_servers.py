"""The embedded PostgreSQL and nats-server: credentials required, no permissions widened."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import nats
import nats.errors
import psutil
import pytest

from cairn.local import servers
from cairn.local.servers import ServerProcess, secret_file, start_nats, start_postgres
from events.log.bus import connect_options, with_creds
from events.log.bus_auth import Authority, grants_current, write_private

PASSWD = Path("/etc/passwd")


def mode(path: Path) -> int:
    """The permission bits of ``path``."""
    return stat.S_IMODE(path.stat().st_mode)


def parent_modes(path: Path) -> dict[Path, int]:
    """The permission bits of every directory from ``path`` up to ``/``."""
    return {p: mode(p) for p in [path, *path.parents]}


def passwd_digest() -> str:
    """A digest of the user database, to show no user was added."""
    return hashlib.sha256(PASSWD.read_bytes()).hexdigest()


async def refused_by_postgres(url: str) -> asyncpg.InvalidAuthorizationSpecificationError:
    """Connects to ``url`` and returns the authentication error (fails if it connects)."""
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError) as caught:
        conn = await asyncpg.connect(url, timeout=10)
        await conn.close()
    return caught.value


async def refused_by_nats(url: str) -> nats.errors.Error:
    """Connects to ``url`` once and returns the error (fails if it connects)."""
    with pytest.raises(nats.errors.Error) as caught:
        nc = await nats.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=10
        )
        await nc.close()
    return caught.value


async def test_postgres_refuses_connections_without_the_password(pg_server: ServerProcess) -> None:
    """Without a password, or with a wrong one, PostgreSQL refuses; with its own it accepts."""
    plain = f"postgresql://postgres@127.0.0.1:{pg_server.port}/postgres"
    wrong = f"postgresql://postgres:wrong@127.0.0.1:{pg_server.port}/postgres"
    for url in (plain, wrong):
        error = await refused_by_postgres(url)
        assert "password authentication failed" in str(error)
    conn = await asyncpg.connect(pg_server.url)
    try:
        assert await conn.fetchval("SELECT current_user") == "postgres"
    finally:
        await conn.close()
    password = secret_file(pg_server.data_dir)
    assert mode(password) == 0o600
    assert password.read_text().strip() in pg_server.url
    assert password.read_text().strip() not in pg_server.display_url


async def test_nats_refuses_connections_without_a_credential_of_its_own(
    nats_server: ServerProcess, tmp_path: Path
) -> None:
    """Anonymous, with a password, or with a user signed by another cluster's key, nats-server
    refuses; with a user of its own it accepts; its keys and credentials are 0600."""
    error = await refused_by_nats(f"nats://127.0.0.1:{nats_server.port}")
    assert "Authorization Violation" in str(error)
    error = await refused_by_nats(f"nats://cairn:wrong@127.0.0.1:{nats_server.port}")
    assert "Authorization Violation" in str(error)
    stranger = tmp_path / "stranger.creds"
    write_private(stranger, Authority.create().user_creds("stranger", "admin"))
    with pytest.raises(nats.errors.Error) as caught:
        nc = await nats.connect(
            **connect_options(with_creds(nats_server.url, stranger)),
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=10,
        )
        await nc.close()
    assert "Authorization Violation" in str(caught.value)
    nc = await nats.connect(
        **connect_options(nats_server.url), allow_reconnect=False, connect_timeout=10
    )
    try:
        await nc.flush(timeout=10)
    finally:
        await nc.close()
    conf = nats_server.data_dir.parent / f"{nats_server.data_dir.name}.conf"
    auth_dir = servers.nats_auth_dir(nats_server.data_dir)
    assert mode(conf) == 0o600
    assert mode(auth_dir) == 0o700
    assert {p.name: mode(p) for p in auth_dir.iterdir()} == {
        "authority.json": 0o600,
        "admin.creds": 0o600,
    }


def test_nats_restart_reuses_its_keys(nats_server: ServerProcess) -> None:
    """A nats-server restarted on the same directory trusts the same keys (its users'
    credentials stay valid, so clients reconnect)."""
    nats_server.stop()
    again = start_nats(nats_server.data_dir, port=nats_server.port)
    try:
        assert again.url == nats_server.url
    finally:
        again.stop()


def test_a_service_user_of_an_older_role_is_issued_anew(nats_server: ServerProcess) -> None:
    """A service's credentials granting less than its role grants now (issued by an older
    cairn, before the relay could read the stream's tail) are issued anew on next use."""
    auth_dir = servers.nats_auth_dir(nats_server.data_dir)
    relay = servers.nats_creds(auth_dir, "relay")
    authority = servers.nats_authority(auth_dir)
    write_private(relay, authority.user_creds("cairn-relay", "service"))
    assert not grants_current(relay.read_text(), "relay")
    assert servers.nats_creds(auth_dir, "relay") == relay
    assert grants_current(relay.read_text(), "relay")


@pytest.fixture
def private_tree(tmp_path: Path) -> Iterator[Path]:
    """Two nested mode-0700 directories, as a private home directory is."""
    outer = tmp_path / "home"
    inner = outer / "private"
    inner.mkdir(parents=True)
    outer.chmod(0o700)
    inner.chmod(0o700)
    yield inner


def test_postgres_under_private_directories_widens_nothing(
    private_tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL starts (as root too) with its data and binaries behind 0700 directories, and
    no directory's mode changes and no user is added."""
    # The binaries are reached through a link inside the private tree, as a virtualenv in a
    # private checkout reaches them.
    link = private_tree / "pgbin"
    link.symlink_to(servers._pg_bin())
    monkeypatch.setattr(servers, "_pg_bin", lambda: link)
    data_dir = private_tree / "cluster" / "pg"
    data_dir.parent.mkdir()
    data_dir.parent.chmod(0o700)
    before, users = parent_modes(data_dir.parent), passwd_digest()

    server = start_postgres(data_dir, fast=True)
    try:
        assert psutil.Process(server.pid).name() == "postgres", "the pid held is the postmaster"
        assert parent_modes(data_dir.parent) == before
        assert passwd_digest() == users
        assert mode(data_dir) == 0o700 and data_dir.stat().st_uid == os.geteuid()
        assert mode(secret_file(data_dir)) == 0o600
    finally:
        server.kill()
    assert not server.alive()
    again = start_postgres(data_dir, fast=True)
    try:
        assert again.url.split("@")[0] == server.url.split("@")[0], "same password on restart"
    finally:
        again.stop()


async def test_postgres_initialised_without_a_password_gets_one(tmp_path: Path) -> None:
    """A data directory an earlier version initialised (trusting everyone) requires a password
    after the next start."""
    data_dir = tmp_path / "pg"
    server = start_postgres(data_dir, fast=True)
    server.stop()
    hba = data_dir / "pg_hba.conf"
    hba.write_text("host all all 127.0.0.1/32 trust\n")
    secret_file(data_dir).unlink()

    server = start_postgres(data_dir, fast=True)
    try:
        plain = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        assert "password authentication failed" in str(await refused_by_postgres(plain))
        conn = await asyncpg.connect(server.url)
        await conn.close()
        assert "trust" not in hba.read_text()
        assert mode(secret_file(data_dir)) == 0o600
    finally:
        server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs PostgreSQL in a user namespace")
def test_root_without_unshare_gets_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root with no way to make a user namespace, start-up says to run as a non-root user and
    leaves every directory's mode alone."""
    monkeypatch.setattr(servers, "_namespace_prefix", [])
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    data_dir = tmp_path / "private" / "pg"
    data_dir.parent.mkdir()
    data_dir.parent.chmod(0o700)
    before = parent_modes(data_dir.parent)
    with pytest.raises(servers.ServerStartError, match="run cairn as a non-root user"):
        start_postgres(data_dir, fast=True)
    assert parent_modes(data_dir.parent) == before
