"""A real HTTP receiver of webhook deliveries for tests (no tests here): an aiohttp server on
127.0.0.2 (a loopback address the tests' cluster config allows, unlike the API's 127.0.0.1).

Paths: ``/ok/<name>`` records each request and answers 200; ``/fail/<name>`` records and
answers 500; ``/hang/<name>`` records and never answers.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

HOST = "127.0.0.2"


@dataclass(frozen=True)
class Seen:
    """One request the receiver got."""

    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body decoded."""
        return json.loads(self.body)

    @property
    def delivery_id(self) -> str:
        """The delivery id header."""
        return self.headers.get("X-Cairn-Delivery", "")


def free_port(host: str = HOST) -> int:
    """A port free on ``host`` now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Receiver:
    """The server; ``seen[name]`` lists what ``/<kind>/<name>`` got, in arrival order."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.seen: dict[str, list[Seen]] = defaultdict(list)
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    def url(self, kind: str, name: str, host: str = HOST) -> str:
        """The URL of ``/<kind>/<name>`` (``host``: another name for the receiver)."""
        return f"http://{host}:{self.port}/{kind}/{name}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        kind, name = request.match_info["kind"], request.match_info["name"]
        self.seen[name].append(Seen(dict(request.headers), await request.read()))
        if kind == "hang":
            await self._release.wait()
        if kind == "fail":
            return web.Response(status=500, text="failing on purpose")
        return web.Response(text="ok")

    async def start(self) -> None:
        """Starts serving on ``HOST:port``."""
        app = web.Application()
        app.router.add_post("/{kind}/{name}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, HOST, self.port).start()

    async def stop(self) -> None:
        """Releases hanging requests and stops."""
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
