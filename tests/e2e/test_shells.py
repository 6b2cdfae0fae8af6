"""``cairn shell`` end to end on an embedded cluster: cairn's terminal server started by the
agent, a login shell driven over the proxied WebSocket (output, resize, Ctrl-C, exit codes,
reattaching), other users and direct connections refused, the CLI bridging a pipe and a real
terminal, and an idle shell ended by its idle_timeout."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import psutil
import pytest

from cairn.tasks.shell_protocol import MAX_INPUT_FRAME, resize_message
from tests.e2e.test_cli import ROOT, Env, as_user, embedded_cluster, ok
from tests.helpers import wait_until, wait_until_sync

PASSWORD = "pw-sam-12"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster (one CPU slot; the shells hold none) with users sam and mallory."""
    with embedded_cluster("cairn-sh-") as env:
        ok(env, "user", "create", "sam", "--password", PASSWORD)
        ok(env, "user", "create", "mallory", "--password", "pw-mallory")
        yield env


def as_sam(env: Env, *args: str) -> Any:
    """Runs the CLI as sam and requires exit 0."""
    done = as_user(env, env.shared / "sam", "sam", PASSWORD, *args)
    assert done.returncode == 0, f"{args} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def start_shell(env: Env, *config: str) -> str:
    """Starts a zero-slot shell as sam (``-d``) with a context holding ``data.txt``; waits until
    it serves and returns its id."""
    context = env.shared / f"ctx-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    (context / "data.txt").write_text("shards: 42\n")
    overrides = [a for c in ("resources.slots=0", *config) for a in ("--config", c)]
    started = as_sam(env, "--json", "shell", "start", "-d", "--context", str(context), *overrides)
    task = json.loads(started.stdout)
    assert task["kind"] == "shell" and task["proxy_path"] == f"/proxy/{task['id']}/"

    def ready() -> bool:
        shown = json.loads(as_sam(env, "--json", "cmd", "describe", task["id"]).stdout)
        assert shown["state"] != "TERMINATED", shown
        return bool(shown["ready"])

    wait_until_sync(ready, timeout=90)
    return str(task["id"])


def server_address(task_id: str) -> str:
    """``http://address:port`` the shell server of ``task_id`` listens on (from its command
    line, as a process on the agent's host finds it)."""
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if f"--prefix=/proxy/{task_id}/" in argv:
            flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            return f"http://{flags['address']}:{flags['port']}"
    raise AssertionError(f"no server process of task {task_id}")


async def login(http: aiohttp.ClientSession, env: Env, user: str, password: str) -> str:
    async with http.post(
        f"{env.api_url}/api/v1/auth/login", json={"username": user, "password": password}
    ) as answer:
        assert answer.status == 200
        return str((await answer.json())["token"])


class Terminal:
    """One session: what the pty printed so far, and the exit code once the server sent it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.out = b""
        self.exit: int | None = None
        self.closed = False

    async def type(self, text: str) -> None:
        await self.ws.send_bytes(text.encode())

    async def expect(self, pattern: str, timeout: float = 30) -> re.Match[bytes]:
        """Waits until the output (since the last match) matches ``pattern``; returns it."""
        regex = re.compile(pattern.encode())
        try:
            async with asyncio.timeout(timeout):
                while (found := regex.search(self.out)) is None:
                    await self._receive()
        except TimeoutError:
            raise AssertionError(f"no {pattern!r} in {self.out[-1000:]!r}") from None
        self.out = self.out[found.end() :]
        return found

    async def until_closed(self, timeout: float = 30) -> None:
        async with asyncio.timeout(timeout):
            while not self.closed:
                await self._receive()

    async def _receive(self) -> None:
        assert not self.closed, f"the session closed; it printed {self.out[-500:]!r}"
        message = await self.ws.receive()
        if message.type == aiohttp.WSMsgType.BINARY:
            self.out += message.data
        elif message.type == aiohttp.WSMsgType.TEXT:
            self.exit = json.loads(message.data)["exit"]
        else:
            self.closed = True


def processes(*cmdline: str) -> list[psutil.Process]:
    """Live processes whose command line is exactly ``cmdline``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["cmdline"] == list(cmdline) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


