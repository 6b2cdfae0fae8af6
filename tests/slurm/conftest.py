"""The Slurm test bed (``make test-slurm``): munged, slurmctld and one slurmd of Debian's Slurm
22.05, started as root with everything under a scratch directory (:mod:`tests.slurm.bed`), for
the whole session. Clients reach it through ``SLURM_CONF`` (``slurm_bed.env()``).

Skipped unless ``CAIRN_SLURM=1`` (``make test`` never runs it), and skipped with the reason
when the machine cannot run it (not root, Slurm or MUNGE not installed:
``deploy/slurm/install.sh``). The daemons, and any job step left, are stopped at the end.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cairn.local.servers import ServerProcess
from events.log.store import EventStore
from tests.slurm.bed import SlurmBed, running_bed, slurm_available
from tests.slurm.cluster import SlurmCluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips this directory's tests unless the Slurm suite was asked for."""
    if os.environ.get("CAIRN_SLURM") == "1":
        return
    skip = pytest.mark.skip(reason="Slurm test bed: run with make test-slurm (CAIRN_SLURM=1)")
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def slurm_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmBed]:
    """A running single-node Slurm cluster for the session, its node idle at the start."""
    reason = slurm_available()
    if reason is not None:
        pytest.skip(reason)
    yield from running_bed(tmp_path_factory.mktemp("slurm"))


@pytest.fixture
async def slurm_cluster(
    slurm_bed: SlurmBed,
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    tmp_path: Path,
) -> AsyncIterator[SlurmCluster]:
    """Every cairn service as a process, pools ``hpc`` and ``hpc-short`` on the bed's Slurm;
    every job of the test cancelled at the end."""
    cluster = SlurmCluster(db_url, nats_server.url, tmp_path, bed=slurm_bed)
    cluster.jobs_before = max(cluster.all_job_ids(), default=0)
    cluster.prepare()
    cluster.write_config()
    cluster.start_services("--agent-timeout", "15", timeout=30)
    try:
        await cluster.login()
        yield cluster
    finally:
        for job_id in cluster.squeue():
            slurm_bed.run("scancel", job_id, check=False)
        cluster.stop()
        ended = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED")
        for job_id in cluster.squeue():  # ended before the next test's allocations are named
            slurm_bed.wait_state(job_id, set(ended), timeout=60)
