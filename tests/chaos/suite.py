"""One chaos seed from start to verdict, and the tables that report a set of seeds.

:func:`run_seed` starts a fresh embedded cluster, runs the seed's search once without faults
(the reference) and once under the seed's fault plan, checks every invariant of
:mod:`tests.chaos.checks` and stops the cluster.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos import checks
from tests.chaos.driver import Fault, Local, Run, asha_config, full_plan, run_experiment

Plan = Callable[[random.Random], list[Fault]]


@dataclass
class SeedResult:
    """What one seed did: its runs, its faults and the invariants checked after them."""

    seed: int
    seconds: float = 0.0
    reference: Run | None = None
    chaos: Run | None = None
    checks: list[checks.Check] = field(default_factory=list)

    @property
    def faults(self) -> list[Fault]:
        """The faults injected into the chaos run."""
        return self.chaos.faults if self.chaos is not None else []

    @property
    def held(self) -> bool:
        """True when every check held (an unconfirmed fault is a broken check too)."""
        return bool(self.checks) and all(c.held for c in self.checks)

    def broken(self) -> list[checks.Check]:
        """The checks that did not hold."""
        return [c for c in self.checks if not c.held]


def faults_check(faults: list[Fault]) -> checks.Check:
    """Every fault was shown to have happened and its component came back."""
    bad = [f"{f.label}: {f.error}" for f in faults if f.error]
    bad += [
        f"{f.label}: never back"
        for f in faults
        if not f.error and f.back_s is None and f.kind != "kill-trial"  # it may have been done
    ]
    late = [f.label for f in faults if not f.during_search]
    detail = "; ".join(bad) if bad else f"{len(faults)} confirmed"
    if late:
        detail += f" ({len(late)} after the search ended: {late})"
    return checks.Check("faults", not bad, detail)


def run_seed(
    seed: int,
    plan: Plan = full_plan,
    *,
    trials: int = 16,
    steps: int = 40,
    step_s: float = 0.05,
    timeout: float = 300.0,
    keep: bool = False,
) -> SeedResult:
    """Runs seed ``seed`` on a fresh cluster: reference run, chaos run, checks.

    Args:
        seed: the experiment seed and the seed of the fault plan and its moments.
        plan: makes the list of faults from a seeded random generator.
        trials: the search's ``max_trials``.
        steps: each trial's length in batches (the search's ``max_time``).
        step_s: seconds each batch sleeps (how long the search lasts).
        timeout: seconds each run may take before it counts as hung.
        keep: leave the cluster's directory (and its logs) behind.
    """
    result = SeedResult(seed)
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"cairn-chaos-{seed}-"))
    local = Local(scratch / "home")
    try:
        local.up()
        config = asha_config(scratch / "asha.yaml", seed, trials=trials, steps=steps, step_s=step_s)
        result.reference = run_experiment(local, config, seed, scratch=scratch, timeout=timeout)
        ref = result.reference.exp_id
        if result.reference.state != "COMPLETED":
            result.checks.append(
                checks.Check("reference", False, f"fault-free run {result.reference.state}")
            )
            return result
        baseline = checks.requests_of(local, ref)
        baseline_best = checks.best_request(local, ref)
        faults = plan(random.Random(seed))
        result.chaos = run_experiment(local, config, seed, faults, scratch=scratch, timeout=timeout)
        exp = result.chaos.exp_id
        result.checks = [
            faults_check(result.chaos.faults),
            checks.completed(local, exp),
            checks.log_invariants(local),
            checks.same_requests(local, exp, baseline),
            checks.same_best(local, exp, baseline_best),
            checks.projections_rebuild(local),
            checks.all_alive(local),
        ]
    except Exception as exc:  # a crash of the driver is a broken run, reported as such
        result.checks.append(checks.Check("driver", False, f"{type(exc).__name__}: {exc}"))
    finally:
        result.seconds = round(time.monotonic() - started, 1)
        local.down()
        if keep or not result.held:
            print(f"seed {seed}: cluster directory kept at {scratch}", flush=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    return result


# --------------------------------------------------------------------------- reports


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fault_table(result: SeedResult) -> str:
    """One line per fault of a seed: when, what, the evidence and the recovery times."""
    lines = [f"{'at_s':>6}  {'fault':<22} {'back_s':>7} {'write_s':>8}  evidence"]
    for f in result.faults:
        evidence = f.evidence + (f"  ERROR {f.error}" if f.error else "")
        if not f.during_search:
            evidence += "  (after the search ended)"
        lines.append(
            f"{f.at:>6.1f}  {f.label:<22} {_secs(f.back_s):>7} {_secs(f.write_s):>8}  {evidence}"
        )
    return "\n".join(lines)


def seed_report(result: SeedResult) -> str:
    """A seed's faults and checks, as printed after each seed."""
    lines = [f"== seed {result.seed}: {'held' if result.held else 'BROKEN'} ({result.seconds}s)"]
    if result.faults:
        lines.append(fault_table(result))
    for c in result.checks:
        lines.append(f"  {'ok ' if c.held else 'BAD'} {c.name:<12} {c.detail}")
    return "\n".join(lines)


CHECK_NAMES = ("faults", "completed", "log", "requests", "best", "projections", "alive")


def summary_table(results: list[SeedResult]) -> str:
    """One row per seed (faults, run times, each invariant), then recovery times per component."""
    head = f"{'seed':>4} {'faults':>6} {'ref_s':>6} {'chaos_s':>7}  " + " ".join(
        f"{n:<11}" for n in CHECK_NAMES
    )
    lines = [head]
    for r in results:
        held = {c.name: c.held for c in r.checks}
        marks = " ".join(
            f"{'-' if n not in held else ('ok' if held[n] else 'BROKEN'):<11}" for n in CHECK_NAMES
        )
        extra = [c.name for c in r.checks if c.name not in CHECK_NAMES and not c.held]
        ref = r.reference.seconds if r.reference else 0.0
        chaos = r.chaos.seconds if r.chaos else 0.0
        lines.append(
            f"{r.seed:>4} {len(r.faults):>6} {ref:>6.1f} {chaos:>7.1f}  {marks}"
            + (f" {' '.join(extra)} BROKEN" if extra else "")
        )
    lines.append("")
    lines.append(recovery_table([f for r in results for f in r.faults]))
    return "\n".join(lines)


def recovery_table(faults: list[Fault]) -> str:
    """Per kind of fault: how often, and the median and worst seconds to back and to writing."""
    by: dict[str, list[Fault]] = {}
    for f in faults:
        by.setdefault(f.label, []).append(f)

    def stats(values: list[float | None]) -> str:
        seen = sorted(v for v in values if v is not None)
        if not seen:
            return f"{'-':>6} {'-':>6}"
        return f"{seen[len(seen) // 2]:>6.1f} {seen[-1]:>6.1f}"

    lines = [f"{'fault':<22} {'n':>3} {'errors':>6}  back_s med/max  write_s med/max"]
    for label in sorted(by):
        group = by[label]
        errors = sum(1 for f in group if f.error)
        lines.append(
            f"{label:<22} {len(group):>3} {errors:>6}  {stats([f.back_s for f in group])}"
            f"    {stats([f.write_s for f in group])}"
        )
    return "\n".join(lines)
