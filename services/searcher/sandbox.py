"""The sandboxed process a custom searcher runs in, driven without blocking the event loop.

Invariants:

- A user's searcher code runs only in the process :meth:`Sandbox.start` starts
  (:mod:`services.searcher.custom_host`): as the unprivileged identity of
  :func:`services.confine.default_identity`, without a network, in a pid namespace of its own
  whose ``/proc`` shows only its own processes (none of the services' environments), with
  rlimits on address space, CPU time, open files, processes and file size, no core dumps and a
  lower CPU priority (all set by the host before it imports the user's module). Its environment
  holds what Python needs and nothing of the cluster's.
- It runs in a process group of its own. Each exchange has a wall-clock limit and a size limit;
  on either, on an exit, and on :meth:`Sandbox.close`, the whole group is SIGKILLed, and the
  pid namespace dies with its init, so a child that left the group dies too. If the service
  itself dies, the kernel kills the sandbox: the outer process and the namespace's init keep
  a parent-death signal (``setpriv --pdeathsig``, ``unshare --kill-child``).
- The code is unpacked into a fresh directory whose name cannot be guessed, under a root the
  identity may traverse but not list. The code is the service's and only readable by the
  identity; a private temporary directory (``HOME``, ``TMPDIR``) is all it may write.
- Reads of the process's output are bounded (``max_answer``); its stderr is discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic

from events.domain.archive import extract_tar
from events.domain.types import CustomSearcherOp
from events.log.limits import MAX_EVENT_BYTES
from events.log.storable import find_unstorable
from events.settings import CUSTOM_SEARCHER_TIMEOUT
from services.confine import Identity, confined_argv

_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV")
MAX_OP_DEPTH = 32
"""Deepest nesting of lists and mappings in an answer's operations."""
_READ_CHUNK = 64 * 1024
_EXIT_WAIT = 5.0


@dataclass(frozen=True)
class SandboxSettings:
    """Limits of a custom searcher's process.

    Attributes:
        call_timeout: Seconds one call may take (``CAIRN_CUSTOM_SEARCHER_TIMEOUT``).
        startup_timeout: Seconds the process may take to start and load the user's class.
        memory_bytes: Address space (``RLIMIT_AS``).
        cpu_seconds: CPU time of the process over its life (``RLIMIT_CPU``).
        open_files: Open file descriptors (``RLIMIT_NOFILE``).
        processes: Processes and threads of the identity (``RLIMIT_NPROC``).
        file_bytes: Largest file it may write (``RLIMIT_FSIZE``).
        niceness: How much lower than the service its CPU priority is.
        max_answer: Longest answer (bytes of JSON) to one call; it must fit in one event.
    """

    call_timeout: float = CUSTOM_SEARCHER_TIMEOUT.default
    startup_timeout: float = 60.0
    memory_bytes: int = 2 * 1024**3
    cpu_seconds: int = 3600
    open_files: int = 256
    processes: int = 64
    file_bytes: int = 64 * 1024**2
    niceness: int = 10
    max_answer: int = MAX_EVENT_BYTES * 3 // 4

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SandboxSettings:
        """The defaults, with ``call_timeout`` from ``CAIRN_CUSTOM_SEARCHER_TIMEOUT``.

        Args:
            environ: the environment to read (``os.environ`` by default).

        Raises:
            events.settings.SettingError: the variable is set but not a positive number.
        """
        return cls(call_timeout=CUSTOM_SEARCHER_TIMEOUT.get(environ))

    def limits(self) -> dict[str, int]:
        """The limits the host applies to itself before loading the user's code."""
        return {
            "as": self.memory_bytes,
            "cpu": self.cpu_seconds,
            "nofile": self.open_files,
            "nproc": self.processes,
            "fsize": self.file_bytes,
            "core": 0,
            "nice": self.niceness,
        }


class SandboxError(Exception):
    """A call got no usable answer; the message is the reason, naming the user's method
    (``initial_operations took more than 10 s``)."""


