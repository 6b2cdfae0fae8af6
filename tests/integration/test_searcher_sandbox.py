"""The custom searcher's sandbox, tried from the inside by hostile searchers: no credential, no
network, no way out of its limits, and nothing left running after a timeout.

Each test starts real sandboxed processes (``unshare``, ``setpriv``), which needs root; run as
another user they are skipped.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from services.confine import Identity, default_identity
from services.searcher.sandbox import Sandbox, SandboxError, SandboxSettings, code_root
from tests.helpers import wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches uid: needs root")

SECRET = "cairn-sandbox-test-secret-5b1d"
"""A credential held in the environment of a process beside the sandbox."""

PROBE = '''
import glob, json, os, socket
from cairn.searcher import SearchMethod

def probe(secret, port, code_root):
    """What a searcher can reach: environments holding the secret, a TCP connection, the
    directory of every sandbox's code, its own code's files."""
    readable, leaks = 0, []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        readable += 1
        if secret.encode() in data:
            leaks.append(path)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        network = "connected"
    except OSError as exc:
        network = type(exc).__name__
    try:
        listed = os.listdir(code_root)
    except OSError as exc:
        listed = type(exc).__name__
    try:
        open("written-by-searcher", "w").close()
        wrote = "wrote its code dir"
    except OSError as exc:
        wrote = type(exc).__name__
    return {"uid": os.getuid(), "environs": readable, "leaks": leaks, "network": network,
            "listed": listed, "wrote": wrote, "pids": len(glob.glob("/proc/[0-9]*"))}

class Probe(SearchMethod):
    def initial_operations(self):
        args = self.searcher_args
        return [self.context.create(probe(args["secret"], args["port"], args["code_root"]))]
'''

HOSTILE = """
import os, sys, time
from cairn.searcher import SearchMethod

class Spins(SearchMethod):
    def initial_operations(self):
        while True:
            pass

class Sleeps(SearchMethod):
    def initial_operations(self):
        time.sleep(40)

class Huge(SearchMethod):
    def initial_operations(self):
        return [self.context.create({"blob": "x" * (16 * 1024 * 1024)})]

class Hog(SearchMethod):
    def initial_operations(self):
        hog = bytearray(8 * 1024 ** 3)
        return [self.context.create({"size": len(hog)})]

class ForkBomb(SearchMethod):
    def initial_operations(self):
        forked = 0
        while True:
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                os.setsid()  # leave the process group: the namespace still holds it
                time.sleep(3600)
                os._exit(0)
            forked += 1
        return [self.context.create({"forked": forked})]

class Lingers(SearchMethod):
    def initial_operations(self):
        if os.fork() == 0:
            os.setsid()
            time.sleep(3600)
            os._exit(0)
        return []
"""


def tarball(files: dict[str, str]) -> bytes:
    """A tar.gz of ``files``; every member private to its owner (mode 0600), as a careless
    upload may be."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def config(searcher_class: str, **searcher_args: Any) -> dict[str, Any]:
    """An experiment config naming a custom searcher."""
    return {
        "name": "sandboxed",
        "entrypoint": "python3 train.py",
        "hyperparameters": {"lr": {"type": "double", "minval": 0.001, "maxval": 0.1}},
        "searcher": {
            "name": "custom",
            "metric": "validation_loss",
            "searcher_class": searcher_class,
            "searcher_args": searcher_args,
            "max_trials": 4,
        },
    }


@pytest.fixture
def root() -> Iterator[Path]:
    """The sandboxes' code root, removed afterwards."""
    path = code_root()
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def processes_under(root: Path) -> list[psutil.Process]:
    """Live processes whose command line names ``root`` (a sandbox's host and its forks)."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            named = any(str(root) in part for part in proc.info["cmdline"] or [])
            if named and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


@contextlib.asynccontextmanager
async def sandbox(
    root: Path,
    code: dict[str, str],
    searcher_class: str,
    searcher_args: dict[str, Any] | None = None,
) -> AsyncIterator[Sandbox]:
    """A started sandbox whose user class is loaded; closed on exit."""
    settings = SandboxSettings(call_timeout=3.0)
    box = await Sandbox.start(
        tarball(code), settings=settings, identity=default_identity(), root=root
    )
    try:
        init = {
            "call": "init",
            "config": config(searcher_class, **(searcher_args or {})),
            "seed": 1,
        }
        await box.ask(init, hook="__init__", timeout=60)
        yield box
    finally:
        await box.close()


@pytest.fixture
def bystander() -> Iterator[tuple[int, int]]:
    """A process holding :data:`SECRET` in its environment, as a service holds its DSN, and a
    listening TCP port on loopback, as the database's; yields (pid, port)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"],
        env={**os.environ, "CAIRN_DB": f"postgresql://cairn:{SECRET}@127.0.0.1/cairn"},
    )
    try:
        yield proc.pid, listener.getsockname()[1]
    finally:
        proc.kill()
        proc.wait()
        listener.close()


