"""A config or a trial cannot make cairn read or delete what it did not write (the real API, a
real trial process using the Core API, and the tracker's GC): storage outside the cluster's
allowed roots is refused at submission, a checkpoint report must name a uuid the API issued to
the trial, and a checkpoint swapped for a link (or holding links) is neither served nor
followed by the deletion of its experiment."""

from __future__ import annotations

import asyncio
import io
import os
import sys
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairn.local.processes import ROOT
from events.domain.config.cluster import parse_cluster_config
from events.log.store import EventStore
from services.tracker.service import catch_up
from tests.integration.test_api_queries import end_trial, set_state
from tests.integration.test_api_support import CONFIG, Api, allocate, running_api

TRIAL = """
import sys
import cairn.core

with cairn.core.init() as ctx:
    for step in (1, 2):
        with ctx.checkpoint.store_path({"steps_completed": step}) as (path, uuid):
            (path / "model.pt").write_bytes(b"weights %d" % step)
        print("UUID", uuid, flush=True)
"""


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """The cluster's default root, the one extra allowed root, and a decoy for ``/etc``."""
    out = {
        "default": tmp_path / "default",
        "shared": tmp_path / "shared",
        "decoy": tmp_path / "etc",
    }
    for path in out.values():
        path.mkdir()
    (out["decoy"] / "passwd").write_bytes(b"root:x:0:0")
    return out


@pytest.fixture
async def api(store: EventStore, places: dict[str, Path]) -> AsyncIterator[Api]:
    cluster = parse_cluster_config(
        {"checkpoint_storage": {"allowed_roots": [str(places["shared"])]}}
    )
    async with running_api(store, places["default"], cluster=cluster) as client:
        yield client


async def create(api: Api, storage: dict[str, Any]) -> tuple[int, Any]:
    """Submits the test config with ``storage`` as its checkpoint_storage."""
    config = yaml.safe_load(CONFIG)
    config["checkpoint_storage"] = storage
    return await api.call("POST", "/api/v1/experiments", token=api.admin, json={"config": config})


async def test_storage_outside_the_allowed_roots_is_400_naming_field_and_value(
    api: Api, places: dict[str, Path]
) -> None:
    """``host_path: /etc``, a ``..`` way out of an allowed root, a ``directory`` storage at
    ``/var``, and an S3 bucket that would get the services' credentials are each refused;
    storage under an allowed root is accepted."""
    roots = f"[{places['default']}, {places['shared']}]"
    status, body = await create(api, {"type": "shared_fs", "host_path": "/etc"})
    assert status == 400, body
    assert body["error"]["path"] == "checkpoint_storage.host_path"
    assert body["error"]["message"] == (
        f"invalid config: checkpoint_storage.host_path: /etc is outside the allowed roots {roots}"
    )
    refused = {
        "checkpoint_storage.storage_path": {
            "type": "shared_fs", "host_path": str(places["shared"]), "storage_path": "a/../../etc",
        },
        "checkpoint_storage.container_path": {"type": "directory", "container_path": "/var"},
        "checkpoint_storage.bucket": {"type": "s3", "bucket": "b", "endpoint_url": "http://x"},
    }  # fmt: skip
    for field, storage in refused.items():
        status, body = await create(api, storage)
        assert (status, body["error"]["path"]) == (400, field), body
    status, body = await create(api, {"type": "shared_fs", "host_path": str(places["shared"])})
    assert status == 200, body


