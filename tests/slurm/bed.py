"""A real single-machine Slurm cluster for tests: munged, slurmctld and one slurmd, all as root,
with every file (MUNGE key and socket, ``slurm.conf``, state, spool, pid files, logs) under one
directory, so a test never reads or writes ``/etc/slurm`` or ``/etc/munge``.

Every Slurm client (``sbatch``, ``squeue``, ``scancel``, ``scontrol``, ``sinfo``, ``srun``)
must run with :meth:`SlurmBed.env` (``SLURM_CONF`` pointing at the bed's ``slurm.conf``); the
MUNGE socket reaches them through ``AuthInfo`` in that file.

The one node is named after the machine's short hostname (what ``slurmd -C`` reports), is
addressed at 127.0.0.1 and declares :data:`NODE_CPUS` CPUs whatever the machine has
(``SlurmdParameters=config_overrides``). Jobs run as the submitting user (root in the bed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

CLUSTER = "cairntest"
"""The bed's ``ClusterName``."""
PARTITION = "debug"
"""The default partition (every node, no time limit)."""
SECOND_PARTITION = "batch"
"""A second partition over the same node, for tests that name one."""
NODE_CPUS = 8
"""The CPUs the node declares (more than the machine may have)."""
NODE_MEMORY_MB = 4096
"""The node's ``RealMemory``."""
DAEMONS = ("munged", "slurmctld", "slurmd")

T = TypeVar("T")


class SlurmBedError(RuntimeError):
    """The bed could not be set up or did not come up in time."""


