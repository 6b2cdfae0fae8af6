"""The lab suite's handle on the compose cluster: its settings, the CLI and REST API against it,
its containers, the secrets on disk, and the bus probe run inside its network."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "deploy" / "compose" / "quickstart.sh"
PROJECT = os.environ.get("CAIRN_LAB_PROJECT", "cairnlab")
BUS_PROBE = Path(__file__).with_name("bus_probe.py")
NATS_SEED = re.compile(r"\bS[OAU][A-Z2-7]{50,}\b")
"""An NKEY seed (operator, account, user), as the bus's authority and credentials hold them."""


def env_file_values(path: Path) -> dict[str, str]:
    """``NAME=VALUE`` lines of an ``.env`` file."""
    pairs = (line.partition("=") for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, _, v in pairs}


@dataclass
class Lab:
    """The running compose cluster."""

    values: dict[str, str]
    """Its ``.env``."""
    home: Path
    """The CLI's home (its login)."""

    @classmethod
    def from_env_file(cls, path: Path, *, home: Path) -> Lab:
        """The cluster ``path`` (``deploy/compose/.env``) describes."""
        return cls(env_file_values(path), home)

    @property
    def url(self) -> str:
        """The API's URL on this host."""
        return f"http://127.0.0.1:{self.values['CAIRN_API_PORT']}"

    @property
    def secrets_dir(self) -> Path:
        """The directory of the cluster's secret files."""
        return Path(self.values["CAIRN_SECRETS_DIR"])

    @property
    def admin_password(self) -> str:
        """The initial admin's password (the operator's copy)."""
        return (self.secrets_dir / "admin.password").read_text().strip()

    @property
    def network(self) -> str:
        """The compose network's name."""
        return f"{PROJECT}_default"

    def run_cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Runs ``cairn --json ARGS`` against the cluster."""
        env = {**os.environ, "CAIRN_HOME": str(self.home), "CAIRN_MASTER": self.url}
        return subprocess.run(
            [sys.executable, "-m", "cairn.cli", "--json", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )

    def cli(self, *args: str, timeout: float = 120) -> Any:
        """Runs ``cairn --json ARGS``, which must succeed; returns its JSON output."""
        out = self.run_cli(*args, timeout=timeout)
        assert out.returncode == 0, f"cairn {' '.join(args)}: exit {out.returncode}: {out.stderr}"
        return json.loads(out.stdout) if out.stdout.strip() else None

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One REST call as the admin: its status and JSON answer."""
        headers = {"Content-Type": "application/json", **self.auth_headers()}
        request = urllib.request.Request(
            f"{self.url}/api/v1{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers=headers,
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def auth_headers(self) -> dict[str, str]:
        """A fresh login of the admin, as an ``Authorization`` header."""
        body = json.dumps({"username": "admin", "password": self.admin_password}).encode()
        request = urllib.request.Request(
            f"{self.url}/api/v1/auth/login",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            return {"Authorization": f"Bearer {json.loads(resp.read())['token']}"}

    def containers(self, engine: Any, service: str | None = None) -> list[Any]:
        """The project's containers (of ``service`` only, when given), stopped ones included."""
        labels = [f"com.docker.compose.project={PROJECT}"]
        if service is not None:
            labels.append(f"com.docker.compose.service={service}")
        found: list[Any] = engine.containers.list(all=True, filters={"label": labels})
        return found

    def secret_values(self, engine: Any) -> dict[str, str]:
        """Every credential of the cluster: passwords and tokens on disk, the bus's keys and
        users' seeds, and each agent's own API token and NATS seed (from its volume)."""
        found: dict[str, str] = {}
        for path in self.secrets_dir.rglob("*"):
            if not path.is_file():
                continue
            text = path.read_text()
            name = str(path.relative_to(self.secrets_dir))
            if path.name in ("password", "db.password", "admin.password", "join.token"):
                found[name] = text.strip()
            for n, seed in enumerate(NATS_SEED.findall(text)):
                found[f"{name} seed #{n}"] = seed
        for agent in ("agent-1", "agent-2"):
            (container,) = self.containers(engine, agent)
            for file in ("credential.json", "nats.creds"):
                code, out = container.exec_run(["cat", f"/var/lib/cairn-agent/{file}"])
                assert code == 0, out
                text = out.decode()
                if file == "credential.json":
                    found[f"{agent} token"] = json.loads(text)["token"]
                for n, seed in enumerate(NATS_SEED.findall(text)):
                    found[f"{agent} {file} seed #{n}"] = seed
        return found

    def bus_probe(self, where: list[str], *args: str) -> dict[str, Any]:
        """Runs :mod:`tests.lab.bus_probe` with ``args`` through the ``docker`` command line
        ``where`` (``docker exec -i C`` or ``docker run --rm -i ...``); returns its report."""
        done = subprocess.run(
            [*where, "python", "-", *args],
            input=BUS_PROBE.read_text(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"bus probe {args}: {done.stdout}\n{done.stderr}"
        report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return report

    def in_network(self, *mounts: str) -> list[str]:
        """A throwaway container of the services image on the compose network."""
        volumes = [flag for mount in mounts for flag in ("-v", mount)]
        return [
            "docker", "run", "--rm", "-i", "--network", self.network, *volumes,
            self.values["CAIRN_SERVICES_IMAGE"],
        ]  # fmt: skip
