"""User code runs as someone else: two ordinary users' trials on a real embedded cluster
(``cairn up`` as root) look for the cluster's credentials, signal its services and reach for each
other's files, and find, kill and read nothing.

The cluster is started once for the module in a fresh, private (mode 0700) directory, with an
admin password of its own in the services' environment, so that a leak anywhere would show.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from cairn.client import code_tarball
from events.domain.identities import ASSIGNED_UIDS
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="uids change only under root")

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "probe"
LINKED_UID, LINKED_GID = 4242, 4343
ZERO_CAPS = "0000000000000000"
NATS_SECRET = re.compile(r"\bS[OAU][A-Z2-7]{50,}\b")
"""An NKEY seed (operator, account, user), as the bus's authority and credentials hold them."""


@dataclass
class Embedded:
    """The module's cluster: data directory, API URL, admin password and process ids."""

    home: Path
    api_url: str
    admin_password: str

    def state(self) -> dict[str, Any]:
        """``cluster.json`` now."""
        data: dict[str, Any] = json.loads((self.home / "cluster.json").read_text())
        return data

    def service_pids(self) -> dict[str, int]:
        """Every server's and service's pid, and the supervisor's."""
        state = self.state()
        pids = {name: int(p["pid"]) for name, p in state["processes"].items() if p.get("pid")}
        pids["supervisor"] = int(state["supervisor_pid"])
        return pids

    def secrets(self) -> dict[str, str]:
        """Every credential of the cluster found on disk or given to it: passwords and tokens,
        the bus's keys and signed users, the agent's own API token."""
        found = {"admin password": self.admin_password}
        for path in [*self.home.rglob("*.password"), *self.home.rglob("*.token")]:
            value = path.read_text().strip()
            if value:
                found[path.name] = value
        for path in [*self.home.rglob("*.creds"), *self.home.rglob("authority.json")]:
            for n, value in enumerate(NATS_SECRET.findall(path.read_text())):
                found[f"{path.name} #{n}"] = value
        for path in self.home.rglob("credential.json"):
            found[f"{path.parent.name}'s API token"] = json.loads(path.read_text())["token"]
        assert len(found) > 5, found  # the cluster's secrets are where this test looks
        return found


def cairn(home: Path, *args: str, extra: dict[str, str] | None = None) -> None:
    """Runs the CLI against the cluster in ``home``; it must succeed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(home), **(extra or {})})
    done = subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, f"cairn {args}: {done.stdout}\n{done.stderr}"


@pytest.fixture(scope="module")
def embedded() -> Iterator[Embedded]:
    """One embedded cluster (two CPU slots) in a private directory for the whole module."""
    scratch = Path(tempfile.mkdtemp(prefix="cairn-confine-"))
    home = scratch / "home"
    password = secrets.token_urlsafe(24)
    try:
        cairn(
            home, "up", "--slots", "2", "--api-port", "0", "--stop-timeout", "3",
            extra={"CAIRN_ADMIN_PASSWORD": password},
        )  # fmt: skip
        state = json.loads((home / "cluster.json").read_text())
        generated = home / "admin.password"  # a cluster that generates its own ignores ours
        if generated.exists():
            password = generated.read_text().strip()
        yield Embedded(home, state["api_url"], password)
    finally:
        cairn(home, "down")
        shutil.rmtree(scratch, ignore_errors=True)


class Api:
    """A logged-in user's calls to the API."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str) -> None:
        self.http = http
        self.url = url
        self.token = token

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The status and JSON answer of one call."""
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.http.request(
            method, f"{self.url}/api/v1{path}", json=body, headers=headers
        ) as resp:
            return resp.status, await resp.json()

    async def ok(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of a call that must succeed."""
        status, data = await self.call(method, path, body)
        assert status == 200, f"{method} {path} -> {status}: {data}"
        return data


@dataclass
class Users:
    """The admin and two ordinary users, logged in."""

    admin: Api
    a: Api
    b: Api


@pytest.fixture
async def users(embedded: Embedded) -> AsyncIterator[Users]:
    """``user-a`` and ``user-b`` (created once), and the admin, each logged in."""
    async with aiohttp.ClientSession() as http:

        async def login(name: str, password: str) -> Api:
            async with http.post(
                f"{embedded.api_url}/api/v1/auth/login",
                json={"username": name, "password": password},
            ) as resp:
                data = await resp.json()
                assert resp.status == 200, data
            return Api(http, embedded.api_url, data["token"])

        admin = await login("admin", embedded.admin_password)
        for name in ("user-a", "user-b"):
            status, data = await admin.call(
                "POST", "/users", {"username": name, "password": f"{name}-password-1"}
            )
            assert status in (200, 409), data
        yield Users(
            admin,
            await login("user-a", "user-a-password-1"),
            await login("user-b", "user-b-password-1"),
        )


