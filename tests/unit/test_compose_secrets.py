"""The compose lab cluster's secrets directory: made once, private, each container's files in a
directory of its own, and an older cluster's passwords kept."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from events.log.bus_auth import Authority, grants_current
from services.compose_secrets import MOUNT, NATS_SERVERS, fill

ME = (os.getuid(), os.getgid())
HOLDERS = ("postgres", "migrate", "relay", "searcher", "scheduler", "tracker", "api", "agent")


def test_every_file_is_private_and_each_holder_has_its_own_directory(tmp_path: Path) -> None:
    """Directories are 0700 and files 0600; each container's directory holds only its own
    files; service NATS URLs name their creds file where the container mounts it."""
    root = tmp_path / "secrets"
    fill(root, operator=ME, services=ME)
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert {p.name for p in (root / "agent").iterdir()} == {"join.token"}
    assert {p.name for p in (root / "postgres").iterdir()} == {"password"}
    assert {p.name for p in (root / "api").iterdir()} == {
        "nats", "api.creds", "authority.json", "join.token", "admin.password", "metrics.token",
    }  # fmt: skip
    assert (root / "api" / "metrics.token").read_text() == (root / "metrics.token").read_text()
    assert {p.name for p in (root / "relay").iterdir()} == {"nats", "relay.creds"}
    assert (root / "relay" / "nats").read_text() == (
        f"nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222?creds={MOUNT}/relay.creds\n"
    )
    password = (root / "postgres" / "password").read_text().strip()
    assert f":{password}@postgres:5432/cairn" in (root / "migrate" / "db").read_text()
    assert (root / "agent" / "join.token").read_text() == (root / "join.token").read_text()
    conf = (root / "nats" / "nats.conf").read_text()
    assert "operator:" in conf and "resolver_preload" in conf
    authority = Authority.from_json((root / "nats-auth" / "authority.json").read_text())
    assert authority.signing_seed not in conf  # the server's config holds no seed


def test_the_nats_servers_route_to_each_other_with_the_route_password(tmp_path: Path) -> None:
    """The servers' shared config routes to all three members, each route presenting the
    route password kept (0600) in the operator's nats-auth directory, and asks the same of
    every server that routes to it."""
    root = tmp_path / "secrets"
    fill(root, operator=ME, services=ME)
    password = (root / "nats-auth" / "route.password").read_text().strip()
    conf = (root / "nats" / "nats.conf").read_text()
    for server in NATS_SERVERS:
        assert f"nats-route://route:{password}@{server}:6222" in conf
    assert f'authorization {{ user: route, password: "{password}" }}' in conf


def test_a_second_run_keeps_every_secret(tmp_path: Path) -> None:
    """Filling again changes no secret and restores a service's copy that went missing."""
    root = tmp_path / "secrets"
    fill(root, operator=ME, services=ME)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    (root / "api" / "join.token").unlink()
    fill(root, operator=ME, services=ME)
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert after == before


def test_an_older_clusters_passwords_are_kept(tmp_path: Path) -> None:
    """The PostgreSQL and admin passwords an older lab cluster's .env held become the files'."""
    root = tmp_path / "secrets"
    legacy = {"POSTGRES_PASSWORD": "0ld-pg", "CAIRN_ADMIN_PASSWORD": "0ld-admin"}
    fill(root, operator=ME, services=ME, legacy=legacy)
    assert (root / "postgres" / "password").read_text().strip() == "0ld-pg"
    assert (root / "admin.password").read_text().strip() == "0ld-admin"
    assert (root / "api" / "admin.password").read_text().strip() == "0ld-admin"


def test_a_service_user_of_an_older_role_is_issued_anew(tmp_path: Path) -> None:
    """A service's NATS credentials that no longer grant what its role grants now (issued by an
    older cairn) are replaced on the next fill; current ones are kept as they are."""
    root = tmp_path / "secrets"
    fill(root, operator=ME, services=ME)
    relay = root / "relay" / "relay.creds"
    searcher = (root / "searcher" / "searcher.creds").read_bytes()
    authority = Authority.from_json((root / "nats-auth" / "authority.json").read_text())
    relay.write_text(authority.user_creds("cairn-relay", "service"))  # an older, narrower grant
    assert not grants_current(relay.read_text(), "relay")
    fill(root, operator=ME, services=ME)
    assert grants_current(relay.read_text(), "relay")
    assert (root / "searcher" / "searcher.creds").read_bytes() == searcher
