"""A tiny blocking JSON-over-HTTP client (stdlib only) for the Core API's background threads."""

from __future__ import annotations

import json
from typing import Any


class HTTPStatusError(Exception):
    """The API answered with a non-2xx status."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status = status
        self.body = body

    @property
    def retryable(self) -> bool:
        """True for statuses worth retrying (server errors, throttling, timeouts)."""
        return self.status >= 500 or self.status in (408, 425, 429)


class Session:
    """Sends JSON requests to ``<master>/api/v1`` with the trial's bearer token."""

    def __init__(self, master_url: str, token: str) -> None:
        base = master_url.rstrip("/")
        self.base = base if base.endswith("/api/v1") else base + "/api/v1"
        self.token = token

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> Any:
        """Sends one request and returns the decoded JSON answer (``None`` when empty).

        Raises:
            HTTPStatusError: on a non-2xx answer.
            OSError: when the server cannot be reached.
        """
        import urllib.error
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace") if exc.fp is not None else ""
            raise HTTPStatusError(exc.code, text) from None
        return json.loads(raw) if raw.strip() else None
