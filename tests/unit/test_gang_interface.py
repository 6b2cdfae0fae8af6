"""The network interface a gang's gloo ranks use is the one of the agent's advertised address."""

from __future__ import annotations

from pathlib import Path

from services.agent.runtime import RunSpec, interface_of, trial_environment
from tests.agent_specs import spec_answer


def gang_run(node_address: str | None, environment: dict[str, str] | None = None) -> RunSpec:
    """A run of two slots here, part of a 4-rank gang across two agents."""
    answer = spec_answer(
        allocation_id="9.1",
        trial_id=9,
        entrypoint="python3 train.py",
        slot_ids=["0", "1"],
        environment_variables=environment or {},
    )
    run = RunSpec.from_api(answer, "agent-a", Path("/tmp/ckpt"))
    run.world_size, run.num_nodes, run.node_rank, run.rank_offset = 4, 2, 1, 2
    run.master_addr, run.master_port, run.node_address = "10.0.0.1", 29500, node_address
    return run


def environments(run: RunSpec) -> list[dict[str, str]]:
    return trial_environment(run, agent_id="agent-a", api_url="http://x", gpu_slots={}, base={})


def test_gloo_uses_the_interface_of_the_address_the_other_agents_reach() -> None:
    """Every rank of a multi-agent run gets GLOO_SOCKET_IFNAME naming the interface that holds
    the agent's advertised address (gloo would otherwise bind whatever the host name resolves
    to, loopback on many machines, and peers on other hosts could not connect)."""
    assert interface_of("127.0.0.1") == "lo"
    envs = environments(gang_run("127.0.0.1"))
    assert [e["GLOO_SOCKET_IFNAME"] for e in envs] == ["lo", "lo"]
    assert [e["RANK"] for e in envs] == ["2", "3"]


def test_the_experiments_own_interface_and_unknown_addresses_are_left_alone() -> None:
    """An experiment's environment that names GLOO_SOCKET_IFNAME keeps it; an address no
    interface holds (or none: one agent) sets nothing."""
    envs = environments(gang_run("127.0.0.1", {"GLOO_SOCKET_IFNAME": "ib0"}))
    assert {e["GLOO_SOCKET_IFNAME"] for e in envs} == {"ib0"}
    assert interface_of("192.0.2.77") is None
    assert all("GLOO_SOCKET_IFNAME" not in e for e in environments(gang_run("192.0.2.77")))
    assert all("GLOO_SOCKET_IFNAME" not in e for e in environments(gang_run(None)))