def probe_config(**hparams: Any) -> dict[str, Any]:
    """A single-trial experiment running the probe with ``hparams``."""
    return {
        "name": "probe",
        "entrypoint": "python3 probe.py",
        "hyperparameters": hparams,
        "searcher": {"name": "single", "metric": "validation_loss", "max_length": 1},
        "max_restarts": 0,
    }


async def submit(api: Api, config: dict[str, Any]) -> int:
    """Submits ``config`` with the probe's code; returns the experiment's only trial id."""
    code = base64.b64encode(code_tarball(PROBE)).decode()
    created = await api.ok("POST", "/experiments", {"config": config, "code": code})
    experiment_id = int(created["id"])

    async def trial() -> int | None:
        data = await api.ok("GET", f"/experiments/{experiment_id}/trials")
        trials = data.get("trials") or []
        return int(trials[0]["trial_id"]) if trials else None

    found: int = await wait_until(trial, timeout=60)
    return found


async def report_of(api: Api, trial_id: int) -> dict[str, Any]:
    """The probe's report, once it is in the trial's logs."""

    async def report() -> dict[str, Any] | None:
        data = await api.ok("GET", f"/trials/{trial_id}/logs?limit=1000")
        for entry in data["logs"]:
            if entry["line"].startswith("REPORT "):
                found: dict[str, Any] = json.loads(entry["line"][len("REPORT ") :])
                return found
        return None

    found: dict[str, Any] = await wait_until(report, timeout=120)
    return found


async def ended(api: Api, trial_id: int) -> str:
    """The trial's state once it has ended."""

    async def state() -> str | None:
        data = await api.ok("GET", f"/trials/{trial_id}")
        value = str(data.get("state"))
        return value if value in ("COMPLETED", "ERROR", "CANCELED") else None

    found: str = await wait_until(state, timeout=120)
    return found


def owner_and_mode(*paths: Path) -> list[tuple[int, int, int]]:
    """Each path's uid, gid and permission bits."""
    out = []
    for path in paths:
        info = path.stat()
        out.append((info.st_uid, info.st_gid, info.st_mode & 0o7777))
    return out


def check_unprivileged(report: dict[str, Any]) -> tuple[int, int]:
    """The report's uid and gid, after checking it had no privilege at all."""
    status = report["status"]
    uids = {int(u) for u in status["Uid"].split()}
    gids = {int(g) for g in status["Gid"].split()}
    assert len(uids) == 1 and len(gids) == 1, status  # real, effective, saved and fs alike
    assert 0 not in uids and 0 not in gids
    assert status["NoNewPrivs"] == "1"
    for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert status[name] == ZERO_CAPS, (name, status[name])
    return uids.pop(), gids.pop()


def check_found_no_credential(report: dict[str, Any], found: dict[str, str]) -> None:
    """Nothing the probe read holds any of the cluster's credentials (the probe did read: its
    own environment holds its trial token)."""
    text = json.dumps(report)
    for name, value in found.items():
        assert value not in text, f"the trial found the {name}"
    own = report["environments"]["read"]
    assert any("CAIRN_TOKEN=trial:" in env for env in own.values()), "the walk read nothing"
    assert str(report["pid"]) in own


