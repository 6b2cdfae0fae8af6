"""The short chaos run of ``make test``: one seed, a SIGKILL of every component once.

A 16-trial adaptive ASHA search runs once without faults and once while the relay, searcher,
scheduler, tracker, API, agent, a trial process, nats-server and PostgreSQL are each SIGKILLed at
a seeded random moment (each death confirmed: exit by SIGKILL and a new pid, or the trial's exit
by SIGKILL in the log). Every invariant of :mod:`tests.chaos.checks` must hold; ``make chaos`` runs the full plan
over 20 seeds.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.chaos.driver import short_plan
from tests.chaos.suite import run_seed, seed_report

SEED = int(os.environ.get("CAIRN_CHAOS_SEED", "7"))

pytestmark = pytest.mark.timeout(600)


def test_asha_search_keeps_every_invariant_when_each_component_is_killed() -> None:
    """A SIGKILL of each component mid-search: COMPLETED, clean log, same requests and best
    trial as the fault-free run, projections rebuilt from 0 equal to the live ones."""
    result = run_seed(SEED, short_plan, step_s=0.15, timeout=240)
    report = seed_report(result)
    print(report)
    assert len(result.faults) == len(short_plan(random.Random(SEED))), report
    assert result.held, report
