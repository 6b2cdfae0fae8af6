"""The Slurm test bed itself: jobs run, complete, are cancelled, hit their time limit (after a
warning signal), and srun starts several tasks inside a batch job."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

from tests.slurm.bed import NODE_CPUS, SlurmBed, wait_for


def _job_dir(bed: SlurmBed) -> Path:
    path = bed.jobs_dir / uuid.uuid4().hex[:8]
    path.mkdir()
    return path


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_node_is_idle_with_declared_cpus(slurm_bed: SlurmBed) -> None:
    """The bed's one node is up, idle, and has the CPUs slurm.conf declares."""
    out = slurm_bed.run("sinfo", "-h", "-N", "-o", "%N %t %c %P")
    rows = {line.split()[3].rstrip("*"): line.split() for line in out.splitlines()}
    assert rows["debug"][:3] == [slurm_bed.node, "idle", str(NODE_CPUS)]
    assert "batch" in rows


def test_wrap_job_completes_and_writes_file(slurm_bed: SlurmBed) -> None:
    """An sbatch --wrap job runs to COMPLETED and the file it writes exists."""
    work = _job_dir(slurm_bed)
    job = slurm_bed.sbatch("--wrap", "echo written-by-$SLURM_JOB_ID > result.txt", cwd=work)
    assert slurm_bed.wait_state(job, {"COMPLETED", "FAILED"}, 60) == "COMPLETED"
    assert (work / "result.txt").read_text().strip() == f"written-by-{job}"
    assert (work / f"slurm-{job}.out").exists()


def test_failing_job_is_failed(slurm_bed: SlurmBed) -> None:
    """A job whose script exits non-zero ends FAILED with that exit code."""
    job = slurm_bed.sbatch("--wrap", "exit 3", cwd=_job_dir(slurm_bed))
    assert slurm_bed.wait_state(job, {"COMPLETED", "FAILED"}, 60) == "FAILED"
    assert "ExitCode=3:0" in slurm_bed.run("scontrol", "show", "job", job)


def test_scancel_running_job(slurm_bed: SlurmBed) -> None:
    """scancel of a running job shows CANCELLED in squeue -t all and its process is gone."""
    work = _job_dir(slurm_bed)
    job = slurm_bed.sbatch("--wrap", "echo $$ > pid; exec sleep 300", cwd=work)
    slurm_bed.wait_state(job, "RUNNING", 60)
    pid = wait_for(
        "the job's pid file",
        lambda: int(text) if (text := _read(work / "pid")) else None,
        30,
    )
    assert _pid_alive(pid)
    slurm_bed.run("scancel", job)
    assert slurm_bed.wait_state(job, {"CANCELLED", "COMPLETED", "FAILED"}, 60) == "CANCELLED"
    wait_for("the cancelled job's process to exit", lambda: None if _pid_alive(pid) else True, 30)


def test_srun_two_tasks_inside_batch_job(slurm_bed: SlurmBed) -> None:
    """srun inside an sbatch --ntasks=2 script starts two tasks on the one node."""
    work = _job_dir(slurm_bed)
    script = work / "two.sh"
    script.write_text(
        "#!/bin/bash\n"
        "srun --ntasks=2 bash -c 'echo \"task $SLURM_PROCID of $SLURM_NTASKS on $SLURMD_NODENAME\"'"
        " > tasks.txt\n"
    )
    job = slurm_bed.sbatch("--ntasks=2", str(script), cwd=work)
    assert slurm_bed.wait_state(job, {"COMPLETED", "FAILED"}, 60) == "COMPLETED", _read(
        work / f"slurm-{job}.out"
    )
    lines = sorted((work / "tasks.txt").read_text().splitlines())
    assert lines == [f"task {rank} of 2 on {slurm_bed.node}" for rank in (0, 1)]


def test_time_limit_warns_then_times_out(slurm_bed: SlurmBed) -> None:
    """A --time=1 job gets --signal=B:USR1@50 in its batch shell, then ends TIMEOUT.

    Slurm checks time limits every 30 s or so, so this takes 60 to 100 s.
    """
    work = _job_dir(slurm_bed)
    script = work / "limit.sh"
    script.write_text(
        "#!/bin/bash\n"
        "trap 'echo $(date +%s) >> usr1.txt' USR1\n"
        "date +%s > start.txt\n"
        "while true; do sleep 1; done\n"
    )
    job = slurm_bed.sbatch("--time=1", "--signal=B:USR1@50", str(script), cwd=work)
    slurm_bed.wait_state(job, "RUNNING", 60)
    warned = wait_for("the USR1 warning", lambda: _read(work / "usr1.txt") or None, 90, 0.5)
    assert slurm_bed.job_state(job) == "RUNNING"
    assert slurm_bed.wait_state(job, {"TIMEOUT", "COMPLETED", "FAILED"}, 120) == "TIMEOUT"
    start = int(_read(work / "start.txt"))
    first_warning = int(warned.split()[0])
    assert 0 <= first_warning - start < 60
    times = dict(
        re.findall(r"(StartTime|EndTime)=(\S+)", slurm_bed.run("scontrol", "show", "job", job))
    )
    assert times["StartTime"] != times["EndTime"]


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""
