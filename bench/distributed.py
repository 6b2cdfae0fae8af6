"""Distributed training: DDP on the digits MLP with 4 ranks on two agents vs 1 rank.

A cluster of real processes with two agents of 2 CPU slots each runs ``examples/digits/
distributed.yaml`` (``python3 -m cairn.launch.torch_distributed``, gloo) twice with the same
global batch and number of batches: with ``slots_per_trial: 4`` (a rendezvous across both
agents) and with ``slots_per_trial: 1``. Two figures:

1. Training samples/s (global batch x batches / seconds between the chief's first and last
   validation lines, by the script's own timer): 4 ranks beside 1 rank. On a machine with fewer
   cores than ranks the 4-rank run shares the cores, so the ratio measures overhead, not speed-up.
2. Time from ``SlotsAllocated`` to every rank training: the allocation's ``recorded_at`` to the
   latest ``[rank=N] training: first batch`` log line of the run (the agents' rendezvous,
   ``torchrun``'s start, imports, the process group and the first step on every rank).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import BenchContext, Report, per_second, progress
from bench.trials import (
    FineMeasure,
    _Cluster,
    _cluster_on,
    _config,
    _run_one_trial,
)
from events.log.store import EventStore

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "examples" / "digits"
HPARAMS: dict[str, Any] = {"lr": 0.003, "hidden": 64, "dropout": 0.0, "batch_size": 64}
VALIDATE_EVERY = 50
_VALIDATION = re.compile(r"^\[rank=0\] batch (\d+): .*, ([\d.]+)s\)\s*$")
_FIRST = re.compile(r"^\[rank=(\d+)\] training: first batch")


async def _one_run(
    cluster: _Cluster, store: EventStore, slots: int, batches: int, tmp: Path
) -> dict[str, Any]:
    """Runs the example with ``slots`` ranks; returns its rate and start-up figures."""
    hparams = {**HPARAMS, "max_batches": batches, "validate_every": VALIDATE_EVERY}
    config = _config(DIGITS / "distributed.yaml", hparams, tmp / f"ckpt-{slots}")
    config["name"] = f"bench-ddp-{slots}"
    config["max_restarts"] = 0
    config["resources"] = {"slots_per_trial": slots}
    ended = await _run_one_trial(cluster, store, config, DIGITS, timeout=600)
    trial_id = ended.trial_id
    allocated = next(e for e in ended.events if e.type == "SlotsAllocated")
    rows: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the agents ship their last lines around the exit
        async with store.connection() as conn:
            rows = await conn.fetch(
                "SELECT ts, line FROM task_logs WHERE trial_id = $1 ORDER BY id", trial_id
            )
        if any(f"batch {batches}:" in r["line"] for r in rows):
            break
        await asyncio.sleep(0.2)
    timer = [
        (int(m.group(1)), float(m.group(2)))
        for m in (_VALIDATION.match(r["line"]) for r in rows)
        if m is not None
    ]
    firsts = {int(m.group(1)): r["ts"] for r in rows if (m := _FIRST.match(r["line"]))}
    if len(timer) < 2 or len(firsts) < slots:
        raise RuntimeError(f"run with {slots} ranks left too few log lines: {rows[-20:]}")
    (b0, t0), (b1, t1) = timer[0], timer[-1]
    samples = (b1 - b0) * int(HPARAMS["batch_size"])
    ready = max(firsts.values())
    return {
        "experiment_id": ended.experiment_id,
        "ranks": slots,
        "agents": len(allocated.payload["placements"]),
        "samples": samples,
        "train_s": round(t1 - t0, 3),
        "samples_per_s": round(per_second(samples, t1 - t0), 1),
        "allocated_to_all_training_s": round((ready - allocated.recorded_at).total_seconds(), 3),
    }


async def run(ctx: BenchContext) -> Report:
    """Starts a two-agent cluster, runs 4 ranks then 1 rank; returns the figures."""
    report = Report()
    batches = ctx.scaled(600, minimum=2 * VALIDATE_EVERY)
    work = ctx.tmp / "distributed"
    work.mkdir(parents=True, exist_ok=True)
    async with _cluster_on(ctx, "bench_distributed", work) as (cluster, store):
        progress("distributed: starting the services and two 2-slot agents")
        await asyncio.to_thread(cluster.start_services)
        for agent in ("a", "b"):
            cluster.start_agent(agent, 2, "--heartbeat", "0.5")
        cluster.http = aiohttp.ClientSession()
        await cluster._login()
        while len(await store.read_all(types=["AgentRegistered"], limit=10)) < 2:
            cluster.check_alive()
            await asyncio.sleep(0.1)
        results = {}
        for slots in (4, 1):
            progress(f"distributed: DDP digits, {slots} rank(s), {batches} batches")
            results[slots] = await _one_run(cluster, store, slots, batches, work)
            progress(
                f"  {results[slots]['samples_per_s']:,.0f} samples/s; SlotsAllocated -> all "
                f"ranks training {results[slots]['allocated_to_all_training_s']:.2f}s"
            )
    four, one = results[4], results[1]
    report.measures.append(
        FineMeasure(
            "DDP digits training, 4 ranks on 2 agents",
            four["samples_per_s"],
            one["samples_per_s"],
            "1 rank",
            unit="samples/s",
            count=four["samples"],
            notes=f"scaling efficiency {four['samples_per_s'] / one['samples_per_s'] / 4:.2f}",
        )
    )
    report.details.update(ddp_4_ranks=four, ddp_1_rank=one)
    report.notes.append(
        f"SlotsAllocated -> every rank training: {four['allocated_to_all_training_s']:.2f}s "
        f"with 4 ranks on 2 agents (rendezvous included), "
        f"{one['allocated_to_all_training_s']:.2f}s with 1 rank"
    )
    return report