def slurm_available() -> str | None:
    """Says why the bed cannot run here, or None when it can.

    Returns:
        The reason (not root, a daemon or client missing), or None.
    """
    if os.geteuid() != 0:
        return "the Slurm test bed runs its daemons as root"
    missing = [cmd for cmd in (*DAEMONS, "sinfo", "sbatch") if shutil.which(cmd) is None]
    if missing:
        return f"{', '.join(missing)} missing: run deploy/slurm/install.sh"
    return None


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now.

    Returns:
        The port number.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def node_name() -> str:
    """The node name slurmd reports for this machine (``slurmd -C``), the short hostname.

    Returns:
        The name.
    """
    out = subprocess.run(
        ["slurmd", "-C"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    match = re.search(r"NodeName=(\S+)", out)
    return match.group(1) if match else socket.gethostname().split(".")[0]


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.2) -> T:
    """Polls ``probe`` until it returns something other than None.

    Args:
        what: What is awaited, for the error.
        probe: Returns the awaited value, or None while not there yet.
        timeout: Seconds before giving up.
        interval: Seconds between polls.

    Returns:
        The first value ``probe`` returned that was not None.

    Raises:
        TimeoutError: ``probe`` kept returning None for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no {path.name})"
    return "\n".join(text.splitlines()[-lines:])


def _descendants(root: int) -> list[int]:
    """The processes below ``root`` (children first seen, any depth), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _holds_file_under(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` has a file under ``directory`` open (its log, its socket)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        for fd in fds.iterdir():
            try:
                if Path(os.readlink(fd)).is_relative_to(directory):
                    return True
            except OSError:
                continue
    except OSError:
        return False
    return False


def _kill(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


@dataclass
class SlurmBed:
    """A MUNGE daemon, a slurmctld and one slurmd, configured and logging under ``base``.

    Attributes:
        base: The directory that holds everything of the bed.
        node: The node's name (the short hostname).
        ctld_port: slurmctld's port on 127.0.0.1.
        slurmd_port: slurmd's port on 127.0.0.1.
    """

    base: Path
    node: str = ""
    ctld_port: int = 0
    slurmd_port: int = 0
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        """The bed's ``slurm.conf``."""
        return self.base / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        """The socket munged listens on."""
        return self.base / "munge" / "munge.sock"

    @property
    def log_dir(self) -> Path:
        """Where the daemons' logs are (``munged.log``, ``slurmctld.log``, ``slurmd.log``)."""
        return self.base / "log"

    @property
    def jobs_dir(self) -> Path:
        """A directory for tests' job scripts and job output (world-writable)."""
        return self.base / "jobs"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a Slurm client of this bed.

        Args:
            extra: More variables to set.

        Returns:
            ``os.environ`` with ``SLURM_CONF`` set to the bed's ``slurm.conf`` (and ``extra``).
        """
        env = dict(os.environ)
        for name in list(env):
            # Set inside a job of another cluster (or this one), they would steer the client.
            if name.startswith(("SLURM_", "SBATCH_", "SQUEUE_", "SRUN_", "SALLOC_")):
                del env[name]
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra or {})
        return env

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> str:
        """Runs a Slurm client against the bed.

        Args:
            *argv: The command and its arguments, e.g. ``"squeue", "-h"``.
            check: Raise when the command fails.
            timeout: Seconds the command may take.

        Returns:
            Its standard output.

        Raises:
            SlurmBedError: ``check`` and the command exited non-zero.
        """
        done = subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout
        )
        if check and done.returncode != 0:
            raise SlurmBedError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def write(self) -> None:
        """Writes the MUNGE key, ``slurm.conf`` and the directories, choosing free ports."""
        self.base.mkdir(parents=True, exist_ok=True)
        for sub in ("log", "state", "spool", "run"):
            (self.base / sub).mkdir(mode=0o700, exist_ok=True)
        # munged wants its socket's directory searchable by all (clients of any user).
        (self.base / "munge").mkdir(exist_ok=True)
        (self.base / "munge").chmod(0o755)
        self.jobs_dir.mkdir(exist_ok=True)
        self.jobs_dir.chmod(0o1777)
        key = self.base / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
            os.chown(key, 0, 0)
            key.chmod(0o400)
        self.node = self.node or node_name()
        self.ctld_port = self.ctld_port or free_port()
        self.slurmd_port = self.slurmd_port or free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        (self.base / "plugstack.conf").write_text("")
        self.conf.write_text(self._slurm_conf())

    def _slurm_conf(self) -> str:
        b = self.base
        lines = [
            f"ClusterName={CLUSTER}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # Both the auth and the cred plugin take the socket from AuthInfo in 22.05.
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={b / 'state'}",
            f"SlurmdSpoolDir={b / 'spool'}",
            f"SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={b / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={b / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SchedulerType=sched/backfill",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "MinJobAge=600",
            "KillWait=10",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=60",
            "InactiveLimit=0",
            (
                f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} "
                f"RealMemory={NODE_MEMORY_MB} State=UNKNOWN"
            ),
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            f"PartitionName={SECOND_PARTITION} Nodes=ALL Default=NO MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.log_dir / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps it
        try:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        finally:
            out.close()

    def _fail(self, why: str) -> SlurmBedError:
        logs = []
        for name in DAEMONS:
            proc = self._procs.get(name)
            state = "not started" if proc is None else f"exit {proc.poll()}"
            logs.append(f"--- {name} ({state}) ---")
            logs.append(_tail(self.log_dir / f"{name}.log"))
            logs.append(_tail(self.log_dir / f"{name}.out", 10))
        return SlurmBedError(why + "\n" + "\n".join(logs))

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise self._fail(f"{name} exited with {proc.returncode}")

    def start(self, timeout: float = 60) -> None:
        """Writes the setup, starts munged, slurmctld and slurmd, and waits for the node idle.

        Args:
            timeout: Seconds the whole start may take.

        Raises:
            SlurmBedError: A daemon exited, or the node was not idle in time (with the tail of
                each daemon's log).
        """
        self.write()
        deadline = time.monotonic() + timeout
        self._spawn(
            "munged",
            [
                "munged",
                "--foreground",
                "--force",
                f"--key-file={self.base / 'munge' / 'munge.key'}",
                f"--socket={self.munge_socket}",
                f"--pid-file={self.base / 'run' / 'munged.pid'}",
                f"--log-file={self.log_dir / 'munged.log'}",
                f"--seed-file={self.base / 'munge' / 'munged.seed'}",
            ],
        )
        self._await("munged's socket", self._munge_up, deadline)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._await("slurmctld to answer", self._ctld_up, deadline)
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._await("the node to be idle", self._node_idle, deadline)

    def _await(self, what: str, probe: Callable[[], bool], deadline: float) -> None:
        def alive_probe() -> bool | None:
            self._check_alive()
            return True if probe() else None

        try:
            wait_for(what, alive_probe, max(0.0, deadline - time.monotonic()))
        except TimeoutError as exc:
            raise self._fail(str(exc)) from None

    def _munge_up(self) -> bool:
        if not self.munge_socket.exists():
            return False
        done = subprocess.run(
            ["munge", "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10
        )
        return done.returncode == 0

    def _ctld_up(self) -> bool:
        done = subprocess.run(
            ["scontrol", "ping"], env=self.env(), capture_output=True, text=True, timeout=10
        )
        return done.returncode == 0 and "UP" in done.stdout

    def _node_idle(self) -> bool:
        return self.node_state() == "idle"

    def node_state(self) -> str:
        """The node's state as ``sinfo`` has it (``idle``, ``mix``, ``alloc``, ``down*``, ...).

        Returns:
            The state, or "" when sinfo does not answer.
        """
        out = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%t", check=False)
        return out.strip().splitlines()[0] if out.strip() else ""

    def sbatch(self, *args: str, cwd: Path | None = None) -> str:
        """Submits a batch job.

        Args:
            *args: sbatch's arguments (options, then a script or ``--wrap``).
            cwd: The job's submit directory (default: :attr:`jobs_dir`).

        Returns:
            The job id.
        """
        done = subprocess.run(
            ["sbatch", "--parsable", *args],
            env=self.env(),
            cwd=cwd or self.jobs_dir,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise SlurmBedError(f"sbatch {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """A job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ``CANCELLED``, ``TIMEOUT``...).

        Asks ``squeue -t all`` first, then ``scontrol show job``.

        Args:
            job_id: The job's id.

        Returns:
            The state, or "" when neither knows the job.
        """
        out = self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False)
        if out.strip():
            return out.strip().splitlines()[0]
        out = self.run("scontrol", "show", "job", job_id, check=False)
        match = re.search(r"JobState=(\S+)", out)
        return match.group(1) if match else ""

    def wait_state(self, job_id: str, states: set[str] | str, timeout: float = 60) -> str:
        """Waits until a job is in one of ``states``.

        Args:
            job_id: The job's id.
            states: The awaited state or states.
            timeout: Seconds to wait.

        Returns:
            The state reached.

        Raises:
            TimeoutError: The job was not in any of ``states`` in time (the last state seen).
        """
        wanted = {states} if isinstance(states, str) else states
        seen: list[str] = [""]

        def probe() -> str | None:
            seen[0] = self.job_state(job_id)
            return seen[0] if seen[0] in wanted else None

        try:
            return wait_for(f"job {job_id} in {sorted(wanted)}", probe, timeout, 0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} (last state: {seen[0] or 'unknown'})") from None

    def _stepds(self) -> list[int]:
        """This bed's slurmstepd processes (they hold its slurmd log or spool open)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm == "slurmstepd" and _holds_file_under(int(entry.name), self.base):
                found.append(int(entry.name))
        return found

    def stop(self, grace: float = 10) -> None:
        """Cancels every job, stops slurmd, slurmctld and munged (SIGTERM, then SIGKILL after
        ``grace`` seconds), and kills any slurmstepd of the bed left over, with its job.

        Args:
            grace: Seconds each daemon has to exit after SIGTERM.
        """
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False, timeout=15).split()
            if jobs:
                self.run("scancel", "--full", *jobs, check=False, timeout=15)
        for name in ("slurmd", "slurmctld"):
            self._terminate(name, grace)
        stepds = self._stepds()
        doomed = [*stepds, *(pid for s in stepds for pid in _descendants(s))]
        _kill(doomed, signal.SIGKILL)
        self._terminate("munged", grace)

    def _terminate(self, name: str, grace: float) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def __enter__(self) -> SlurmBed:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def running_bed(base: Path, timeout: float = 60) -> Iterator[SlurmBed]:
    """A started bed under ``base``, stopped when the generator is closed (for fixtures).

    Args:
        base: The bed's directory.
        timeout: Seconds the start may take.

    Yields:
        The bed, its node idle.
    """
    bed = SlurmBed(base)
    try:
        bed.start(timeout)
        yield bed
    finally:
        bed.stop()
