"""What a container of a run is created with: image choice, mounts, environment, labels, devices
(computed without a Docker engine; the engine itself is exercised by ``tests/lab``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from events.domain.config.cluster import TaskImages
from services.agent.docker_runtime import (
    LABEL_AGENT,
    LABEL_ALLOCATION,
    _lines,
    container_environment,
    mounts_holding,
    plan_containers,
    run_image,
)
from services.agent.runtime import RunSpec, trial_environment
from tests.agent_specs import spec_answer


def _run(config: dict[str, Any], slots: list[str] | None = None, **spec: Any) -> RunSpec:
    raw = {
        "allocation_id": "12.1.1",
        "trial_id": 12,
        "experiment_id": 3,
        "entrypoint": "python3 train.py --fast",
        "token": "tok",
        "slot_ids": slots or ["a1-cpu0"],
        "config": config,
        **spec,
    }
    return RunSpec.from_api(spec_answer(**raw), "a1", Path("/var/lib/cairn/checkpoints"))


def test_image_absent_means_process_runtime() -> None:
    """No ``environment.image`` (or an empty one) chooses no image: the run is a process."""
    assert run_image({}, "cpu") is None
    assert run_image({"environment": {"image": None}}, "cpu") is None
    assert run_image({"environment": {"environment_variables": []}}, "cuda") is None


def test_image_per_device() -> None:
    """A string is used for every device; a mapping picks the run's device, falling back to cpu."""
    assert run_image({"environment": {"image": "cairn-trial:local"}}, "cuda") == "cairn-trial:local"
    both = {"environment": {"image": {"cpu": "t:cpu", "cuda": "t:gpu"}}}
    assert run_image(both, "cpu") == "t:cpu"
    assert run_image(both, "cuda") == "t:gpu"
    assert run_image({"environment": {"image": {"gpu": "t:old"}}}, "cuda") == "t:old"
    assert run_image({"environment": {"image": {"cpu": "t:cpu"}}}, "cuda") == "t:cpu"


def test_the_clusters_default_image_serves_a_config_without_one() -> None:
    """``tasks.default_image`` is the image of a run whose config names none (per device), and
    never overrides the config's own."""
    default = TaskImages(cpu="d:cpu", cuda="d:cuda")
    assert run_image({}, "cpu", default) == "d:cpu"
    assert run_image({"environment": {"image": None}}, "cuda", default) == "d:cuda"
    assert run_image({"environment": {"image": {}}}, "cpu", default) == "d:cpu"
    assert run_image({"environment": {"image": "mine"}}, "cuda", default) == "mine"
    assert run_image({}, "cuda", TaskImages(cpu="only")) == "only"
    assert run_image({}, "cpu", None) is None


def test_container_gets_the_trial_environment_without_host_paths() -> None:
    """Every CAIRN_* variable and the experiment's variables pass; the agent's PATH does not."""
    run = _run({}, environment_variables={"EXTRA": "1"})
    env = trial_environment(
        run, agent_id="a1", api_url="http://api:8080", gpu_slots={}, base={"PATH": "/host/bin"}
    )[0]
    inside = container_environment(env, run)
    for key in ("CAIRN_MASTER", "CAIRN_TOKEN", "CAIRN_TRIAL_ID", "CAIRN_CHECKPOINT_DIR"):
        assert inside[key] == env[key]
    assert inside["CAIRN_TRIAL_ID"] == "12"
    assert inside["EXTRA"] == "1"
    assert "PATH" not in inside and "PYTHONPATH" not in inside
    own_path = _run({}, environment_variables={"PATH": "/opt/x/bin"})
    env = trial_environment(own_path, agent_id="a1", api_url="http://api", gpu_slots={}, base={})[0]
    assert container_environment(env, own_path)["PATH"] == "/opt/x/bin"


def test_plan_on_a_host_agent_mounts_work_and_checkpoints_at_their_paths() -> None:
    """An agent on the host: host network, work dir and checkpoint dir bound at the same paths."""
    run = _run(
        {"bind_mounts": [{"host_path": "/data", "container_path": "/in", "read_only": True}]}
    )
    envs = trial_environment(run, agent_id="a1", api_url="http://x", gpu_slots={}, base={})
    work = Path("/var/lib/agent/allocations/12.1.1")
    (plan,) = plan_containers(
        run, "img:1", envs, agent_id="a1", work=work, gpu_slots={}, user="1000:1000"
    )
    assert plan.image == "img:1"
    assert plan.command == ["python3", "train.py", "--fast"]
    assert plan.working_dir == str(work)
    assert plan.network_mode == "host"
    assert plan.volumes[str(work)] == {"bind": str(work), "mode": "rw"}
    ckpt = "/var/lib/cairn/checkpoints"
    assert plan.volumes[ckpt] == {"bind": ckpt, "mode": "rw"}
    assert plan.volumes["/data"] == {"bind": "/in", "mode": "ro"}
    assert plan.labels == {LABEL_AGENT: "a1", LABEL_ALLOCATION: "12.1.1", "ai.cairn.trial": "12"}
    kwargs = plan.create_kwargs()
    assert kwargs["user"] == "1000:1000" and "device_requests" not in kwargs