async def test_a_shell_session_through_the_proxy_runs_resizes_interrupts_exits_and_reattaches(
    cluster: Env,
) -> None:
    """The owner's session runs in the context dir without the serving token in its
    environment; a resize changes `stty size`; malformed control messages are ignored; Ctrl-C
    ends a running sleep (the process is gone) and the prompt answers again; `exit 3` sends
    {"exit": 3} and closes; a new session works after that, and closing it hangs its shell up;
    status counts the open session; a killed shell answers 410."""
    task_id = start_shell(cluster)
    base = f"{cluster.api_url}/proxy/{task_id}/"
    async with aiohttp.ClientSession() as http:
        bearer = {"Authorization": f"Bearer {await login(http, cluster, 'sam', PASSWORD)}"}
        async with http.get(base + "api/status", headers=bearer) as answer:
            status = await answer.json()
            assert answer.status == 200 and status["connections"] == 0, status

        async with http.ws_connect(base + "terminal", headers=bearer) as ws:
            term = Terminal(ws)
            await term.type("cat data.txt; echo token-${CAIRN_SERVE_TOKEN:-none}-$((6*7))\n")
            await term.expect(r"shards: 42")
            await term.expect(r"token-none-42")
            async with http.get(base + "api/status", headers=bearer) as answer:
                assert (await answer.json())["connections"] == 1

            await ws.send_str(resize_message(33, 101))
            for junk in ("{", '{"resize": [0, 80]}', '{"resize": "x"}', "x" * 100_000):
                await ws.send_str(junk)  # each ignored: the session goes on
            await term.type("stty size\n")
            await term.expect(r"(?<![0-9])33 101\r\n")

            await term.type("sleep 987654\n")
            (sleeper,) = await wait_until(lambda: processes("sleep", "987654"), 30, 0.2)
            await term.type("\x03")
            await wait_until(lambda: not sleeper.is_running(), timeout=30)
            await term.type("echo back-$((2+2))\n")
            await term.expect(r"back-4")

            await term.type("exit 3\n")
            await term.until_closed()
            assert term.exit == 3 and ws.close_code == aiohttp.WSCloseCode.OK

        async with http.ws_connect(base + "terminal", headers=bearer) as ws:
            term = Terminal(ws)
            await term.type("echo again-$((5*5)) pid-$$\n")
            found = await term.expect(r"again-25 pid-(\d+)")
            shell = psutil.Process(int(found.group(1)))
        # The client left first: the shell is hung up (never left behind).
        await wait_until(
            lambda: not shell.is_running() or shell.status() == psutil.STATUS_ZOMBIE, timeout=30
        )

        async def idle_again() -> bool:
            async with http.get(base + "api/status", headers=bearer) as answer:
                return bool((await answer.json())["connections"] == 0)

        await wait_until(idle_again, timeout=30)

        async with http.ws_connect(base + "terminal", headers=bearer) as ws:
            # A frame over the server's limit closes the socket (1009); the server goes on.
            await ws.send_bytes(b"x" * (MAX_INPUT_FRAME + 1))
            await Terminal(ws).until_closed()
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        async with http.get(base + "api/status", headers=bearer) as answer:
            assert answer.status == 200

        ok(cluster, "shell", "kill", task_id)

        async def gone() -> bool:
            async with http.get(base + "api/status", headers=bearer) as answer:
                return answer.status == 410

        await wait_until(gone, timeout=30)