def checked_ops(raw: list[Any], hook: str) -> list[CustomSearcherOp]:
    """The operations of an answer, as a fact records them.

    Raises:
        SandboxError: an operation is not a create or stop, or holds what cannot be stored.
    """
    problem = find_unstorable(raw, max_depth=MAX_OP_DEPTH, finite=True)
    if problem is not None:
        path, why = problem
        where = ".".join(str(p) for p in path) or "the answer"
        raise SandboxError(f"{hook} answered what cannot be recorded ({where}: {why})")
    try:
        return [CustomSearcherOp.model_validate(op) for op in raw]
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise SandboxError(
            f"{hook} answered an operation that is not a create or stop ({first['msg']})"
        ) from None


def as_json(ops: list[CustomSearcherOp]) -> list[dict[str, Any]]:
    """Operations as a recorded fact's payload holds them."""
    return [op.model_dump(mode="json") for op in ops]


def code_root() -> Path:
    """A fresh directory for the sandboxes' code: the service's own, which other users may
    traverse (to reach a directory whose name they were given) but not list."""
    root = Path(tempfile.mkdtemp(prefix="cairn-searcher-"))
    root.chmod(0o711)
    return root


def sandbox_argv(code_dir: Path, settings: SandboxSettings, identity: Identity | None) -> list[str]:
    """The command line of a custom searcher's process (see the module's invariants)."""
    host = [
        sys.executable, "-P", "-s", "-B", "-m", "services.searcher.custom_host",
        "--limits", json.dumps(settings.limits()), str(code_dir),
    ]  # fmt: skip
    inner = confined_argv(host, identity=identity, network=False)
    if os.geteuid() == 0:
        # The namespace's init is a root process that forks the confined host and never changes
        # its credentials, so it keeps the parent-death signal its own parent set (a change of
        # uid, as the host's, clears it): if the service dies, the outer process is killed,
        # then the init, and with it every process of the namespace.
        pid_namespace = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--"]
        init = ["unshare", "--fork", "--kill-child", "--"]
        inner = [*pid_namespace, *init, *inner]
    return ["setpriv", "--pdeathsig", "KILL", "--", *inner]


def _unpack(code: bytes, workdir: Path, identity: Identity | None) -> tuple[Path, Path]:
    """Unpacks ``code`` into ``workdir/code`` (read-only for others) and makes the private
    ``workdir/tmp``; returns both."""
    workdir.mkdir(mode=0o755)
    code_dir = workdir / "code"
    extract_tar(code, code_dir)
    for top, dirs, files in os.walk(code_dir):
        os.chmod(top, 0o755)
        for name in files:
            path = os.path.join(top, name)
            if not os.path.islink(path):
                executable = os.stat(path).st_mode & 0o111
                os.chmod(path, 0o755 if executable else 0o644)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]
    tmp = workdir / "tmp"
    tmp.mkdir(mode=0o700)
    if identity is not None:
        os.chown(tmp, identity.uid, identity.gid)
    return code_dir, tmp


def _environment(tmp: Path) -> dict[str, str]:
    env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
    env.update(
        HOME=str(tmp),
        TMPDIR=str(tmp),
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONNOUSERSITE="1",
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return env


async def _spawn_host(argv: Sequence[str], tmp: Path) -> asyncio.subprocess.Process:
    """Starts the searcher's host process ``argv`` in ``tmp``, leading its own session: calls
    go to its stdin and answers come from its stdout; its stderr is dropped.

    Raises:
        OSError: the process cannot start.
    """
    return await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=tmp,
        env=_environment(tmp),
        start_new_session=True,
        limit=_READ_CHUNK,
    )


