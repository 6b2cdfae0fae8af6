"""A run placed on several agents, with real agent processes against the real API: the
rendezvous times out when an agent never joins, and one failing part stops the whole gang."""

from __future__ import annotations

from typing import Any

import psutil

from events.domain import names
from events.domain.types import SlotsAllocated, TrialRequested
from services.agent.slots import cpu_slots
from tests.helpers import wait_until
from tests.integration.test_agent_process import Cluster, cluster  # noqa: F401 (fixture)

# Node 0's rank writes its pid to child.pid in the checkpoint directory (the one both parts
# share) and sleeps ten minutes; node 1's rank waits for that file (both parts run), then fails
# with exit code 3.
GANG_SCRIPT = """
import os, sys, time
print("rank", os.environ["RANK"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], flush=True)
pid_file = os.path.join(os.environ["CAIRN_CHECKPOINT_DIR"], "child.pid")
if os.environ["GROUP_RANK"] == "0":
    with open(pid_file + ".part", "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(pid_file + ".part", pid_file)
    time.sleep(600)
while not os.path.exists(pid_file):
    time.sleep(0.05)
sys.exit(3)
"""
GANG_ENTRYPOINT = ["python3", "-c", GANG_SCRIPT]


async def allocate_gang(
    c: Cluster,
    agents: dict[str, int],
    entrypoint: Any,
    hparams: dict[str, Any] | None = None,
) -> tuple[int, str]:
    """Submits an experiment and places its trial on ``agents`` (id -> slots); returns (trial,
    allocation)."""
    experiment_id = await c.submit(hparams or {}, entrypoint)
    trial_id = experiment_id * 10 + 1
    await c.store.append(
        f"experiment-{experiment_id}",
        [
            TrialRequested(
                experiment_id=experiment_id,
                trial_id=trial_id,
                seq=1,
                request_id=f"r-{trial_id}",
                hparams=hparams or {},
                trial_seed=7,
            )
        ],
    )
    allocation_id = names.allocation_id(trial_id, 1)
    placements = {a: [s.slot_id for s in cpu_slots(a, n)] for a, n in agents.items()}
    await c.store.append(
        names.trial_stream(trial_id),
        [SlotsAllocated(trial_id=trial_id, allocation_id=allocation_id, placements=placements)],
    )
    return trial_id, allocation_id


async def test_rendezvous_an_agent_never_joins_fails_the_run(cluster: Cluster) -> None:  # noqa: F811
    """The agent joins, waits its --rendezvous-timeout for an agent that never comes, starts
    nothing and reports the run failed, naming the missing agent."""
    agent = await cluster.start_agent("g1", "--rendezvous-timeout", "1")
    trial, alloc = await allocate_gang(cluster, {"g1": 1, "ghost": 1}, "python3 ranks.py")
    await cluster.command("g1", "start", alloc)
    exited = await cluster.exited(trial)
    assert exited["outcome"] == "failed" and exited["exit_code"] == 1
    assert "rendezvous timed out after 1s: agent(s) ghost never joined" in exited["message"]
    joins = await cluster.of_type(trial, "RendezvousJoined")
    assert [j["agent_id"] for j in joins] == ["g1"]
    assert not await cluster.of_type(trial, "TrialStarted")
    assert "run launched" not in agent.log()


async def test_one_failing_part_stops_the_whole_gang(cluster: Cluster) -> None:  # noqa: F811
    """Both agents rendezvous and start their ranks with the chief's endpoint; node 1's rank
    exits 3 once node 0's runs, the run is recorded failed with that code, and node 0's agent
    stops its rank (which would otherwise sleep ten minutes): the run is no longer current."""
    chief = await cluster.start_agent("h1", "--rendezvous-timeout", "60")
    await cluster.start_agent("h2", "--rendezvous-timeout", "60")
    trial, alloc = await allocate_gang(cluster, {"h1": 1, "h2": 1}, GANG_ENTRYPOINT)
    await cluster.command("h1", "start", alloc)
    await cluster.command("h2", "start", alloc)
    exited = await cluster.exited(trial, timeout=60)
    assert (exited["outcome"], exited["exit_code"]) == ("failed", 3), await cluster.logs(alloc)
    joins = await cluster.of_type(trial, "RendezvousJoined")
    assert sorted(j["agent_id"] for j in joins) == ["h1", "h2"]
    [chief_join] = [j for j in joins if j["agent_id"] == "h1"]
    endpoint = f"{chief_join['address']} {chief_join['port']}"
    chief_rank = int((cluster.tmp / "ckpt" / "child.pid").read_text())

    async def both_ranks_logged() -> bool:
        lines = [r["line"] for r in await cluster.logs(alloc)]
        return {f"rank 0 {endpoint}", f"rank 1 {endpoint}"} <= set(lines)

    await wait_until(both_ranks_logged, timeout=30)
    await wait_until(lambda: "another part of the gang ended" in chief.log(), timeout=30)
    await wait_until(lambda: not psutil.pid_exists(chief_rank), timeout=30)
