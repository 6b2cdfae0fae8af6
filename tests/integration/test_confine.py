"""User code confined by :mod:`services.confine`, as real processes on this machine (as root)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.confine import (
    ConfinementError,
    Identity,
    View,
    blocking_ancestors,
    confined_argv,
    confined_environment,
    default_identity,
    host,
)
from tests.helpers import wait_until_sync

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing uids needs root")

IDENTITY = Identity(2_000_000_101, 2_000_000_101, "alice")
PYTHON = sys.executable
ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent(
    """
    import json, os, sys
    status = dict(
        line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line
    )
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    environs = {}
    for pid in pids:
        try:
            environs[pid] = len(open(f"/proc/{pid}/environ", "rb").read())
        except OSError:
            pass
    print(json.dumps({
        "pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "nnp": status["NoNewPrivs"].strip(),
        "caps": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
        "visible_pids": pids, "environs": environs, "cwd": os.getcwd(),
        "umask": os.umask(0), "argv": sys.argv[1:],
    }))
    """
)


def run(
    tmp: Path, argv: list[str], *, view: View | None = None, network: bool = True
) -> subprocess.CompletedProcess[str]:
    """Runs ``argv`` confined as :data:`IDENTITY` in ``tmp/work`` and captures its output."""
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    os.chown(work, IDENTITY.uid, IDENTITY.gid)
    env = {"PATH": os.environ["PATH"], **confined_environment(IDENTITY, home=work)}
    view = view or View()
    view = dataclasses.replace(view, expose=(*view.expose, work))
    command = confined_argv(argv, identity=IDENTITY, network=network, view=view)
    return subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def probe(tmp: Path, **kwargs: object) -> dict[str, object]:
    """The probe's report of its own process, run confined."""
    (tmp / "work").mkdir(exist_ok=True)
    script = tmp / "work" / "probe.py"
    script.write_text(PROBE)
    script.chmod(0o644)
    done = run(tmp, [PYTHON, str(script), "an argument"], **kwargs)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A directory of mode 0755 directly in the system's temporary directory (pytest's own
    sit under a mode-0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="cairn-confine-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_user_code_runs_unprivileged_without_capabilities_or_new_privileges(
    tmp: Path,
) -> None:
    """The confined program has the identity's uid and gid, no other groups, NoNewPrivs set,
    every capability set empty and the umask that keeps its files to itself."""
    report = probe(tmp)
    assert (report["uid"], report["gid"]) == (IDENTITY.uid, IDENTITY.gid)
    assert set(report["groups"]) <= {IDENTITY.gid}  # type: ignore[arg-type]
    assert report["nnp"] == "1"
    assert set(report["caps"].values()) == {"0000000000000000"}  # type: ignore[attr-defined]
    assert report["umask"] == 0o077
    assert report["argv"] == ["an argument"]


def test_other_processes_are_invisible_and_their_environments_unreadable(tmp: Path) -> None:
    """The confined program sees only its own identity's processes in /proc and reads no
    other process's environment (this test process's included)."""
    report = probe(tmp)
    assert os.getpid() not in report["visible_pids"]  # type: ignore[operator]
    assert set(report["environs"]) <= {str(report["pid"])}  # type: ignore[arg-type]
    # Without the private /proc the environments are still unreadable (another uid).
    report = probe(tmp, view=View(proc=False))
    assert os.getpid() in report["visible_pids"]  # type: ignore[operator]
    assert str(os.getpid()) not in report["environs"]  # type: ignore[operator]
    assert set(report["environs"]) <= {str(report["pid"])}  # type: ignore[arg-type]


def test_hidden_directory_is_empty_but_exposed_directories_under_it_stay_reachable(
    tmp: Path,
) -> None:
    """A hidden data directory shows nothing of its secrets, not even through ``..`` from the
    working directory inside it, while the exposed work directory under it stays writable."""
    data = tmp / "data"
    (data / "agent").mkdir(parents=True)
    (data / "pg.password").write_text("hunter2\n")
    (data / "pg.password").chmod(0o644)  # readable by anyone: only the cover hides it
    work = data / "agent" / "work"
    work.mkdir()
    os.chown(work, IDENTITY.uid, IDENTITY.gid)
    data.chmod(0o755)
    script = (
        "import os; print(sorted(os.listdir('../..')), os.path.exists('../../pg.password'),"
        " os.path.exists(os.environ['SECRET']), sorted(os.listdir('..')));"
        " open('out.txt', 'w').write('ok')"
    )
    env = {
        "PATH": os.environ["PATH"],
        "SECRET": str(data / "pg.password"),
        **confined_environment(IDENTITY, home=work),
    }
    view = View(hide=(data,), expose=(work,))
    command = confined_argv([PYTHON, "-c", script], identity=IDENTITY, view=view)
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['agent']", "False", "False", "['work']"]
    assert (work / "out.txt").read_text() == "ok"
    assert (work / "out.txt").stat().st_uid == IDENTITY.uid
    assert (work / "out.txt").stat().st_mode & 0o777 == 0o600


