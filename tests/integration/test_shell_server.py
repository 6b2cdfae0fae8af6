"""The shell server as the agent runs it (``python -m cairn.tasks.shell_server``, a real process with
real ptys), without a cluster: no token no start, the session cap, and what becomes of the
shells when the server is stopped or killed -9 (they are hung up, never left behind)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from cairn.tasks import SERVE_TOKEN_VARIABLE
from cairn.tasks.shell_server import MAX_SESSIONS
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "0123456789abcdef" * 4
PREFIX = "/proxy/00000000000000aa/"
AUTH = {"Authorization": f"token {TOKEN}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_argv(port: int, work: Path) -> list[str]:
    return [
        sys.executable, "-m", "cairn.tasks.shell_server", "--address=127.0.0.1", f"--port={port}",
        f"--prefix={PREFIX}", f"--work={work}",
    ]  # fmt: skip


class Server:
    """A running server: its process and base URL."""

    def __init__(self, proc: asyncio.subprocess.Process, base: str) -> None:
        self.proc = proc
        self.base = base


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    """A server on a free port with the token in its environment, serving once it answers."""
    port = free_port()
    home = tmp_path / "home"  # as the agent gives a task: a home of its own, no login profile
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT), SERVE_TOKEN_VARIABLE: TOKEN}
    proc = await asyncio.create_subprocess_exec(
        *server_argv(port, tmp_path), env=env, stdout=subprocess.DEVNULL
    )
    running = Server(proc, f"http://127.0.0.1:{port}{PREFIX}")
    async with aiohttp.ClientSession() as http:

        async def answers() -> bool:
            assert proc.returncode is None, "the server exited"
            try:
                async with http.get(running.base + "api/status", headers=AUTH) as answer:
                    return answer.status == 200
            except aiohttp.ClientConnectionError:
                return False

        await wait_until(answers, timeout=30)
    try:
        yield running
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def shell_pid(ws: aiohttp.ClientWebSocketResponse) -> int:
    """Asks the session's shell for its pid."""
    await ws.send_bytes(b"echo pid-$$-$((40+2))\n")
    out = b""
    while (found := re.search(rb"pid-(\d+)-42", out)) is None:
        try:
            message = await ws.receive(timeout=30)
        except TimeoutError:
            raise AssertionError(f"no pid in {out!r}") from None
        assert message.type == aiohttp.WSMsgType.BINARY, message
        out += message.data
    return int(found.group(1))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_server_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    """With no token in its environment the server exits 2 saying so, serving nothing."""
    env = {k: v for k, v in os.environ.items() if k != SERVE_TOKEN_VARIABLE}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        server_argv(free_port(), tmp_path), env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and SERVE_TOKEN_VARIABLE in done.stderr


async def test_sessions_beyond_the_cap_are_refused_until_one_closes(server: Server) -> None:
    """MAX_SESSIONS sessions open at once; one more is refused 429; once one closes, a new one
    opens; a wrong token is 403 whatever the path."""
    async with aiohttp.ClientSession() as http:
        for path in ("api/status", "terminal", "nowhere"):
            async with http.get(server.base + path, headers={"Authorization": "token x"}) as a:
                assert a.status == 403
        sockets = [
            await http.ws_connect(server.base + "terminal", headers=AUTH)
            for _ in range(MAX_SESSIONS)
        ]
        async with http.get(server.base + "api/status", headers=AUTH) as answer:
            assert (await answer.json())["connections"] == MAX_SESSIONS
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(server.base + "terminal", headers=AUTH)
        assert refused.value.status == 429
        first = await shell_pid(sockets[0])
        await sockets[0].close()
        await wait_until(lambda: gone(first), timeout=30)

        async def reopened() -> aiohttp.ClientWebSocketResponse | None:
            try:
                return await http.ws_connect(server.base + "terminal", headers=AUTH)
            except aiohttp.WSServerHandshakeError as exc:
                assert exc.status == 429
                return None

        sockets[0] = await wait_until(reopened, timeout=30)
        await shell_pid(sockets[0])
        for ws in sockets:
            await ws.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
async def test_a_stopped_or_killed_server_leaves_no_shell_behind(
    server: Server, signum: int
) -> None:
    """A session runs a long sleep; SIGTERM (the agent's kill) or SIGKILL of the server ends
    the shell and its sleep (the pty hangs up), and the client sees its socket close."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(server.base + "terminal", headers=AUTH)
        pid = await shell_pid(ws)
        await ws.send_bytes(b"sleep 765432\n")

        def sleeper() -> list[psutil.Process]:
            return [p for p in psutil.Process(pid).children() if p.cmdline() == ["sleep", "765432"]]

        (sleep,) = await wait_until(sleeper, timeout=30)
        server.proc.send_signal(signum)
        code = await asyncio.wait_for(server.proc.wait(), 30)
        assert code == (0 if signum == signal.SIGTERM else -signal.SIGKILL)
        await wait_until(lambda: gone(pid) and gone(sleep.pid), timeout=30)
        message = await ws.receive(timeout=30)
        while message.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
            if message.type == aiohttp.WSMsgType.TEXT:
                assert "exit" in json.loads(message.data)
            message = await ws.receive(timeout=30)
        assert message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        await ws.close()
