"""A search whose trials run on agents in two hosts."""

from __future__ import annotations

from pathlib import Path

from events.domain.check import check_log
from events.log.store import EventStore
from tests.e2e.harness import experiment_state, trial_ids, wait_for
from tests.hosts.conftest import AGENT_HOSTS, StartHosts
from tests.hosts.trials import SCRIPTED, agents_that_started_runs, scripted


async def test_grid_search_runs_trials_on_both_agent_hosts(
    hosts: StartHosts, store: EventStore, tmp_path: Path
) -> None:
    """Four one-slot trials at once on two 2-slot agent hosts: both hosts run trials, every
    trial reports over the bridge, the experiment completes and the log is consistent."""
    cluster = await hosts(slots=2)
    config = scripted(tmp_path / "ckpt", steps=40, sleep=0.05, checkpoint_every=20)
    config["searcher"] = {"name": "grid", "metric": "validation_loss", "max_concurrent_trials": 4}
    config["hyperparameters"]["validation_offset"] = {
        "type": "categorical",
        "vals": [0.0, 0.1, 0.2, 0.3],
    }
    exp = await cluster.submit(config, SCRIPTED)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    assert len(await trial_ids(store, exp)) == 4
    assert await agents_that_started_runs(store) == set(AGENT_HOSTS)
    validated = {e.payload["trial_id"] for e in await store.read_all(types=["ValidationReported"])}
    assert validated == set(await trial_ids(store, exp))
    assert await check_log(store) == []