def test_interpreter_under_a_private_ancestor_is_reached_and_the_ancestor_shows_nothing(
    tmp: Path,
) -> None:
    """An interpreter under a mode-0700 directory the identity cannot traverse still runs
    confined, and that directory's other contents stay out of sight."""
    private = tmp / "private"
    (private / "python").mkdir(parents=True)
    (private / "secret.txt").write_text("secret")
    private.chmod(0o700)
    assert blocking_ancestors(private / "python", IDENTITY) == [private]
    view = View(expose=(private / "python",))
    done = run(
        tmp,
        [PYTHON, "-c", f"import os; print(sorted(os.listdir({str(private)!r})))"],
        view=view,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['python']"


def test_a_private_directory_asked_for_does_not_stand_in_front_of_one_below_it(tmp: Path) -> None:
    """Exposing a mode-0700 directory the identity cannot enter (a launcher's own working
    directory) does not hide the identity's work directory below it: every private directory on
    the way is covered and the work directory bound back."""
    top = tmp / "top"
    outer = top / "outer"
    work = outer / "agent" / "work"
    work.mkdir(parents=True)
    for private in (outer / "agent", outer, top):
        private.chmod(0o700)
    (work / "code.py").write_text("print('reached')")
    os.chown(work, IDENTITY.uid, IDENTITY.gid)
    os.chown(work / "code.py", IDENTITY.uid, IDENTITY.gid)
    view = View(hide=(outer / "agent",), expose=(outer, work))
    command = confined_argv([PYTHON, "code.py"], identity=IDENTITY, view=view)
    done = subprocess.run(
        command, cwd=work, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "reached"), done.stderr


def test_the_started_pid_is_the_user_program_and_sigterm_to_its_group_reaches_it(
    tmp: Path,
) -> None:
    """The pid a launcher gets is the user program's own (exec chain), and SIGTERM sent to its
    process group reaches the program's handler, as the agent's preemption does."""
    work = tmp / "work"
    work.mkdir()
    os.chown(work, IDENTITY.uid, IDENTITY.gid)
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *_: (os.write(1, b"term\\n"), os._exit(3)))
        print(os.getpid(), flush=True)
        time.sleep(60)
        """
    )
    command = confined_argv([PYTHON, "-c", script], identity=IDENTITY)
    proc = subprocess.Popen(
        command,
        cwd=work,
        env={"PATH": os.environ["PATH"]},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert int(proc.stdout.readline()) == proc.pid
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 3
    assert proc.stdout.read().strip() == "term"


def test_user_code_cannot_signal_a_process_of_the_launcher(tmp: Path) -> None:
    """``kill`` from the confined program on a process of the launcher's uid fails with EPERM
    and the process lives on."""
    victim = subprocess.Popen(["sleep", "60"])
    try:
        script = (
            f"import os\ntry:\n    os.kill({victim.pid}, 15)\nexcept OSError as e:\n"
            "    print(e.errno)"
        )
        done = run(tmp, [PYTHON, "-c", script], view=View(proc=False))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1"  # EPERM
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_without_network_nothing_on_this_machine_is_reachable(tmp: Path) -> None:
    """``network=False``: a port listening on this machine's loopback cannot be reached, while
    the same program with the network connects."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        script = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=5).close(); print('ok')\n"
            "except OSError as e:\n    print('refused', e.errno)"
        )
        cut = run(tmp, [PYTHON, "-c", script], network=False)
        assert cut.returncode == 0, cut.stderr
        assert cut.stdout.startswith("refused")
        wired = run(tmp, [PYTHON, "-c", script])
        assert wired.stdout.strip() == "ok", wired.stderr