async def test_only_the_owner_through_the_proxy_reaches_a_shell(cluster: Env) -> None:
    """Another user gets 403 (HTTP and WebSocket), no session 401, an unknown task 404; a page
    of another site cannot open a terminal with the owner's session; the server's port reached
    directly refuses every request without the serving token, a cairn session included."""
    task_id = start_shell(cluster)
    base = f"{cluster.api_url}/proxy/{task_id}/"
    async with aiohttp.ClientSession() as http:
        bearer = {"Authorization": f"Bearer {await login(http, cluster, 'sam', PASSWORD)}"}
        other = {"Authorization": f"Bearer {await login(http, cluster, 'mallory', 'pw-mallory')}"}
        async with http.get(base + "api/status") as answer:
            assert answer.status == 401
        async with http.get(base + "api/status", headers=other) as answer:
            assert answer.status == 403
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(base + "terminal", headers=other)
        assert refused.value.status == 403
        async with http.get(
            f"{cluster.api_url}/proxy/00000000000000ff/api/status", headers=bearer
        ) as answer:
            assert answer.status == 404
        elsewhere = {**bearer, "Origin": "https://attacker.example"}
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(base + "terminal", headers=elsewhere)
        assert refused.value.status == 403
        same_site = {**bearer, "Origin": cluster.api_url}
        async with http.ws_connect(base + "terminal", headers=same_site) as ws:
            term = Terminal(ws)
            await term.type("exit 0\n")
            await term.until_closed()
            assert term.exit == 0

        direct = f"{server_address(task_id)}/proxy/{task_id}/"
        for headers in ({}, bearer, {"Authorization": "token wrong"}):
            async with http.get(direct + "api/status", headers=headers) as answer:
                assert answer.status == 403
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(direct + "terminal", headers=headers)
            assert refused.value.status == 403
    ok(cluster, "shell", "kill", task_id)


def cli_argv(env: Env, *args: str) -> tuple[list[str], dict[str, str]]:
    """``python -m cairn.cli -m API ARGS`` as sam, and its environment."""
    env_vars = {
        k: v for k, v in os.environ.items() if k not in ("CAIRN_HOME", "CAIRN_MASTER", "TERM")
    }
    env_vars.update(
        {
            "PYTHONPATH": str(ROOT),
            "CAIRN_HOME": str(env.shared / "sam"),
            "CAIRN_USER": "sam",
            "CAIRN_PASSWORD": PASSWORD,
        }
    )
    return [sys.executable, "-m", "cairn.cli", "-m", env.api_url, *args], env_vars


def test_shell_start_bridges_a_pipe_and_exits_with_the_remote_code(cluster: Env) -> None:
    """`cairn shell start` with a pipe for stdin runs what it reads and exits 7 with the remote
    `exit 7`; the shell keeps running (listed by `shell list`, `task list` and `job list`), and
    `shell open` with a stdin that just ends exits with the last command's status."""
    argv, env = cli_argv(cluster, "shell", "start", "--config", "resources.slots=0")
    done = subprocess.run(
        argv,
        input="echo piped-$((3*4)) in $(basename $PWD)\nexit 7\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 7, f"{done.stdout}\n{done.stderr}"
    assert "piped-12 in " in done.stdout
    launched = re.search(r"launched shell ([0-9a-f]+)", done.stderr)
    assert launched is not None, done.stderr
    task_id = launched.group(1)
    assert f"cairn shell open {task_id}" in done.stderr

    listed = json.loads(as_sam(cluster, "--json", "shell", "list").stdout)["tasks"]
    assert [t["state"] for t in listed if t["id"] == task_id] == ["RUNNING"]
    tasks = json.loads(as_sam(cluster, "--json", "task", "list").stdout)["tasks"]
    assert {"id": task_id, "kind": "shell"}.items() <= next(
        t for t in tasks if t["id"] == task_id
    ).items()
    assert task_id in as_sam(cluster, "task", "list").stdout
    jobs = json.loads(as_sam(cluster, "--json", "job", "list").stdout)["jobs"]
    assert [(j["kind"], j["slots"]) for j in jobs if j["job_id"] == task_id] == [("shell", 0)]

    argv, env = cli_argv(cluster, "shell", "open", task_id)
    reopened = subprocess.run(
        argv,
        input="false",  # no newline, no exit: the CLI ends the input with one
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert reopened.returncode == 1, f"{reopened.stdout}\n{reopened.stderr}"
    assert "exit" in reopened.stdout and "keeps running" in reopened.stderr
    killed = as_sam(cluster, "shell", "kill", task_id).stdout
    assert f"shell {task_id}: kill requested" in killed


def window(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


LOGIN_TTY = "import os,sys;os.login_tty(0);os.execvp(sys.argv[1],sys.argv[1:])"


def test_shell_open_on_a_terminal_goes_raw_forwards_ctrl_c_and_sigwinch_and_restores_it(
    cluster: Env,
) -> None:
    """`cairn shell open` on a real terminal (a pty whose controlling process it is) puts it in
    raw mode, so Ctrl-C reaches the remote sleep instead of the CLI; sends the window size at
    start and after SIGWINCH; exits 7 with `exit 7`; and leaves the terminal as it found it."""
    task_id = start_shell(cluster)
    master, slave = pty.openpty()
    window(slave, 40, 120)
    before = termios.tcgetattr(slave)
    argv, env = cli_argv(cluster, "shell", "open", task_id)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOGIN_TTY, *argv],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
    )  # fmt: skip
    output = bytearray()

    def read() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(master, 4096):
                output.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:

        def seen(pattern: str) -> re.Match[str] | None:
            return re.search(pattern, output.decode(errors="replace"))

        def raw() -> bool:
            return not termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ISIG)

        wait_until_sync(raw, timeout=60)
        os.write(master, b"stty size; echo size-$((1+1))\r")
        wait_until_sync(lambda: seen(r"40 120\r\nsize-2"), timeout=30)
        window(master, 50, 132)  # the kernel sends SIGWINCH to the CLI, its foreground process
        os.write(master, b"stty size; echo resized-$((1+2))\r")
        wait_until_sync(lambda: seen(r"50 132\r\nresized-3"), timeout=30)

        os.write(master, b"sleep 876543\r")
        (sleeper,) = wait_until_sync(lambda: processes("sleep", "876543"), 30, 0.2)
        os.write(master, b"\x03")
        wait_until_sync(lambda: not sleeper.is_running(), timeout=30)
        assert proc.poll() is None  # Ctrl-C interrupted the remote program, not the CLI
        os.write(master, b"exit 7\r")
        assert proc.wait(timeout=60) == 7, output.decode(errors="replace")
        assert termios.tcgetattr(slave) == before
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(slave)
        os.close(master)
    ok(cluster, "shell", "kill", task_id)


