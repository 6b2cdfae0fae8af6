"""``cairn up --replicas N``: which processes it starts and which command each one runs."""

from __future__ import annotations

import subprocess
import sys

from cairn.local.topology import DECIDERS, SERVICES, replica_names, service_of
from tests.helpers import ROOT


def test_each_decider_gets_numbered_replicas_and_others_stay_single() -> None:
    """With 3 replicas the deciders run as name, name-2, name-3 (same module); others once."""
    for service in SERVICES:
        names = replica_names(service, 3)
        if service in DECIDERS:
            assert names == [service, f"{service}-2", f"{service}-3"]
        else:
            assert names == [service]
        assert {service_of(n) for n in names} == {service}
    assert service_of("agent-2") == "agent", "a further agent on this machine runs the agent"
    assert service_of("tracker-2") == "tracker-2", "only deciders and agents are numbered"


def test_replicas_out_of_range_is_a_usage_error() -> None:
    """``--replicas 0`` (or a non-number) exits 2 and names the flag; nothing is started."""
    for value in ("0", "six"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "cairn",
                "up",
                "--replicas",
                value,
                "--data-dir",
                "/nonexistent",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert "--replicas must be 1 to" in done.stderr
