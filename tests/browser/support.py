"""Shared parts of the browser tests (no tests here): a real cluster of processes with the
tracker, a blocking API client, and Debian's Chromium driven by Playwright.

Chromium is ``/usr/bin/chromium`` (``make browser`` installs it); Playwright never downloads a
browser of its own here.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cairn.client import code_tarball
from cairn.local.processes import ProcessCluster
from cairn.local.servers import ServerProcess, start_nats
from tests.helpers import ROOT, create_database, wait_until_sync

CHROMIUM = Path(os.environ.get("CAIRN_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts" / "webui"
SCRIPTED = ROOT / "examples" / "scripted"


def launch_chromium(playwright: Any) -> Any:
    """Debian's Chromium, headless, with no network chatter of its own."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def require_browser() -> None:
    """Skips when the browser or Playwright is missing (``make test`` installs both)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing: run `make browser`")
    pytest.importorskip("playwright.sync_api")


@dataclass
class Http:
    """A blocking JSON client for the API (tests run Playwright's sync API, so no event loop)."""

    url: str
    token: str = ""

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        """Sends a request; returns the JSON answer; raises ``AssertionError`` on an error."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}/api/v1{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        bearer = self.token if token is None else token
        if bearer:
            request.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path} -> {exc.code}: {exc.read()[:500]!r}") from None

    def login(self, username: str, password: str) -> str:
        """Logs in (retrying while the gateway starts) and returns the token."""

        def token() -> str | None:
            try:
                body = {"username": username, "password": password}
                return str(self.call("POST", "/auth/login", body, "")["token"])
            except (AssertionError, urllib.error.URLError, ConnectionError):
                return None  # the gateway is still starting

        return str(wait_until_sync(token, timeout=60, every=0.2))

    def submit(self, config: dict[str, Any], code: Path = SCRIPTED) -> int:
        """Submits an experiment with ``code`` and activates it; returns its id."""
        import base64

        tarball = base64.b64encode(code_tarball(code)).decode()
        body = {"config": config, "code": tarball, "activate": True}
        return int(self.call("POST", "/experiments", body)["id"])


@dataclass
class LiveCluster:
    """The processes, their API and an admin client."""

    processes: ProcessCluster
    api: Http
    workdir: Path
    extra: dict[str, Any] = field(default_factory=dict)


def wait(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """:func:`~tests.helpers.wait_until_sync` naming ``what`` was waited for on a timeout."""
    return wait_until_sync(predicate, timeout, every=0.2, detail=lambda: f"waiting for {what}")


def start_cluster(
    pg_server: ServerProcess, workdir: Path, slots: int = 3, cluster_config: str = ""
) -> Iterator[LiveCluster]:
    """Relay, searcher, scheduler, tracker, API and one agent as processes on a fresh database
    and NATS server; yields once the admin is logged in, kills everything afterwards
    (``cluster_config``: YAML sections added to the cluster config the services read)."""
    workdir.mkdir(parents=True, exist_ok=True)
    nats = start_nats(workdir / "nats")
    cluster = ProcessCluster(create_database(pg_server, "web"), nats.url, workdir)
    cluster.allow_checkpoints_under(workdir)
    if cluster_config and cluster.cluster_config is not None:
        with cluster.cluster_config.open("a") as config:
            config.write(cluster_config)
    try:
        cluster.start_services("--agent-timeout", "15", timeout=60)
        cluster.start("tracker", "services.tracker")
        cluster.start_agent("agent-a", slots, "--heartbeat", "0.5")
        api = Http(cluster.api_url)
        api.token = api.login("admin", cluster.admin_password)
        yield LiveCluster(cluster, api, workdir)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
        nats.stop()
        shutil.rmtree(workdir / "nats", ignore_errors=True)