async def run_trial(api: Api, trial_id: int, checkpoint_dir: Path) -> list[str]:
    """Runs a trial process that saves two checkpoints with the Core API; returns their uuids."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env.update(
        PYTHONPATH=str(ROOT),
        CAIRN_MASTER=api.url,
        CAIRN_TOKEN=api.trial_token(trial_id),
        CAIRN_TRIAL_ID=str(trial_id),
        CAIRN_EXPERIMENT_ID=str(trial_id // 10),
        CAIRN_ALLOCATION_ID=f"{trial_id}.1",
        CAIRN_RUN_ID="1",
        CAIRN_CHECKPOINT_DIR=str(checkpoint_dir),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", TRIAL, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()
    return [line.split()[1] for line in out.decode().splitlines() if line.startswith("UUID ")]


def report(key: str, uuid: str) -> dict[str, Any]:
    return {
        "items": [
            {
                "kind": "checkpoint",
                "idempotency_key": key,
                "uuid": uuid,
                "metadata": {"steps_completed": 9},
            }
        ]
    }


async def test_a_trial_cannot_name_swap_or_link_its_way_to_files_cairn_did_not_write(
    api: Api, store: EventStore, places: dict[str, Path]
) -> None:
    """The attack of a trial on shared storage: reporting a checkpoint named like a directory
    already there (or any uuid not issued to it) is 400; after saving, a checkpoint replaced by
    a link to ``/etc`` and one holding links to it are neither served nor followed when the
    experiment is deleted, which removes what cairn wrote and nothing else."""
    shared = places["shared"]
    status, body = await create(api, {"type": "shared_fs", "host_path": str(shared)})
    assert status == 200, body
    experiment_id = body["id"]
    trial_id = experiment_id * 10 + 1
    await allocate(api.store, trial_id)
    (shared / "victim").mkdir()
    (shared / "victim" / "data.bin").write_bytes(b"not cairn's")
    for name in ("victim", "../etc", str(__import__("uuid").uuid4()), api.checkpoint_uuid(99)):
        status, body = await api.call(
            "POST",
            f"/api/v1/trials/{trial_id}/reports",
            token=api.trial_token(trial_id),
            json=report(name, name),
        )
        assert status == 400, (name, body)
        assert body["error"]["path"] == "items[0].uuid"

    swapped, linking = await run_trial(api, trial_id, shared)
    saved = [e.payload["uuid"] for e in await store.read_stream(f"trial-{trial_id}")
             if e.type == "CheckpointSaved"]  # fmt: skip
    assert saved == [swapped, linking]
    # The trial (or anyone who can write the shared storage) swaps and links.
    for child in (shared / swapped).iterdir():
        child.unlink()
    (shared / swapped).rmdir()
    (shared / swapped).symlink_to(places["decoy"])
    (shared / linking / "passwd").symlink_to(places["decoy"] / "passwd")
    (shared / linking / "etc").symlink_to(places["decoy"])

    await catch_up(store, checkpoint_root=places["default"])
    status, body = await api.call("GET", f"/api/v1/checkpoints/{swapped}/download", token=api.admin)
    assert status == 404, body
    assert "has no files cairn wrote" in body["error"]["message"]
    status, data = await api.call("GET", f"/api/v1/checkpoints/{linking}/download", token=api.admin)
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert tar.getnames() == ["metadata.json", "model.pt"]
        assert b"root:x" not in b"".join(
            f.read() for m in tar.getmembers() if (f := tar.extractfile(m)) is not None
        )

    await end_trial(store, trial_id)
    await set_state(store, experiment_id, "STOPPING_COMPLETED", "COMPLETED")
    await catch_up(store, checkpoint_root=places["default"])
    await api.ok("DELETE", f"/api/v1/experiments/{experiment_id}", token=api.admin)
    await catch_up(
        store,
        checkpoint_root=places["default"],
        storage_policy=parse_cluster_config(
            {"checkpoint_storage": {"allowed_roots": [str(shared)]}}
        ).checkpoint_storage,
    )
    tail = [e.payload for e in (await store.read_stream(f"experiment-{experiment_id}"))[-2:]]
    assert tail[-1]["state"] == "DELETED"
    assert (places["decoy"] / "passwd").read_bytes() == b"root:x:0:0"
    assert (shared / "victim" / "data.bin").read_bytes() == b"not cairn's"
    assert not (shared / linking).exists()
    assert (shared / swapped).is_symlink()  # left alone: not a checkpoint cairn wrote
