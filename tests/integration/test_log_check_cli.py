"""``python -m events.domain.check DSN`` reads a real log and reports what is broken."""

from __future__ import annotations

import subprocess
import sys

from events.domain.types import SlotsAllocated, TrialExited
from events.log.store import EventStore
from tests.conftest import ROOT


def run_check(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "events.domain.check", db_url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


async def test_check_cli_reports_a_duplicate_decision(store: EventStore, db_url: str) -> None:
    """A clean log exits 0; the same allocation appended twice exits 1 and names the finding."""
    first = SlotsAllocated(trial_id=11, allocation_id="11.1", placements={"a1": ["s0"]})
    await store.append("trial-11", [first])
    done = TrialExited(trial_id=11, run_id=1, allocation_id="11.1", outcome="completed")
    await store.append("trial-11", [done])
    clean = run_check(db_url)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "0 findings" in clean.stdout

    await store.append("trial-11", [first])
    broken = run_check(db_url)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "allocated-twice at position 3" in broken.stdout
    assert "1 findings (allocated-twice 1)" in broken.stdout