def test_plan_in_an_agent_container_shares_its_volumes_and_network() -> None:
    """An agent in a container: the trial joins its network and gets only the mounts it needs."""
    run = _run({})
    envs = trial_environment(run, agent_id="a1", api_url="http://api:8080", gpu_slots={}, base={})
    attrs = {
        "Mounts": [
            {
                "Type": "bind",
                "Source": "/var/run/docker.sock",
                "Destination": "/var/run/docker.sock",
                "RW": True,
            },
            {"Type": "volume", "Name": "c_work1", "Destination": "/w", "RW": True},
            {"Type": "volume", "Name": "c_ckpt", "Destination": "/var/lib/cairn", "RW": True},
        ]
    }
    shared = mounts_holding(attrs, [Path("/w/allocations/x"), run.checkpoint_dir])
    assert shared == {
        "c_work1": {"bind": "/w", "mode": "rw"},
        "c_ckpt": {"bind": "/var/lib/cairn", "mode": "rw"},
    }
    (plan,) = plan_containers(
        run,
        "img",
        envs,
        agent_id="a1",
        work=Path("/w/allocations/x"),
        gpu_slots={},
        share_from="abc123",
        shared_mounts=shared,
    )
    assert plan.network_mode == "container:abc123"
    assert plan.labels["ai.cairn.agent-container"] == "abc123"
    assert plan.volumes == shared  # never the agent's Docker socket


def test_storage_a_run_only_reads_is_mounted_read_only() -> None:
    """A TensorBoard's experiments' storage directories (``reads``) are mounted read-only at
    their paths: bound from the host by an agent on the host, and from the agent container's
    mount holding them by an agent in a container (a mount that also holds the work or
    checkpoint directory keeps its mode)."""
    run = _run({})
    envs = trial_environment(run, agent_id="a1", api_url="http://x", gpu_slots={}, base={})
    work = Path("/w/allocations/x")
    elsewhere = Path("/srv/exp-storage")
    (plan,) = plan_containers(
        run, "img", envs, agent_id="a1", work=work, gpu_slots={}, reads=[elsewhere]
    )
    assert plan.volumes[str(elsewhere)] == {"bind": str(elsewhere), "mode": "ro"}
    assert plan.volumes[str(run.checkpoint_dir)]["mode"] == "rw"

    attrs = {
        "Mounts": [
            {"Type": "volume", "Name": "c_work1", "Destination": "/w", "RW": True},
            {"Type": "volume", "Name": "c_ckpt", "Destination": "/var/lib/cairn", "RW": True},
            {"Type": "bind", "Source": "/nfs/exp", "Destination": "/srv", "RW": True},
            {"Type": "volume", "Name": "c_other", "Destination": "/other", "RW": True},
        ]
    }
    reads = [elsewhere, run.checkpoint_dir / "tensorboard"]
    shared = mounts_holding(attrs, [work, run.checkpoint_dir], reads=reads)
    assert shared == {
        "c_work1": {"bind": "/w", "mode": "rw"},
        "c_ckpt": {"bind": "/var/lib/cairn", "mode": "rw"},
        "/nfs/exp": {"bind": "/srv", "mode": "ro"},
    }


def test_plan_per_rank_gpus_and_devices() -> None:
    """Two local ranks give two containers (distinct names, ranks); GPUs become device requests;
    devices, shared memory and added capabilities pass through, every other capability is
    dropped and no process gains privileges."""
    config = {
        "resources": {
            "devices": [{"host_path": "/dev/fuse", "container_path": "/dev/fuse"}],
            "shm_size": 1 << 30,
        },
        "environment": {"add_capabilities": ["SYS_ADMIN"], "drop_capabilities": ["NET_RAW"]},
    }
    run = _run(config, slots=["g0", "g1"])
    gpus = {"g0": "0", "g1": "1"}
    envs = trial_environment(run, agent_id="a1", api_url="http://x", gpu_slots=gpus, base={})
    plans = plan_containers(run, "img", envs, agent_id="a1", work=Path("/w"), gpu_slots=gpus)
    assert [p.environment["RANK"] for p in plans] == ["0", "1"]
    assert len({p.name for p in plans}) == 2
    assert all("CUDA_VISIBLE_DEVICES" not in p.environment for p in plans)
    kwargs = plans[0].create_kwargs()
    (request,) = kwargs["device_requests"]
    assert request["DeviceIDs"] == ["0", "1"]
    assert kwargs["devices"] == ["/dev/fuse:/dev/fuse:mrw"]
    assert kwargs["shm_size"] == str(1 << 30)
    assert (kwargs["cap_add"], kwargs["cap_drop"]) == (["SYS_ADMIN"], ["ALL"])
    assert kwargs["security_opt"] == ["no-new-privileges"]


def test_lines_split_across_chunks() -> None:
    """Output cut anywhere comes out as whole lines, the unterminated last one included."""
    chunks = [b"one\ntw", b"o\r\n", b"", b"thr", b"ee"]
    assert list(_lines(iter(chunks))) == ["one", "two", "three"]
