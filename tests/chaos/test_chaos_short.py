"""The short chaos run of ``make test``: one seed, a SIGKILL of one component of every class.

A 16-trial adaptive ASHA search runs once without faults and once while a decider, the tracker,
the API, the agent, a trial process, nats-server and PostgreSQL are each SIGKILLed at a seeded
random moment (each death confirmed: exit by SIGKILL and a new pid, or the trial's exit -9 in the
log). Every invariant of :mod:`tests.chaos.checks` must hold; ``make chaos`` runs the full plan
over 20 seeds.
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.driver import short_plan
from tests.chaos.suite import run_seed, seed_report

SEED = int(os.environ.get("CAIRN_CHAOS_SEED", "7"))

pytestmark = pytest.mark.timeout(600)


def test_asha_search_keeps_every_invariant_when_each_component_class_is_killed() -> None:
    """A SIGKILL of each component class mid-search: COMPLETED, clean log, same requests and best
    trial as the fault-free run, projections rebuilt from 0 equal to the live ones."""
    result = run_seed(SEED, short_plan, timeout=240)
    report = seed_report(result)
    print(report)
    assert len(result.faults) == len(short_plan(__import__("random").Random(SEED))), report
    assert result.held, report
