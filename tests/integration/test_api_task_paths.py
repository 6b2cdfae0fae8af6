"""A task's ``bind_mounts`` and ``work_dir`` through the API: a host path the cluster does not
allow and a ``work_dir`` outside the context are 400s naming the field with nothing appended, for
every kind; what is allowed is recorded and reaches the placed agent's spec."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cairn.client import code_tarball
from events.domain.config.cluster import parse_cluster_config
from events.domain.names import task_allocation_id, task_stream
from events.domain.types import TaskAllocated
from events.log.store import EventStore
from tests.integration.test_api_ownership import login
from tests.integration.test_api_support import (
    TEST_CLUSTER,
    Api,
    running_api,
    submit_experiment,
)

CLUSTER = parse_cluster_config(
    {
        "checkpoint_storage": TEST_CLUSTER.checkpoint_storage.model_dump(mode="json"),
        "tasks": {"allowed_bind_mount_roots": ["/datasets", "/var"]},
    }
)
"""The gateway's cluster config: bind mounts under ``/datasets`` and ``/var`` only."""

KINDS = ("commands", "notebooks", "shells")


@pytest.fixture
async def api(store: EventStore, tmp_path: Path) -> AsyncIterator[Api]:
    async with running_api(store, tmp_path / "checkpoints", CLUSTER) as client:
        yield client


def body(kind: str, config: dict[str, Any], context: Path | None = None) -> dict[str, Any]:
    """A request starting a task of ``kind`` with ``config`` (and ``context`` uploaded)."""
    out: dict[str, Any] = {"config": config}
    if kind == "commands":
        out["argv"] = ["pwd"]
    if context is not None:
        out["code"] = base64.b64encode(code_tarball(context)).decode()
    return out


async def requested(store: EventStore) -> list[Any]:
    """Every TaskRequested in the log."""
    return [e async for e in store.iter_all(0, types=["TaskRequested"])]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("host_path", "says"),
    [
        ("/", "/ is outside the allowed roots [/datasets, /var]"),
        ("/datasets/../etc", "/datasets/../etc (/etc) is outside the allowed roots"),
        ("/datasets2", "/datasets2 is outside the allowed roots"),
        ("/var/run", "/var/run holds a container engine's socket"),
    ],
)
async def test_a_bind_mount_the_cluster_does_not_allow_is_a_400_naming_it(
    api: Api, store: EventStore, kind: str, host_path: str, says: str
) -> None:
    """A command, notebook or shell mounting /, a ``..`` escape, a sibling of a root or a
    directory holding the Docker socket is refused as an experiment would be, naming
    ``bind_mounts[1].host_path``; nothing is appended."""
    alice = await login(api, "alice")
    mounts = [
        {"host_path": "/datasets/imagenet", "container_path": "/data"},
        {"host_path": host_path, "container_path": "/host"},
    ]
    status, answer = await api.call(
        "POST", f"/api/v1/{kind}", token=alice, json=body(kind, {"bind_mounts": mounts})
    )
    assert status == 400, answer
    assert answer["error"]["path"] == "bind_mounts[1].host_path"
    assert says in answer["error"]["message"]
    assert await requested(store) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"work_dir": "/etc"}, "config.work_dir"),
        ({"work_dir": "../../etc"}, "config.work_dir"),
        ({"work_dir": "sub/\x00"}, "config.work_dir"),
        ({"work_dir": "s" * 5000}, "config.work_dir"),
        ({"bind_mounts": [{"host_path": "datasets", "container_path": "/d"}]}, None),
        ({"bind_mounts": [{"host_path": "/datasets\x00", "container_path": "/d"}]}, None),
        ({"bind_mounts": {"host_path": "/datasets"}}, "config.bind_mounts"),
    ],
)
async def test_a_malformed_work_dir_or_bind_mount_is_a_400_naming_the_field(
    api: Api, store: EventStore, tmp_path: Path, kind: str, config: dict[str, Any], path: str
) -> None:
    """An absolute, escaping, NUL-holding or oversized ``work_dir`` and a relative or
    NUL-holding bind mount host path (or a mapping for the list) are 400s naming the field,
    with a context uploaded, and nothing is appended."""
    alice = await login(api, "alice")
    (tmp_path / "sub").mkdir()
    status, answer = await api.call(
        "POST", f"/api/v1/{kind}", token=alice, json=body(kind, config, tmp_path)
    )
    assert status == 400, answer
    assert answer["error"]["path"] == (path or "config.bind_mounts[0].host_path")
    assert answer["error"]["message"].startswith(answer["error"]["path"] + ": ")
    assert await requested(store) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_work_dir_without_a_context_is_a_400(
    api: Api, store: EventStore, kind: str
) -> None:
    """A ``work_dir`` names a directory of the context, so a task without one is refused."""
    alice = await login(api, "alice")
    status, answer = await api.call(
        "POST", f"/api/v1/{kind}", token=alice, json=body(kind, {"work_dir": "sub"})
    )
    assert status == 400 and answer["error"]["path"] == "config.work_dir", answer
    assert "--context" in answer["error"]["message"]
    assert await requested(store) == []


async def test_a_tensorboard_is_refused_a_work_dir_and_a_disallowed_bind_mount(
    api: Api, store: EventStore
) -> None:
    """A TensorBoard has no context to start in (``config.work_dir`` 400) and its bind mounts
    answer to the same policy (``bind_mounts[0].host_path`` 400); nothing is appended."""
    alice = await login(api, "alice")
    await submit_experiment(store, 1, owner="alice")
    for config, path in (
        ({"work_dir": "sub"}, "config.work_dir"),
        (
            {"bind_mounts": [{"host_path": "/etc", "container_path": "/e"}]},
            "bind_mounts[0].host_path",
        ),
    ):
        status, answer = await api.call(
            "POST", "/api/v1/tensorboards", token=alice,
            json={"experiment_ids": [1], "config": config},
        )  # fmt: skip
        assert status == 400 and answer["error"]["path"] == path, answer
    assert await requested(store) == []


async def test_an_allowed_bind_mount_and_work_dir_are_recorded_and_reach_the_agents_spec(
    api: Api, store: EventStore, tmp_path: Path
) -> None:
    """A command with a bind mount under an allowed root and ``work_dir: sub`` is accepted; the
    task shows both and the placed agent's spec carries them (what it starts the command
    with)."""
    alice = await login(api, "alice")
    (tmp_path / "sub").mkdir()
    mounts = [{"host_path": "/datasets/imagenet", "container_path": "/data", "read_only": True}]
    config = {"bind_mounts": mounts, "work_dir": "sub"}
    task = await api.ok(
        "POST", "/api/v1/commands", token=alice, json=body("commands", config, tmp_path)
    )
    expected_mounts = [{**mounts[0], "propagation": "rprivate"}]
    assert (task["config"]["work_dir"], task["config"]["bind_mounts"]) == ("sub", expected_mounts)
    alloc = task_allocation_id(task["id"])
    await store.append(
        task_stream(task["id"]),
        [TaskAllocated(task_id=task["id"], allocation_id=alloc, placements={"gpu01": ["0"]})],
        expected_version=1,
    )
    agent = await api.agent_token("gpu01")
    spec = await api.ok("GET", f"/api/v1/allocations/{alloc}/spec?agent_id=gpu01", token=agent)
    assert spec["config"]["work_dir"] == "sub"
    assert spec["config"]["bind_mounts"] == expected_mounts
