"""A cairn cluster of processes whose pools ``hpc`` and ``hpc-short`` are the test bed's Slurm."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cairn.local.layout import join_token_file
from cairn.local.servers import bare_nats_url
from events.domain import names
from events.log.store import EventStore
from tests.e2e.harness import Cluster, events_of
from tests.helpers import ROOT
from tests.slurm.bed import SlurmBed

SHORT_LIMIT_MINUTES = 1
"""The time limit of pool ``hpc-short``'s jobs (Slurm's smallest)."""


@dataclass
class SlurmCluster(Cluster):
    """Every service as a process (no agent: the Slurm jobs start theirs), with the bed."""

    bed: SlurmBed | None = None
    jobs_before: int = 0
    """The highest job id of the bed before this cluster started (the bed outlives a test, and
    Slurm shows ended jobs for a while): :meth:`squeue` shows only later ones."""

    def write_config(self) -> None:
        """The cluster config: checkpoints under the work dir, and the two Slurm pools."""
        token = join_token_file(self.workdir)
        common = {
            "partition": "debug",
            "slots_per_node": 2,
            "api_url": self.api_url,
            "nats_url": bare_nats_url(self.nats_url),
            "join_token_file": str(token),
            "work_root": str(self.workdir / "slurm"),
            "poll_seconds": 1,
            "preemption_warning": 0,
            "pythonpath": str(ROOT),
        }
        pools = [
            {"pool_name": "hpc", "resource_manager": "slurm", "slurm": common},
            {
                "pool_name": "hpc-short",
                "resource_manager": "slurm",
                "slurm": {**common, "time_limit_minutes": SHORT_LIMIT_MINUTES},
            },
        ]
        config = {
            "checkpoint_storage": {"allowed_roots": [str(self.workdir)]},
            "resource_pools": pools,
        }
        path = self.workdir / "cluster.yaml"
        path.write_text(json.dumps(config))
        self.cluster_config = path

    def base_env(self) -> dict[str, str]:
        env = super().base_env()
        assert self.bed is not None
        return {**env, **self.bed.env()}

    def all_job_ids(self) -> list[int]:
        """Every job id the bed's squeue shows (any state, anyone's)."""
        assert self.bed is not None
        out = self.bed.run("squeue", "--noheader", "--states=all", "--format=%i")
        return [int(line) for line in out.split()]

    def squeue(self) -> dict[str, tuple[str, str]]:
        """cairn's jobs Slurm knows of: job id -> (name, state)."""
        assert self.bed is not None
        out = self.bed.run("squeue", "--noheader", "--states=all", "--format=%i|%j|%T")
        jobs = {}
        for line in out.splitlines():
            job_id, name, state = line.strip().split("|")
            if name.startswith("cairn-") and int(job_id) > self.jobs_before:
                jobs[job_id] = (name, state)
        return jobs


async def slurm_jobs(store: EventStore) -> dict[str, dict[str, Any]]:
    """Every job cairn recorded: job id -> its SlurmJobSubmitted payload plus ``state``."""
    jobs: dict[str, dict[str, Any]] = {}
    for e in await events_of(store, "SlurmJobSubmitted", "SlurmJobObserved"):
        if e.type == "SlurmJobSubmitted":
            jobs[e.payload["job_id"]] = {**e.payload, "state": "SUBMITTED"}
        elif e.payload["job_id"] in jobs:
            jobs[e.payload["job_id"]]["state"] = e.payload["state"]
    return jobs


async def trial_runs(store: EventStore, trial_id: int) -> list[Mapping[str, Any]]:
    """The trial's SlotsAllocated, TrialStarted and TrialExited payloads, with their type."""
    stream = await store.read_stream(names.trial_stream(trial_id))
    kinds = ("SlotsAllocated", "TrialStarted", "TrialExited")
    return [{"type": e.type, **e.payload} for e in stream if e.type in kinds]
