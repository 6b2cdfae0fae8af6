"""The pure rules of distributed runs: rendezvous fold, launcher detection, rank environments."""

from __future__ import annotations

import socket
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cairn.core import DistributedContext
from cairn.launch._gang import Gang, LaunchError, relabel, split_command
from cairn.launch.torch_distributed import torchrun_argv
from cairn.local.options import ClusterOptions
from cairn.local.supervisor import Supervisor
from cairn.local.topology import service_names
from events.domain.aggregates.rendezvous import fold_rendezvous
from events.log.envelope import Metadata, RecordedEvent
from services.agent.runtime import RunSpec, launcher_argv, trial_environment
from tests.agent_specs import spec_answer

PLACEMENTS = {"agent-b": ["0", "1"], "agent-a": ["0", "1"]}


def joined(n: int, allocation_id: str, agent_id: str, address: str, port: int) -> RecordedEvent:
    return RecordedEvent(
        position=n,
        stream_id="trial-7",
        stream_version=n,
        event_id=uuid.uuid4(),
        type="RendezvousJoined",
        schema_version=1,
        payload={
            "trial_id": 7,
            "allocation_id": allocation_id,
            "agent_id": agent_id,
            "address": address,
            "port": port,
        },
        metadata=Metadata(),
        recorded_at=datetime.now(UTC),
    )


def test_rendezvous_completes_when_every_agent_joined() -> None:
    """The rendezvous stays open until each agent of the placements joined; then the chief (first
    agent id) gives the endpoint and each agent its node rank and first global rank."""
    first = [joined(1, "7.2", "agent-b", "10.0.0.2", 2000)]
    view = fold_rendezvous("7.2", PLACEMENTS, first)
    assert not view.complete and view.missing == ["agent-a"]
    assert view.answer("agent-b")["chief_address"] is None
    both = [*first, joined(2, "7.2", "agent-a", "10.0.0.1", 1000)]
    view = fold_rendezvous("7.2", PLACEMENTS, both)
    b = view.answer("agent-b")
    assert view.complete
    assert (b["chief_address"], b["chief_port"]) == ("10.0.0.1", 1000)
    assert (b["node_rank"], b["rank_offset"], b["local_size"]) == (1, 2, 2)
    assert (b["num_nodes"], b["world_size"]) == (2, 4)
    assert view.answer("agent-a")["node_rank"] == 0


def test_rendezvous_ignores_repeats_strangers_and_other_runs() -> None:
    """A second join of an agent keeps the first endpoint; joins of other allocations or of
    agents outside the placements do not count."""
    events = [
        joined(1, "7.1", "agent-a", "10.0.0.9", 9),  # the previous run
        joined(2, "7.2", "agent-z", "10.0.0.9", 9),  # not in the gang
        joined(3, "7.2", "agent-a", "10.0.0.1", 1000),
        joined(4, "7.2", "agent-a", "10.0.0.5", 5000),
    ]
    view = fold_rendezvous("7.2", PLACEMENTS, events)
    assert not view.complete
    assert view.members["agent-a"].port == 1000
    assert "agent-z" not in view.members


def test_launcher_entrypoints_are_recognised_and_determined_names_mapped() -> None:
    """Determined's launcher module runs cairn's; other entrypoints are left alone."""
    argv, launcher = launcher_argv(
        ["python3", "-m", "determined.launch.torch_distributed", "python3", "train.py"]
    )
    assert launcher and argv[:3] == ["python3", "-m", "cairn.launch.torch_distributed"]
    assert launcher_argv(["python3", "train.py"]) == (["python3", "train.py"], False)
    assert launcher_argv(["python3", "-m", "mypkg.train"])[1] is False


def spec(agent_id: str, entrypoint: str) -> RunSpec:
    raw = {
        "allocation_id": "7.2",
        "trial_id": 7,
        "entrypoint": entrypoint,
        "placements": PLACEMENTS,
        "slot_ids": ["0", "1"],
    }
    return RunSpec.from_api(spec_answer(**raw), agent_id, Path("/tmp/ckpt"))