class Sandbox:
    """One running custom searcher process; see the module's invariants."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        workdir: Path,
        settings: SandboxSettings,
    ) -> None:
        self.proc = proc
        self.workdir = workdir
        self.settings = settings
        self._buffer = b""
        self._killed = False

    @classmethod
    async def start(
        cls,
        code: bytes,
        *,
        settings: SandboxSettings,
        identity: Identity | None,
        root: Path,
    ) -> Sandbox:
        """Unpacks ``code`` under ``root`` and starts the process (the user's class is loaded
        by the first call, ``init``).

        Raises:
            SandboxError: the code cannot be unpacked or the process cannot start.
        """
        workdir = root / secrets.token_hex(16)
        try:
            code_dir, tmp = await asyncio.to_thread(_unpack, code, workdir, identity)
            proc = await _spawn_host(sandbox_argv(code_dir, settings, identity), tmp)
        except Exception as exc:  # a tar error, a full disk, a missing setpriv: all final
            await asyncio.to_thread(shutil.rmtree, workdir, True)
            raise SandboxError(f"its process could not start ({exc})") from exc
        return cls(proc, workdir, settings)

    @classmethod
    async def local(cls, code_dir: Path, *, settings: SandboxSettings) -> Sandbox:
        """Starts the process on this machine's code directory, as the calling user and without
        confinement: for a user previewing their own searcher (``cairn preview-search``).

        Raises:
            SandboxError: the process cannot start.
        """
        tmp = Path(tempfile.mkdtemp(prefix="cairn-preview-"))
        host = [sys.executable, "-P", "-s", "-B", "-m", "services.searcher.custom_host"]
        try:
            proc = await _spawn_host([*host, str(code_dir)], tmp)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SandboxError(f"its process could not start ({exc})") from exc
        return cls(proc, tmp, settings)

    @property
    def running(self) -> bool:
        """Whether the process has not exited."""
        return self.proc.returncode is None

    async def ask(
        self, message: Mapping[str, Any], *, hook: str, timeout: float
    ) -> list[CustomSearcherOp]:
        """Sends one call and returns the answer's operations (each a create or a stop; the
        search's rules are checked when the answer is folded).

        Raises:
            SandboxError: the method raised, took more than ``timeout`` seconds, answered more
                than ``max_answer`` bytes or something that is not an answer, or the process
                died. The process is then killed.
        """
        try:
            async with asyncio.timeout(timeout):
                line = await self._exchange(message, hook)
        except TimeoutError:
            await self.close()
            raise SandboxError(f"{hook} took more than {timeout:g} s") from None
        except SandboxError:
            await self.close()
            raise
        try:
            answer = json.loads(line)
        except (ValueError, RecursionError):
            await self.close()
            raise SandboxError(f"{hook} answered something that is not JSON") from None
        if not isinstance(answer, dict):
            await self.close()
            raise SandboxError(f"{hook} answered something that is not an object")
        if "error" in answer:
            await self.close()
            raise SandboxError(f"{hook} raised {str(answer['error'])[:600]}")
        ops = answer.get("ops")
        if not isinstance(ops, list):
            await self.close()
            raise SandboxError(f"{hook} answered no list of operations")
        try:
            return checked_ops(ops, hook)
        except SandboxError:
            await self.close()
            raise

    async def _exchange(self, message: Mapping[str, Any], hook: str) -> bytes:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        if stdin is None or stdout is None or not self.running:
            raise SandboxError(await self._ended(hook))
        try:
            stdin.write(json.dumps(message).encode() + b"\n")
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise SandboxError(await self._ended(hook)) from None
        while b"\n" not in self._buffer:
            chunk = await stdout.read(_READ_CHUNK)
            if not chunk:
                raise SandboxError(await self._ended(hook))
            self._buffer += chunk
            if len(self._buffer) > self.settings.max_answer:
                raise SandboxError(f"{hook} answered more than {self.settings.max_answer} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def _ended(self, hook: str) -> str:
        """Why the process stopped answering during ``hook``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), _EXIT_WAIT)
        code = self.proc.returncode
        if code is None:
            return f"its process closed its output during {hook}"
        if code == -signal.SIGXCPU:
            return f"its process used more than {self.settings.cpu_seconds} s of CPU time"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"its process died of {name} during {hook}"
        return f"its process exited with code {code} during {hook}"

    async def close(self) -> None:
        """Kills the process group (and so the namespace) and removes the directory."""
        if not self._killed:
            self._killed = True  # members left in the group keep its id from being reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), _EXIT_WAIT)
        if self.proc.stdout is not None:  # read to the end, so the pipe's transport closes
            with contextlib.suppress(TimeoutError, OSError):
                await asyncio.wait_for(_discard(self.proc.stdout), _EXIT_WAIT)
        if self.workdir.exists():
            await asyncio.to_thread(shutil.rmtree, self.workdir, True)


async def _discard(stream: asyncio.StreamReader) -> None:
    """Reads ``stream`` to its end, keeping nothing."""
    while await stream.read(_READ_CHUNK):
        pass
