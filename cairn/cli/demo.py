"""``cairn demo``: start the embedded cluster and run a real adaptive ASHA search on it."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from cairn.client import Client
from cairn.errors import CairnError
from cairn.local import cluster
from cairn.local.state import read_state

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits"
BASELINE_ACCURACY = 0.9
TERMINAL = ("COMPLETED", "CANCELED", "ERROR")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Adds ``cairn demo``."""
    p = subparsers.add_parser("demo", help="start the embedded cluster and run an ASHA search")
    p.add_argument(
        "--data-dir", type=Path, default=None, help="cluster data dir (default ./.cairn)"
    )
    p.add_argument("--slots", type=int, default=2, help="CPU slots of the local agent")
    p.add_argument("--config", type=Path, default=EXAMPLE / "adaptive.yaml")
    p.add_argument("--code", type=Path, default=EXAMPLE)
    p.add_argument("--stop", action="store_true", help="stop the cluster when the search is done")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for the search")
    p.set_defaults(handler=run)


def _cli(*argv: str) -> int:
    from cairn.cli import main

    return main(list(argv))


def run(args: argparse.Namespace) -> int:
    """Starts the cluster, submits the search, follows it, and reports the best trial."""
    data_dir = (args.data_dir or cluster.default_data_dir()).resolve()
    print(f"==> starting the embedded cluster in {data_dir}")
    code = _cli("up", "--data-dir", str(data_dir), "--slots", str(args.slots))
    if code != 0:
        return code
    state = read_state(data_dir)
    if state is None or not state.api_url:
        raise CairnError("the cluster did not record its API address")
    client = Client(state.api_url)
    client.login("admin", os.environ.get("CAIRN_ADMIN_PASSWORD", "admin"))
    print(f"==> submitting {args.config} (code: {args.code})")
    exp_id = client.create_experiment(args.config.read_text(), args.code)
    print(f"==> experiment {exp_id} submitted; following it")
    summary = asyncio.run(_follow(state.dsn, exp_id, args.timeout))
    ok = _report(summary)
    print()
    print(f"API:        {state.api_url}/api/v1/health")
    print(f"Data dir:   {data_dir} (logs in {data_dir / 'logs'})")
    if args.stop:
        _cli("down", "--data-dir", str(data_dir))
    else:
        print(
            f"The cluster is still running: `cairn status --data-dir {data_dir}`; stop it with `cairn down`."
        )
    return 0 if ok else 1


async def _follow(dsn: str, exp_id: int, timeout: float) -> dict[str, Any]:
    """Polls the log (the local cluster's database) and draws a progress bar until the end."""
    from events.store import EventStore

    store = await EventStore.connect(dsn, max_size=2)
    try:
        deadline = time.monotonic() + timeout
        summary: dict[str, Any] = {}
        while time.monotonic() < deadline:
            summary = await _summarize(store, exp_id)
            _draw(summary)
            if summary["state"] in TERMINAL:
                break
            await asyncio.sleep(1.0)
        else:
            raise CairnError(f"experiment {exp_id} did not finish in {timeout:.0f}s")
        print()
        return summary
    finally:
        await store.close()


async def _summarize(store: Any, exp_id: int) -> dict[str, Any]:
    types = [
        "ExperimentSubmitted",
        "ExperimentStateChanged",
        "TrialRequested",
        "TrialStateChanged",
        "ValidationReported",
    ]
    trials: dict[str, dict[str, Any]] = {}
    state, max_trials = "ACTIVE", 0
    prefix = f"{exp_id}."
    async for event in store.iter_all(0, types=types):
        p = event.payload
        if event.type == "ExperimentSubmitted" and p["experiment_id"] == exp_id:
            max_trials = int(p["config"]["searcher"].get("max_trials") or 1)
        elif event.type == "ExperimentStateChanged" and p["experiment_id"] == exp_id:
            state = p["state"]
        elif event.type == "TrialRequested" and p["experiment_id"] == exp_id:
            trials[p["trial_id"]] = {"hparams": p["hparams"], "state": "ACTIVE", "last": None}
        elif p.get("trial_id", "").startswith(prefix) and p["trial_id"] in trials:
            if event.type == "TrialStateChanged":
                trials[p["trial_id"]]["state"] = p["state"]
            elif event.type == "ValidationReported":
                trials[p["trial_id"]]["last"] = p
    return {"id": exp_id, "state": state, "max_trials": max_trials, "trials": trials}


def _draw(summary: dict[str, Any]) -> None:
    trials = summary["trials"]
    done = sum(1 for t in trials.values() if t["state"] in TERMINAL)
    total = max(summary["max_trials"], len(trials), 1)
    best = _best(trials)
    width = 30
    filled = int(width * done / total)
    acc = (
        f" best val acc {best[1]['last']['metrics'].get('validation_accuracy', 0):.3f}"
        if best
        else ""
    )
    line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} trials closed, {len(trials) - done} live{acc}  {summary['state']:<20}"
    sys.stdout.write(line)
    sys.stdout.flush()


def _best(trials: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    scored = [
        (t, v) for t, v in trials.items() if v["last"] and "validation_loss" in v["last"]["metrics"]
    ]
    return (
        min(scored, key=lambda tv: tv[1]["last"]["metrics"]["validation_loss"]) if scored else None
    )


def _report(summary: dict[str, Any]) -> bool:
    best = _best(summary["trials"])
    print(f"experiment {summary['id']}: {summary['state']}, {len(summary['trials'])} trials")
    if best is None:
        print("no trial reported a validation metric")
        return False
    trial_id, info = best
    metrics = info["last"]["metrics"]
    acc = float(metrics.get("validation_accuracy", 0.0))
    print(
        f"best trial {trial_id}: validation_loss {metrics['validation_loss']:.4f}, validation_accuracy {acc:.4f} at {info['last']['steps_completed']} batches"
    )
    print(
        "hyperparameters: "
        + ", ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in sorted(info["hparams"].items())
        )
    )
    verdict = "beats" if acc > BASELINE_ACCURACY else "does NOT beat"
    print(f"{verdict} the {BASELINE_ACCURACY:.2f} accuracy baseline")
    return summary["state"] == "COMPLETED" and acc > BASELINE_ACCURACY