def test_an_engine_socket_of_the_launcher_is_covered_or_user_code_is_refused(
    tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container engine's socket the root launcher holds is covered in user code's view (it
    can neither see a socket there nor connect); where no mount namespace can cover it, user
    code is refused as a process, saying so."""
    path = tmp / "docker.sock"
    with socket.socket(socket.AF_UNIX) as engine:
        engine.bind(str(path))
        engine.listen()
        path.chmod(0o666)  # so that only the cover, not the mode, keeps user code out
        monkeypatch.setattr("services.confine.ENGINE_SOCKETS", (str(path),))
        script = (
            "import os, socket, stat, sys\n"
            f"p = {str(path)!r}\n"
            "kind = 'socket' if stat.S_ISSOCK(os.stat(p).st_mode) else 'other'\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(p); print(kind, 'connected')\n"
            "except OSError as e:\n    print(kind, 'refused', e.errno)"
        )
        covered = run(tmp, [PYTHON, "-c", script])
        assert covered.returncode == 0, covered.stderr
        assert covered.stdout.startswith("other refused"), covered.stdout
        monkeypatch.setattr("services.confine.ENGINE_SOCKETS", ())
        control = run(tmp, [PYTHON, "-c", script])  # the probe does connect when nothing covers
        assert control.stdout.strip() == "socket connected", control.stderr
        monkeypatch.setattr("services.confine.ENGINE_SOCKETS", (str(path),))
        without = dataclasses.replace(host(), mount_ns=False)
        monkeypatch.setattr("services.confine.host", lambda: without)
        with pytest.raises(ConfinementError, match="would reach the container engine's socket"):
            confined_argv([PYTHON, "-c", script], identity=IDENTITY)


def test_root_and_malformed_identities_are_refused() -> None:
    """uid or gid 0 (and ids the kernel cannot hold) never make an identity."""
    for uid, gid in ((0, 5), (5, 0), (-1, 5), (2**32 - 1, 5)):
        with pytest.raises(ConfinementError):
            Identity(uid, gid)
    with pytest.raises(ConfinementError):
        confined_argv([], identity=IDENTITY)


def test_default_identity_is_unprivileged_and_stable() -> None:
    """As root the cluster's default identity is a fixed non-root uid and gid."""
    first, second = default_identity(), default_identity()
    assert first is not None and first == second
    assert first.uid > 65535 and first.gid > 65535
    assert host().mount_ns


def test_leftover_grandchild_keeps_the_group_and_is_killed_with_it(tmp: Path) -> None:
    """A child the confined program spawns stays in the program's process group, so SIGKILL to
    the group (what the agent does to a run and to leftovers) ends both."""
    work = tmp / "work"
    work.mkdir()
    os.chown(work, IDENTITY.uid, IDENTITY.gid)
    script = (
        "import subprocess, time; c = subprocess.Popen(['sleep', '60']);"
        " print(c.pid, flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        confined_argv([PYTHON, "-c", script], identity=IDENTITY),
        cwd=work,
        env={"PATH": os.environ["PATH"]},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    inner = int(proc.stdout.readline())
    # The child's pid is as /proc of the program's own namespace shows it: the same pid
    # namespace as ours, so the number is the host's.
    assert os.getpgid(inner) == proc.pid
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)

    def gone() -> bool:
        try:
            os.kill(inner, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{inner}/stat") as fh:
            return fh.read().split()[2] == "Z"

    wait_until_sync(gone, timeout=10)


def test_without_root_hidden_paths_stay_hidden_and_cannot_be_uncovered(tmp: Path) -> None:
    """A launcher that is not root (run here as an unprivileged uid) cannot change uids, but
    its user code runs in a user and mount namespace where a hidden directory is empty, and
    neither ``umount`` nor a namespace of the code's own brings its files back."""
    secret_dir = tmp / "data"
    secret_dir.mkdir()
    (secret_dir / "pg.password").write_text("hunter2")
    (secret_dir / "pg.password").chmod(0o644)
    work = tmp / "work"
    work.mkdir()
    os.chown(work, IDENTITY.uid, IDENTITY.gid)
    check = textwrap.dedent(
        f"""
        import os, subprocess
        print("visible", os.listdir({str(secret_dir)!r}))
        print("umount", subprocess.run(["umount", {str(secret_dir)!r}]).returncode != 0)
        nested = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
             "umount -l {secret_dir} 2>/dev/null; ls {secret_dir}"],
            capture_output=True, text=True,
        )
        print("nested", repr(nested.stdout.strip()))
        """
    )
    launcher = textwrap.dedent(
        f"""
        import os, subprocess
        from pathlib import Path
        from services.confine import View, confined_argv, host
        assert not host().root and host().user_ns, host()
        print("launcher", os.listdir({str(secret_dir)!r}))
        view = View(hide=(Path({str(secret_dir)!r}),), expose=(Path({str(work)!r}),))
        argv = confined_argv([{PYTHON!r}, "-c", {check!r}], identity=None, view=view)
        done = subprocess.run(argv, cwd={str(work)!r}, capture_output=True, text=True)
        print(done.stdout, done.stderr, done.returncode)
        """
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    outer = View(expose=(work, tmp), proc=False)
    command = confined_argv([PYTHON, "-c", launcher], identity=IDENTITY, view=outer)
    done = subprocess.run(
        command, cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = [
        line for line in done.stdout.split("\n") if line.startswith(("visible", "umount", "nested"))
    ]
    assert lines == ["visible []", "umount True", "nested ''"], done.stdout
