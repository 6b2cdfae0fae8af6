"""Bridges this terminal to a shell session on the cluster, through the API's proxy.

One call of :func:`attach` is one session (one login shell on the task's server): stdin's bytes
go to the remote pty, what it prints comes to stdout, and the call returns the remote shell's
exit code. When stdin is a terminal it is put in raw mode for the session (Ctrl-C, Ctrl-Z and
Ctrl-D travel as bytes to the remote pty, where they act on the remote foreground program), the
window size is sent at the start and on every SIGWINCH, and the terminal's settings are restored
on any way out. When stdin is not a terminal (a pipe, a file), its bytes are sent as they come
and, once it ends, a last line ``exit`` (the remote shell then exits with the status of the last
command, as a script would; a program still reading the terminal reads that line instead), so
``printf 'make test\\n' | cairn shell open ID`` exits with ``make test``'s status. A session
whose connection breaks off before the shell exited returns :data:`LOST_EXIT_CODE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import termios
import threading
import tty
from collections.abc import AsyncIterator, Iterator

import aiohttp

from cairn.client import ApiError
from cairn.errors import UnreachableError
from cairn.tasks.shell_protocol import (
    TERMINAL_PATH,
    ControlError,
    parse_exit,
    resize_message,
)

LOST_EXIT_CODE = 255
"""What a session returns when its connection broke off before the shell exited (as ssh)."""

READ_CHUNK = 16 * 1024
MAX_FRAME = 32 * 1024 * 1024
"""The largest frame accepted from the proxy (its own limit)."""

INPUT_QUEUE_CHUNKS = 64

END_OF_INPUT = b"exit\n"
"""Sent once a stdin that is not a terminal ends (see the module's docstring)."""


def terminal_url(master: str, task_id: str) -> str:
    """The session's WebSocket address through the API's proxy."""
    return f"{master.rstrip('/')}/proxy/{task_id}/{TERMINAL_PATH}"


@contextlib.contextmanager
def raw_terminal(fd: int) -> Iterator[None]:
    """Puts the terminal on ``fd`` in raw mode and restores its settings on the way out."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def attach(master: str, token: str | None, task_id: str) -> int:
    """Runs one session of shell ``task_id`` on this process's stdin and stdout; returns the
    remote shell's exit code (:data:`LOST_EXIT_CODE` when the connection broke off).

    Raises:
        ApiError: the proxy refused the session (its status: 403, 404, 410, 502).
        UnreachableError: the API did not answer.
    """
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout.flush()
    return asyncio.run(_session(terminal_url(master, task_id), token, stdin=stdin, stdout=stdout))


async def _session(url: str, token: str | None, *, stdin: int, stdout: int) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=None, connect=30)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        try:
            ws = await http.ws_connect(url, headers=headers, max_msg_size=MAX_FRAME, heartbeat=30)
        except aiohttp.WSServerHandshakeError as exc:
            message = f"the proxy refused the session at {url}: {exc.message}"
            raise ApiError(exc.status, message) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UnreachableError(f"cannot open {url}: {exc}") from None
        async with ws:
            interactive = os.isatty(stdin)
            with raw_terminal(stdin) if interactive else contextlib.nullcontext():
                code = await _bridge(ws, stdin=stdin, stdout=stdout, interactive=interactive)
    if code is None:
        print(f"\nthe connection to {url} broke off", file=sys.stderr)
        return LOST_EXIT_CODE
    return code


async def _bridge(
    ws: aiohttp.ClientWebSocketResponse, *, stdin: int, stdout: int, interactive: bool
) -> int | None:
    """Pumps stdin to ``ws`` and ``ws`` to stdout until the session ends; the remote shell's
    exit code, or ``None`` when the socket closed without one. SIGTERM or SIGHUP closes the
    session (the remote shell is hung up) and returns ``128 + signal``."""
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[int | None] = loop.create_future()

    def stop(signum: int) -> None:
        if not stopped.done():
            stopped.set_result(128 + signum)

    handled = [signal.SIGTERM, signal.SIGHUP]
    for signum in handled:
        loop.add_signal_handler(signum, stop, signum)
    if interactive:
        await _send_size(ws, stdin)
        loop.add_signal_handler(signal.SIGWINCH, lambda: loop.create_task(_send_size(ws, stdin)))
        handled.append(signal.SIGWINCH)
    sending = asyncio.create_task(_send_input(ws, stdin, interactive=interactive))
    receiving = asyncio.create_task(_receive_output(ws, stdout))
    try:
        await asyncio.wait([receiving, stopped], return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():
            return stopped.result()
        return receiving.result()
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
        for task in (sending, receiving):
            task.cancel()
        await asyncio.gather(sending, receiving, return_exceptions=True)


async def _send_size(ws: aiohttp.ClientWebSocketResponse, fd: int) -> None:
    try:
        size = os.get_terminal_size(fd)
        await ws.send_str(resize_message(max(size.lines, 1), max(size.columns, 1)))
    except (OSError, ConnectionError, aiohttp.ClientError):
        pass  # no size to tell, or the session is ending


async def _receive_output(ws: aiohttp.ClientWebSocketResponse, stdout: int) -> int | None:
    code: int | None = None
    async for message in ws:
        if message.type == aiohttp.WSMsgType.BINARY:
            _write_all(stdout, message.data)
        elif message.type == aiohttp.WSMsgType.TEXT:
            with contextlib.suppress(ControlError):
                code = parse_exit(message.data)
        else:
            break
    return code


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def _send_input(ws: aiohttp.ClientWebSocketResponse, fd: int, *, interactive: bool) -> None:
    """Sends stdin's bytes as they come; at its end, :data:`END_OF_INPUT` (not a terminal) or
    nothing more (a terminal that hung up: the session ends with this process)."""
    last = b"\n"
    async for chunk in _chunks(fd):
        await ws.send_bytes(chunk)
        last = chunk[-1:]
    if not interactive:
        await ws.send_bytes(END_OF_INPUT if last == b"\n" else b"\n" + END_OF_INPUT)


async def _chunks(fd: int) -> AsyncIterator[bytes]:
    """``fd``'s bytes as they come, until its end: watched by the event loop where it can be
    (a terminal, a pipe, a socket), else (a file, ``/dev/null``) read by a daemon thread, which
    never keeps this process alive. Reading pauses while :data:`INPUT_QUEUE_CHUNKS` wait."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    watched = False

    def readable() -> None:
        try:
            data = os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        queue.put_nowait(data)
        if not data or queue.qsize() >= INPUT_QUEUE_CHUNKS:
            loop.remove_reader(fd)

    def read_blocking() -> None:
        with contextlib.suppress(RuntimeError, OSError):  # the loop closed: the session ended
            while True:
                data = os.read(fd, READ_CHUNK)
                asyncio.run_coroutine_threadsafe(queue.put(data), loop).result()
                if not data:
                    return

    try:
        loop.add_reader(fd, readable)
        watched = True
    except OSError:  # epoll refuses regular files and /dev/null
        threading.Thread(target=read_blocking, name="stdin", daemon=True).start()
    try:
        while data := await queue.get():
            yield data
            if watched and queue.qsize() == 0:
                loop.add_reader(fd, readable)
    finally:
        if watched:
            loop.remove_reader(fd)
