"""A shell task's process: terminal sessions on ptys, served behind the API's proxy.

The agent runs ``python -m cairn.tasks.shell_server --address A --port P --prefix /proxy/<id>/ --work
DIR`` as the task's process (confined, as the task's owner) with the task's serving token in
:data:`~cairn.tasks.SERVE_TOKEN_VARIABLE`. Invariants a change must keep:

- Every request must carry ``Authorization: token <t>`` with that token (only the API's proxy and
  the agent know it); anything else is answered 403 before a handler runs. The token is taken out
  of the environment at start, so no shell inherits it.
- A WebSocket whose ``Origin`` names another host than the request's is refused (a page of
  another site must not drive a terminal with a browser's cookie).
- One WebSocket is one session: a login shell on its own pty, in its own session with the pty as
  its controlling terminal, started in the work dir. When the shell exits, what it printed is
  sent, then ``{"exit": code}``, then the socket closes; when the socket closes first, the
  shell's process group is hung up (SIGHUP, SIGKILL after :data:`HANGUP_GRACE_SECONDS`).
- At most :data:`MAX_SESSIONS` sessions are open at once (another is refused with 429).
- The server outlives its sessions (a client reattaches with a new one) until it is stopped
  (SIGTERM or SIGINT: every session is hung up, then it exits 0). ``<prefix>api/status`` counts
  open sessions and the last input or output, which is what the agent's idle watch reads.
- It runs in the task's environment (a container of the trial image on a container cluster), so
  it imports only the core dependencies and the ``shell`` extra's (aiohttp), and logs with
  :mod:`logging`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hmac
import logging
import os
import pty
import shutil
import signal
import struct
import sys
import termios
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import WSMsgType, web

from cairn.tasks import SERVE_TOKEN_VARIABLE
from cairn.tasks.shell_protocol import (
    MAX_INPUT_FRAME,
    STATUS_PATH,
    TERMINAL_PATH,
    ControlError,
    exit_message,
    parse_control,
)

log = logging.getLogger("cairn.tasks.shell")

READ_CHUNK = 64 * 1024
OUTPUT_QUEUE_CHUNKS = 16
"""Chunks of output read ahead of the socket; past that the pty is not read until the socket
catches up (so a program that prints fast waits instead of filling the server's memory)."""

HANGUP_GRACE_SECONDS = 5.0
"""How long a hung-up shell has to exit before its process group is killed."""

DRAIN_SECONDS = 2.0
"""After the shell exited, how long its pty is read for what it printed last while a background
program still holds the pty open (the session then ends anyway)."""

DEFAULT_ROWS, DEFAULT_COLS = 24, 80

MAX_SESSIONS = 16
"""The most sessions open at once; another is refused (429) until one closes."""

_LOGIN_TTY = "import os,sys;os.login_tty(0);os.execvp(sys.argv[1],sys.argv[1:])"
"""Run between fork and the shell (a fresh interpreter, so nothing runs in a forked copy of this
threaded server): a new session whose controlling terminal is the pty on stdin."""


def shell_argv() -> list[str]:
    """A login shell: ``bash -l`` where there is bash, else ``sh -l``."""
    return [shutil.which("bash") or shutil.which("sh") or "/bin/sh", "-l"]


def exit_code_of(returncode: int) -> int:
    """A process's exit status as a shell reports it (``128 + N`` when signal N ended it)."""
    return 128 - returncode if returncode < 0 else returncode & 0xFF


class Activity:
    """Open sessions and the time of the last input or output of any (``api/status``)."""

    def __init__(self) -> None:
        self.connections = 0
        self.started = datetime.now(UTC)
        self.last = self.started

    def touch(self) -> None:
        """Records activity now."""
        self.last = datetime.now(UTC)

    def status(self) -> dict[str, object]:
        """The status document the agent's idle watch reads."""
        return {
            "connections": self.connections,
            "last_activity": self.last.isoformat(),
            "started": self.started.isoformat(),
        }


class PtySession:
    """One login shell on its own pty, bridged to one WebSocket.

    Args:
        master: the pty's master side (non-blocking; owned by the session).
        process: the shell.
        activity: where input and output are recorded.
    """

    def __init__(
        self, master: int, process: asyncio.subprocess.Process, activity: Activity
    ) -> None:
        self.master = master
        self.process = process
        self.activity = activity
        self._loop = asyncio.get_running_loop()
        self._output: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._reading = False
        self._eof = False
        self._ended = asyncio.Event()
        self._closed = False

    @classmethod
    async def start(cls, argv: list[str], *, work: Path, activity: Activity) -> PtySession:
        """Starts ``argv`` on a new pty in ``work``.

        Raises:
            OSError: no pty could be opened or the shell could not be started.
        """
        master, slave = pty.openpty()
        try:
            set_window_size(master, DEFAULT_ROWS, DEFAULT_COLS)
            env = {k: v for k, v in os.environ.items() if k != SERVE_TOKEN_VARIABLE}
            env["TERM"] = "xterm-256color"
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-I", "-S", "-c", _LOGIN_TTY, *argv,
                stdin=slave, stdout=slave, stderr=slave, cwd=work, env=env, close_fds=True,
            )  # fmt: skip
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        session = cls(master, process, activity)
        session._resume()
        return session

    def _resume(self) -> None:
        if not self._reading and not self._eof and not self._closed:
            self._loop.add_reader(self.master, self._readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.master)
            self._reading = False

    def _read_once(self) -> bool:
        """Reads what the pty holds into the queue; ``False`` once nothing is left now."""
        try:
            data = os.read(self.master, READ_CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""  # EIO: every process that had the pty open has closed it
        if not data:
            self._end_output()
            return False
        self.activity.touch()
        self._output.put_nowait(data)
        return True

    def _end_output(self) -> None:
        self._pause()
        if not self._eof:
            self._eof = True
            self._output.put_nowait(None)
            self._ended.set()

    def _readable(self) -> None:
        self._read_once()
        if self._output.qsize() >= OUTPUT_QUEUE_CHUNKS:
            self._pause()

    async def _send_output(self, ws: web.WebSocketResponse) -> None:
        """Sends what the pty prints until its end (or the shell's, see :meth:`_watch_exit`)."""
        while True:
            data = await self._output.get()
            if data is None:
                return
            await ws.send_bytes(data)
            if self._output.qsize() < OUTPUT_QUEUE_CHUNKS // 2:
                self._resume()

    async def _watch_exit(self) -> None:
        """Ends the output once the shell exited, even if a program it left in the background
        keeps the pty open: what the pty holds by :data:`DRAIN_SECONDS` later is still sent."""
        await self.process.wait()
        try:
            await asyncio.wait_for(self._ended.wait(), DRAIN_SECONDS)
        except TimeoutError:
            while self._read_once():
                pass
            self._end_output()

    async def _receive_input(self, ws: web.WebSocketResponse) -> None:
        """Writes the client's bytes to the pty and applies its control messages until the
        socket closes. A malformed control message is logged and ignored."""
        async for message in ws:
            if message.type == WSMsgType.BINARY:
                self.activity.touch()
                await self.write(message.data)
            elif message.type == WSMsgType.TEXT:
                try:
                    resize = parse_control(message.data)
                except ControlError as exc:
                    log.warning("control message ignored: %s", exc)
                    continue
                set_window_size(self.master, resize.rows, resize.cols)
            else:
                return

    async def write(self, data: bytes) -> None:
        """Writes all of ``data`` to the pty, waiting while its input buffer is full."""
        view = memoryview(data)
        while view and not self._closed:
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                ready = self._loop.create_future()
                self._loop.add_writer(self.master, ready.set_result, None)
                try:
                    await ready
                finally:
                    self._loop.remove_writer(self.master)
            except OSError:
                return  # the shell is gone; its exit ends the session

    async def run(self, ws: web.WebSocketResponse) -> int | None:
        """Bridges the pty and ``ws`` until either ends; returns the shell's exit code when it
        exited (after sending it), ``None`` when the client left first."""
        output = asyncio.create_task(self._send_output(ws))
        exit_watch = asyncio.create_task(self._watch_exit())
        receive = asyncio.create_task(self._receive_input(ws))
        try:
            await asyncio.wait({output, receive}, return_when=asyncio.FIRST_COMPLETED)
            if not output.done():
                return None
            output.result()
            code = exit_code_of(await self.process.wait())
            await ws.send_str(exit_message(code))
            return code
        except ConnectionError:
            return None  # the client vanished while output was sent
        finally:
            for task in (output, exit_watch, receive):
                task.cancel()
            await asyncio.gather(output, exit_watch, receive, return_exceptions=True)

    async def hang_up(self) -> None:
        """Closes the pty and ends the shell's process group: SIGHUP, then SIGKILL after
        :data:`HANGUP_GRACE_SECONDS`."""
        if self._closed:
            return
        self._pause()
        self._closed = True
        if self.process.returncode is None:
            signal_group(self.process.pid, signal.SIGHUP)
        os.close(self.master)  # the pty hangs up too: its foreground programs get SIGHUP
        try:
            await asyncio.wait_for(self.process.wait(), HANGUP_GRACE_SECONDS)
        except TimeoutError:
            signal_group(self.process.pid, signal.SIGKILL)
            await self.process.wait()
        signal_group(self.process.pid, signal.SIGHUP)  # what the shell left in its group


def signal_group(pgid: int, signum: int) -> None:
    """Sends ``signum`` to process group ``pgid``; nothing when it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def set_window_size(fd: int, rows: int, cols: int) -> None:
    """Sets the pty's window size (the kernel tells the foreground programs with SIGWINCH)."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _same_origin(request: web.Request) -> bool:
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (the CLI): the token alone decides
    return urlsplit(origin).netloc.lower() == request.host.lower()


def make_app(*, token: str, prefix: str, work: Path, argv: list[str]) -> web.Application:
    """The server's application: ``<prefix>api/status`` and ``<prefix>terminal`` behind the
    token check (see the module's invariants).

    Args:
        token: the serving token every request must carry.
        prefix: the path the task serves under (``/proxy/<task_id>/``).
        work: the directory each shell starts in.
        argv: the shell to start per session (:func:`shell_argv`).
    """
    activity = Activity()
    sessions: set[PtySession] = set()
    expected = f"token {token}".encode()

    @web.middleware
    async def require_token(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if not token or not hmac.compare_digest(given, expected):
            return web.json_response(
                {"error": "this shell answers only through the cluster's proxy"}, status=403
            )
        return await handler(request)

    async def status(request: web.Request) -> web.Response:
        return web.json_response(activity.status())

    async def hint(request: web.Request) -> web.Response:
        task_id = prefix.strip("/").rsplit("/", 1)[-1]
        return web.Response(text=f"a cairn shell: attach with `cairn shell open {task_id}`\n")

    async def terminal(request: web.Request) -> web.StreamResponse:
        if not _same_origin(request):
            return web.json_response(
                {"error": f"a terminal of {request.host} may not be opened from another site"},
                status=403,
            )
        if activity.connections >= MAX_SESSIONS:
            return web.json_response(
                {"error": f"{MAX_SESSIONS} sessions are open already; close one first"},
                status=429,
            )
        ws = web.WebSocketResponse(max_msg_size=MAX_INPUT_FRAME, autoping=True)
        activity.connections += 1  # counted from here: the cap holds while shells start
        activity.touch()
        try:
            await ws.prepare(request)
            try:
                session = await PtySession.start(argv, work=work, activity=activity)
            except OSError as exc:
                log.error("shell not started: %s", exc)
                await ws.close(code=1011, message=b"the shell could not be started")
                return ws
            sessions.add(session)
            log.info("session opened: shell pid %d", session.process.pid)
            try:
                code = await session.run(ws)
            finally:
                sessions.discard(session)
                await session.hang_up()
                await ws.close()
            log.info("session closed: shell pid %d exited %s", session.process.pid, code)
            return ws
        finally:
            activity.connections -= 1
            activity.touch()

    async def hang_up_all(app: web.Application) -> None:
        await asyncio.gather(*(s.hang_up() for s in list(sessions)), return_exceptions=True)

    app = web.Application(middlewares=[require_token])
    app.router.add_get(prefix, hint)
    app.router.add_get(prefix + STATUS_PATH, status)
    app.router.add_get(prefix + TERMINAL_PATH, terminal)
    app.on_shutdown.append(hang_up_all)
    return app


async def serve(*, address: str, port: int, app: web.Application) -> None:
    """Serves ``app`` on ``address``:``port`` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=HANGUP_GRACE_SECONDS)
    await runner.setup()
    try:
        await web.TCPSite(runner, address, port).start()
        log.info("shell server listening on %s:%d", address, port)
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Runs the server (see the module's docstring); exits 2 without a token."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m cairn.tasks.shell_server")
    parser.add_argument("--address", required=True, help="the address to listen on")
    parser.add_argument("--port", type=int, required=True, help="the port to listen on")
    parser.add_argument("--prefix", required=True, help="the path served under: /proxy/<id>/")
    parser.add_argument("--work", type=Path, default=Path.cwd(), help="where shells start")
    args = parser.parse_args(argv)
    token = os.environ.pop(SERVE_TOKEN_VARIABLE, "")
    if not token:
        print(
            f"{SERVE_TOKEN_VARIABLE} is not set: the server refuses to serve without one",
            file=sys.stderr,
        )
        return 2
    if not args.prefix.startswith("/") or not args.prefix.endswith("/"):
        parser.error(f"--prefix {args.prefix!r} must start and end with /")
    app = make_app(token=token, prefix=args.prefix, work=args.work, argv=shell_argv())
    asyncio.run(serve(address=args.address, port=args.port, app=app))
    return 0


if __name__ == "__main__":
    sys.exit(main())