async def test_sandboxed_searcher_finds_no_credential_and_no_network(
    root: Path, bystander: tuple[int, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A searcher that reads every /proc/*/environ, connects to a loopback port, lists the
    sandboxes' root and writes its code directory finds no credential and reaches nothing;
    the same probe run as the service (the control) finds the secret and connects."""
    pid, port = bystander
    sys.path.insert(0, str(tmp_path))
    try:
        (tmp_path / "probe_control.py").write_text(PROBE)
        import probe_control

        monkeypatch.chdir(tmp_path)  # the control writes its file here, not in the checkout
        control = probe_control.probe(SECRET, port, str(root))
    finally:
        sys.path.remove(str(tmp_path))
    assert control["leaks"] == [f"/proc/{pid}/environ"], "the control probe sees the secret"
    assert control["network"] == "connected"
    args = {"secret": SECRET, "port": port, "code_root": str(root)}
    async with sandbox(root, {"probe.py": PROBE}, "probe:Probe", args) as box:
        (create,) = await box.ask({"call": "initial"}, hook="initial_operations", timeout=30)
    seen = create.hparams
    assert seen is not None
    identity = default_identity()
    assert identity is not None and seen["uid"] == identity.uid != os.geteuid()
    assert seen["leaks"] == [] and seen["environs"] <= 2, seen  # only its own process's
    assert seen["pids"] <= 2, f"the sandbox sees other processes: {seen}"
    assert seen["network"] != "connected"
    assert seen["listed"] == "PermissionError" and seen["wrote"] == "PermissionError"


async def test_spinning_and_sleeping_searchers_time_out_and_are_killed(root: Path) -> None:
    """A searcher that spins or sleeps fails its call with the time limit as the reason, and its
    process is gone once the call has failed."""
    for cls in ("Spins", "Sleeps"):
        async with sandbox(root, {"hostile.py": HOSTILE}, f"hostile:{cls}") as box:
            assert processes_under(root), "the sandbox runs"
            with pytest.raises(SandboxError, match="initial_operations took more than 3 s"):
                await box.ask({"call": "initial"}, hook="initial_operations", timeout=3)
            assert not box.running
        assert processes_under(root) == []


async def test_huge_answers_and_memory_hogs_fail_their_call(root: Path) -> None:
    """An answer bigger than an event may hold, and an allocation past the memory limit, each
    fail the call with their reason."""
    async with sandbox(root, {"hostile.py": HOSTILE}, "hostile:Huge") as box:
        with pytest.raises(SandboxError, match="answered more than 393216 bytes"):
            await box.ask({"call": "initial"}, hook="initial_operations", timeout=30)
    async with sandbox(root, {"hostile.py": HOSTILE}, "hostile:Hog") as box:
        with pytest.raises(SandboxError, match="initial_operations raised MemoryError"):
            await box.ask({"call": "initial"}, hook="initial_operations", timeout=30)


async def test_fork_bomb_is_bounded_and_killed_whole(root: Path) -> None:
    """A searcher that forks until it cannot gets a bounded number of processes (each child
    leaving the process group), and closing the sandbox kills every one of them."""
    async with sandbox(root, {"hostile.py": HOSTILE}, "hostile:ForkBomb") as box:
        (create,) = await box.ask({"call": "initial"}, hook="initial_operations", timeout=30)
        assert create.hparams is not None
        forked = int(create.hparams["forked"])
        limit = SandboxSettings().processes
        assert 0 < forked < limit, f"forked {forked} with a limit of {limit}"

        def left_the_group() -> bool:
            leaders = [p for p in processes_under(root) if p.pid == os.getsid(p.pid)]
            return len(leaders) >= forked

        await wait_until(left_the_group, timeout=10)
    await wait_until(lambda: processes_under(root) == [], timeout=10)


async def test_a_child_left_behind_dies_with_its_sandbox(root: Path) -> None:
    """A searcher that answers but leaves a child running in a session of its own: closing the
    sandbox (the experiment ended) kills the child too."""
    async with sandbox(root, {"hostile.py": HOSTILE}, "hostile:Lingers") as box:
        assert await box.ask({"call": "initial"}, hook="initial_operations", timeout=30) == []
        await wait_until(lambda: len(processes_under(root)) >= 2, timeout=10)
    await wait_until(lambda: processes_under(root) == [], timeout=10)


def unpacked(root: Path) -> dict[str, Any]:
    """Modes and owners of the one sandbox directory under ``root``."""
    (workdir,) = list(root.iterdir())
    code = (workdir / "code" / "probe.py").stat()
    return {
        "name": workdir.name,
        "code": (code.st_mode & 0o777, code.st_uid),
        "root": root.stat().st_mode & 0o777,
        "tmp": (workdir / "tmp").stat().st_uid,
    }


async def test_code_is_unpacked_readable_by_the_sandbox_and_owned_by_the_service(
    root: Path,
) -> None:
    """A private (0600) upload is unpacked readable (0644) in a directory of an unguessable
    name, owned by the service, under a root the sandbox may traverse but not list; the
    directory is gone once the sandbox is closed."""
    args = {"secret": "", "port": 1, "code_root": ""}
    async with sandbox(root, {"probe.py": PROBE}, "probe:Probe", args) as box:
        seen = unpacked(root)
        assert box.running
    identity = default_identity()
    assert isinstance(identity, Identity)
    assert len(seen["name"]) == 32 and seen["root"] == 0o711
    assert seen["code"] == (0o644, os.geteuid()) and seen["tmp"] == identity.uid
    assert not os.listdir(root)


def test_host_lowers_its_own_limits_and_priority() -> None:
    """The host's first step, before any user module is imported, lowers its rlimits and CPU
    priority to the settings' (run here in a plain interpreter to read them back)."""
    settings = SandboxSettings()
    out = subprocess.run(
        [
            sys.executable, "-c",
            "import json, os, resource, sys\n"
            "from services.searcher.custom_host import confine_self\n"
            "confine_self(json.loads(sys.argv[1]))\n"
            "print(json.dumps([resource.getrlimit(resource.RLIMIT_NPROC)[0],"
            " resource.getrlimit(resource.RLIMIT_AS)[0], os.nice(0)]))",
            json.dumps(settings.limits()),
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    nproc, memory, nice = json.loads(out.stdout)
    assert (nproc, memory) == (settings.processes, settings.memory_bytes)
    assert nice >= settings.niceness
