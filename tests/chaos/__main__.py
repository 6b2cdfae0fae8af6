"""``python -m tests.chaos``: run chaos seeds one after another and print what held.

``make chaos`` runs seeds 1-20 with the full fault plan. Exit status 1 if any invariant broke.
"""

from __future__ import annotations

import argparse
import sys

from tests.chaos.driver import full_plan, short_plan
from tests.chaos.suite import run_seed, seed_report, summary_table


def seeds(text: str) -> list[int]:
    """``1-20``, ``3,7,9`` or ``5``."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    """Runs the seeds sequentially; returns 1 if any invariant broke."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seeds", type=seeds, default=seeds("1-20"), help="e.g. 1-20 or 3,7")
    parser.add_argument("--plan", choices=["full", "short"], default="full")
    parser.add_argument("--trials", type=int, default=16, help="the search's max_trials")
    parser.add_argument("--step-s", type=float, default=0.25, help="seconds per batch")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--keep", action="store_true", help="keep each cluster's directory")
    args = parser.parse_args(argv)
    plan = full_plan if args.plan == "full" else short_plan
    results = []
    for seed in args.seeds:
        result = run_seed(
            seed, plan, trials=args.trials, step_s=args.step_s, timeout=args.timeout, keep=args.keep
        )
        results.append(result)
        print(seed_report(result), flush=True)
    print()
    print(summary_table(results))
    broken = [r.seed for r in results if not r.held]
    print(
        f"\n{len(results) - len(broken)}/{len(results)} seeds held every invariant"
        + (f"; broken: {broken}" if broken else "")
    )
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