async def test_trials_find_no_credential_signal_no_service_and_read_no_other_users_files(
    embedded: Embedded, users: Users
) -> None:
    """user-a's trial runs unprivileged as its own assigned uid; it and user-b's trial (linked
    to uid 4242) walk every /proc/*/environ and the data directory and find no credential, their
    SIGTERMs to every service fail with EPERM (each service keeps its pid), and user-b's trial can
    neither list nor read user-a's checkpoint or work directory while user-a's trial runs."""
    await users.admin.ok(
        "PUT",
        "/users/user-b/agent-user-group",
        {"agent_uid": LINKED_UID, "agent_gid": LINKED_GID, "agent_user": "bee"},
    )
    before = embedded.service_pids()
    victims = sorted(before.values())
    trial_a = await submit(
        users.a, probe_config(data_dir=str(embedded.home), victims=victims, hold=True)
    )
    report_a = await report_of(users.a, trial_a)
    uid_a, gid_a = check_unprivileged(report_a)
    assert uid_a in ASSIGNED_UIDS and gid_a == uid_a
    assert report_a["user"] == "user-a"
    check_found_no_credential(report_a, embedded.secrets())
    assert set(report_a["signals"].values()) == {"PermissionError"}, report_a["signals"]

    checkpoint_a = Path(report_a["checkpoint"])
    targets = [
        str(checkpoint_a),
        str(checkpoint_a / "secret.txt"),
        str(checkpoint_a.parent),
        report_a["cwd"],
        str(Path(report_a["cwd"]) / "secret-work.txt"),
        report_a["home"],
        report_a["tmpdir"],
    ]
    trial_b = await submit(
        users.b,
        probe_config(
            data_dir=str(embedded.home), victims=[*victims, report_a["pid"]], targets=targets
        ),
    )
    report_b = await report_of(users.b, trial_b)
    assert check_unprivileged(report_b) == (LINKED_UID, LINKED_GID)
    assert report_b["user"] == "bee"
    check_found_no_credential(report_b, embedded.secrets())
    assert set(report_b["signals"].values()) == {"PermissionError"}, report_b["signals"]
    refused = {"PermissionError", "FileNotFoundError"}
    assert set(report_b["attempts"].values()) <= refused, report_b["attempts"]
    read_b = report_b["data_dir"]["files"]
    assert not any(f"only {uid_a} " in text for text in read_b.values()), sorted(read_b)
    assert not any(p.startswith((report_a["cwd"], str(checkpoint_a))) for p in read_b)

    # user-a's files carry user-a's identity and are private to it; user-b's carry the linked one.
    owners = owner_and_mode(
        checkpoint_a / "secret.txt", checkpoint_a, Path(report_b["checkpoint"]) / "secret.txt"
    )
    assert owners[0] == (uid_a, gid_a, 0o600) and owners[1] == (uid_a, gid_a, 0o700)
    assert owners[2][:2] == (LINKED_UID, LINKED_GID)

    (Path(report_a["cwd"]) / "release").touch()
    assert await ended(users.a, trial_a) == "COMPLETED"
    assert await ended(users.b, trial_b) == "COMPLETED"
    assert embedded.service_pids() == before
    assert all(psutil.pid_exists(pid) for pid in before.values())


async def test_only_an_admin_links_a_user_and_never_to_root(users: Users) -> None:
    """A non-admin cannot link anyone (403, themself included); the admin cannot link to uid or
    gid 0 or into the range cairn assigns (400 naming the field); the user reads their own link."""
    body = {"agent_uid": 1234, "agent_gid": 1234}
    for target in ("user-a", "user-b"):
        status, data = await users.a.call("PUT", f"/users/{target}/agent-user-group", body)
        assert status == 403, data
    for field, value in (("agent_uid", 0), ("agent_gid", 0), ("agent_uid", ASSIGNED_UIDS[5])):
        status, data = await users.admin.call(
            "PUT", "/users/user-a/agent-user-group", {**body, field: value}
        )
        assert status == 400 and data["error"]["path"] == field, data
    status, data = await users.admin.call("PUT", "/users/nobody-here/agent-user-group", body)
    assert status == 404, data
    status, data = await users.b.call("GET", "/users/user-a/agent-user-group")
    assert status == 403, data
    mine = await users.a.ok("GET", "/users/user-a/agent-user-group")
    assert mine["linked"] is False


@pytest.mark.parametrize(
    ("part", "path", "named"),
    [
        (
            {"bind_mounts": [{"host_path": "/", "container_path": "/host"}]},
            "bind_mounts[0].host_path",
            "/ is outside the allowed roots",
        ),
        (
            {"bind_mounts": [{"host_path": "/var/run/docker.sock", "container_path": "/d"}]},
            "bind_mounts[0].host_path",
            "/var/run/docker.sock is outside the allowed roots",
        ),
        (
            {"bind_mounts": [{"host_path": "/data/../var/run", "container_path": "/d"}]},
            "bind_mounts[0].host_path",
            "/data/../var/run (/var/run) is outside the allowed roots",
        ),
        (
            {"resources": {"devices": [{"host_path": "/dev/sda", "container_path": "/dev/x"}]}},
            "resources.devices[0].host_path",
            "/dev/sda is not an allowed device",
        ),
        (
            {"environment": {"add_capabilities": ["SYS_ADMIN"]}},
            "environment.add_capabilities[0]",
            "SYS_ADMIN is not an allowed capability",
        ),
    ],
)
async def test_host_paths_devices_and_capabilities_outside_the_allowances_are_400(
    users: Users, part: dict[str, Any], path: str, named: str
) -> None:
    """A config mounting /, the Docker socket (or a directory holding it), a device or a
    capability the cluster does not allow is refused at submission, naming the field."""
    config = {**probe_config(data_dir="/"), **part}
    code = base64.b64encode(code_tarball(PROBE)).decode()
    status, data = await users.a.call("POST", "/experiments", {"config": config, "code": code})
    assert status == 400, data
    assert data["error"]["path"] == path
    assert named in data["error"]["message"]
