"""``sbatch``, ``squeue`` and ``scancel``, run as subprocesses; their failures are
:class:`SlurmCommandError` (the one error of this package)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.scheduler.slurm.script import JOB_NAME_PREFIX, allocation_of_job

COMMAND_TIMEOUT = 60.0
"""Seconds a Slurm command may take before it counts as failed."""

_FIELDS = "%i|%j|%T|%r|%N"


class SlurmCommandError(Exception):
    """A Slurm command failed, timed out or printed what cairn cannot read."""


@dataclass(frozen=True)
class QueuedJob:
    """One job of cairn's as ``squeue`` shows it."""

    job_id: str
    allocation_id: str
    state: str
    reason: str = ""
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Queue:
    """One ``squeue`` reading of cairn's jobs, by job id."""

    jobs: Mapping[str, QueuedJob] = field(default_factory=dict)

    def named_for(self, allocation_id: str) -> list[QueuedJob]:
        """The jobs whose name says they are ``allocation_id``'s."""
        return [j for j in self.jobs.values() if j.allocation_id == allocation_id]


async def _run(argv: list[str], env: Mapping[str, str] | None, stdin: bytes | None = None) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        raise SlurmCommandError(f"{argv[0]}: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), COMMAND_TIMEOUT)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SlurmCommandError(f"{argv[0]} took more than {COMMAND_TIMEOUT:g}s") from None
    if proc.returncode != 0:
        text = (err or out).decode(errors="replace").strip()[:2000]
        raise SlurmCommandError(f"{argv[0]} exited {proc.returncode}: {text}")
    return out.decode(errors="replace")


@dataclass(frozen=True)
class SlurmCommands:
    """Runs Slurm's commands with ``env`` (``None``: this process's environment, e.g. with
    ``SLURM_CONF``)."""

    env: Mapping[str, str] | None = None

    async def submit(self, script: str, directory: Path) -> str:
        """``sbatch --parsable`` of ``script`` (written to ``directory`` first); the job id."""
        path = await asyncio.to_thread(_write_script, directory, script)
        out = await _run(["sbatch", "--parsable", str(path)], job_environment(self.env))
        job_id = out.strip().split(";", 1)[0]
        if not job_id.isdigit():
            raise SlurmCommandError(f"sbatch printed no job id: {out.strip()[:200]!r}")
        return job_id

    async def queue(self) -> Queue:
        """Every job of cairn's Slurm still knows of (any state)."""
        out = await _run(
            ["squeue", "--noheader", "--states=all", f"--user={_user()}", f"--format={_FIELDS}"],
            self.env,
        )
        jobs: dict[str, QueuedJob] = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) != 5 or not parts[1].startswith(JOB_NAME_PREFIX):
                continue
            job_id, name, state, reason, nodes = (p.strip() for p in parts)
            allocation = allocation_of_job(name)
            if allocation is None or not job_id.isdigit():
                continue
            jobs[job_id] = QueuedJob(
                job_id=job_id,
                allocation_id=allocation,
                state=state.split()[0] if state else "UNKNOWN",
                reason="" if reason in ("None", "(null)") else reason,
                nodes=tuple(n for n in nodes.split(",") if n and n != "(null)"),
            )
        return Queue(jobs)

    async def cancel(self, job_id: str) -> None:
        """``scancel`` of job ``job_id`` (its agents get SIGTERM, then SIGKILL after Slurm's
        ``KillWait``)."""
        await _run(["scancel", job_id], self.env)


JOB_VARIABLES = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "SLURM_CONF")
"""The only variables of the scheduler's environment ``sbatch`` sees, and so the job: the job
inherits what its submitter had (``--export=NONE`` would keep it from it, but makes Slurm load a
login environment on the node, which takes a minute), and nothing of the scheduler's beyond these
is the job's business."""


def job_environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` (``None``: this process's) reduced to :data:`JOB_VARIABLES`."""
    source = os.environ if env is None else env
    return {k: source[k] for k in JOB_VARIABLES if k in source}


def _write_script(directory: Path, script: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / "job.sh"
    path.write_text(script)
    path.chmod(0o700)
    return path


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name