def test_idle_shell_is_killed_by_its_idle_timeout(cluster: Env) -> None:
    """A shell with idle_timeout 3s and no session is killed, and its exit says it was idle."""
    task_id = start_shell(cluster, "idle_timeout=3s")

    def ended() -> dict[str, Any] | None:
        shown = json.loads(as_sam(cluster, "--json", "cmd", "describe", task_id).stdout)
        return shown if shown["state"] == "TERMINATED" else None

    final = wait_until_sync(ended, timeout=60)
    assert final["outcome"] == "killed" and "idle_timeout 3s" in final["message"]


def test_an_unknown_or_other_kind_of_task_is_refused_by_shell_open(cluster: Env) -> None:
    """`shell open` of an unknown id exits 4; of a command exits 2 naming its kind."""
    argv, env = cli_argv(cluster, "shell", "open", "00000000000000ff")
    unknown = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert unknown.returncode == 4, unknown.stderr
    command = as_sam(cluster, "cmd", "run", "-d", "true").stdout.strip()
    argv, env = cli_argv(cluster, "shell", "open", command)
    other = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert other.returncode == 2 and "is a command, not a shell" in other.stderr


def test_a_shells_sessions_start_in_its_work_dir(cluster: Env) -> None:
    """`shell start --context DIR --config work_dir=src` opens its session in the context's
    `src` (a piped `pwd` and `ls` show it), and the context's other files are one level up."""
    context = cluster.shared / f"ctx-{uuid.uuid4().hex[:6]}"
    (context / "src").mkdir(parents=True)
    (context / "src" / "train.py").write_text("print('x')\n")
    (context / "data.txt").write_text("shards: 42\n")
    argv, env = cli_argv(
        cluster, "shell", "start", "--context", str(context),
        "--config", "resources.slots=0", "--config", "work_dir=src",
    )  # fmt: skip
    done = subprocess.run(
        argv,
        input="echo in=$(basename $PWD) has=$(ls) up=$(ls ..)\nexit 0\n",
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "in=src has=train.py up=data.txt src" in done.stdout
    task_id = re.search(r"launched shell ([0-9a-f]+)", done.stderr)
    assert task_id is not None, done.stderr
    ok(cluster, "shell", "kill", task_id.group(1))