def test_launcher_gets_one_process_with_the_gang_in_its_environment() -> None:
    """A launcher entrypoint runs once per agent and is told node rank, nodes, local slots and
    the chief's endpoint from the rendezvous; without one each slot gets its own rank."""
    run = spec("agent-b", "python3 -m determined.launch.torch_distributed python3 distributed.py")
    run.master_addr, run.master_port = "10.0.0.1", 1000
    (env,) = trial_environment(run, agent_id="agent-b", api_url="http://x", gpu_slots={}, base={})
    assert "RANK" not in env
    assert (env["CAIRN_NODE_RANK"], env["CAIRN_NUM_NODES"], env["LOCAL_WORLD_SIZE"]) == (
        "1",
        "2",
        "2",
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"]) == ("10.0.0.1", "1000", "4")
    plain = spec("agent-b", "python3 train.py")
    plain.master_addr, plain.master_port = "10.0.0.1", 1000
    envs = trial_environment(plain, agent_id="agent-b", api_url="http://x", gpu_slots={}, base={})
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("2", "0", "1"),
        ("3", "1", "1"),
    ]
    ctx = DistributedContext.from_env(envs[1])
    assert (ctx.rank, ctx.local_rank, ctx.cross_rank, ctx.cross_size) == (3, 1, 1, 2)
    assert ctx.chief_ip == "10.0.0.1"


def test_torchrun_command_line_for_one_part_of_the_gang() -> None:
    """torchrun gets nnodes/node_rank/nproc_per_node/master from the agent; a full command runs
    with --no_python; rank prefixes become global ranks."""
    gang = Gang.from_env(
        {
            "LOCAL_WORLD_SIZE": "2",
            "CAIRN_NUM_NODES": "2",
            "CAIRN_NODE_RANK": "1",
            "CAIRN_RANK_OFFSET": "2",
            "WORLD_SIZE": "4",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "1000",
        }
    )
    argv = torchrun_argv(gang, [], ["python3", "train.py"])
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    text = " ".join(argv)
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 2" in text
    assert "--master_addr 10.0.0.1 --master_port 1000" in text
    assert argv[-3:] == ["--no_python", "python3", "train.py"]
    assert relabel("[default1]:loss 0.3\n", gang.rank_offset) == "[rank=3] loss 0.3\n"
    assert relabel("[1,3]<stdout>:hi", 0) == relabel("[3]<stderr>:hi", 0) == "[rank=3] hi"
    assert relabel("plain line", 2) == "plain line"


def test_launcher_arguments() -> None:
    """Words before ``--`` override torchrun options; no command at all is a usage error."""
    assert split_command(["--rdzv_conf", "x=1", "--", "train.py"]) == (
        ["--rdzv_conf", "x=1"],
        ["train.py"],
    )
    assert split_command(["python3", "train.py"]) == ([], ["python3", "train.py"])
    with pytest.raises(LaunchError, match="no training command"):
        split_command(["--"])
    with pytest.raises(LaunchError, match="not an integer"):
        Gang.from_env({"LOCAL_WORLD_SIZE": "two"})


def test_cairn_up_with_two_agents_gives_each_its_own_id_and_files(tmp_path: Path) -> None:
    """`cairn up --agents 2` starts `agent` as before and `agent-2` with its own agent id and
    work directory, both with the requested slots."""
    sup = Supervisor(ClusterOptions(data_dir=tmp_path, slots=2, agents=2))
    sup.state.api_url = "http://127.0.0.1:1"
    assert service_names(2)[-2:] == ["agent", "agent-2"]
    assert service_names(1)[-1] == "agent"
    first, second = sup.service_command("agent"), sup.service_command("agent-2")
    assert first[1:3] == second[1:3] == ["-m", "services.agent"]
    assert "--agent-id" not in first
    assert second[second.index("--agent-id") + 1] == f"{socket.gethostname()}-2"
    assert second[second.index("--work-dir") + 1] == str(tmp_path / "agent-2")
    assert second[second.index("--artificial-slots") + 1] == "2"
