"""A small synchronous client for the cairn REST API, used by the CLI."""

from __future__ import annotations

import base64
import io
import json
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cairn.errors import CairnError

MAX_CODE_BYTES = 64 * 1024 * 1024


class ApiError(CairnError):
    """The API answered with an error (its message, and the config path when there is one)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def code_tarball(directory: Path) -> bytes:
    """The directory as a tar.gz (caches and checkpoints left out)."""
    skip = {"__pycache__", ".git", "checkpoints", ".cairn"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not skip.intersection(path.relative_to(directory).parts):
                tar.add(path, arcname=str(path.relative_to(directory)))
    data = buf.getvalue()
    if len(data) > MAX_CODE_BYTES:
        raise CairnError(f"{directory}: code is {len(data)} bytes packed; the limit is 64 MiB")
    return data


class Client:
    """Bearer-token JSON calls against ``<master>/api/v1``."""

    def __init__(self, master: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.master = master.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; raises :class:`ApiError` on a 4xx/5xx and CairnError when unreachable."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.master}/api/v1{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read()).get("error", {})
            except ValueError:
                err = {}
            message = err.get("message") or exc.reason
            if err.get("path"):
                message = f"{err['path']}: {message}"
            raise ApiError(exc.code, str(message)) from None
        except (urllib.error.URLError, OSError) as exc:
            raise CairnError(f"cannot reach the cairn API at {self.master}: {exc}") from None
        return json.loads(raw) if raw else None

    def login(self, username: str, password: str) -> str:
        """Logs in and keeps the token for later calls."""
        self.token = str(
            self.call("POST", "/auth/login", {"username": username, "password": password})["token"]
        )
        return self.token

    def create_experiment(
        self, config: str | dict[str, Any], code_dir: Path, *, activate: bool = True
    ) -> int:
        """Submits a config (YAML text or a mapping) with the code directory; returns the id."""
        code = base64.b64encode(code_tarball(code_dir)).decode()
        data = self.call(
            "POST", "/experiments", {"config": config, "code": code, "activate": activate}
        )
        return int(data["id"])
