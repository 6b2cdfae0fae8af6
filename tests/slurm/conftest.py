"""The Slurm test bed (``make test-slurm``): munged, slurmctld and one slurmd of Debian's Slurm
22.05, started as root with everything under a scratch directory (:mod:`tests.slurm.bed`), for
the whole session. Clients reach it through ``SLURM_CONF`` (``slurm_bed.env()``).

Skipped unless ``CAIRN_SLURM=1`` (``make test`` never runs it), and skipped with the reason
when the machine cannot run it (not root, Slurm or MUNGE not installed:
``deploy/slurm/install.sh``). The daemons, and any job step left, are stopped at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.bed import SlurmBed, running_bed, slurm_available


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
