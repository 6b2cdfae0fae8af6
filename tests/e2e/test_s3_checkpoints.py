"""Checkpoints in S3-compatible storage on a real cluster: a trial saves to a local S3 server,
crashes and resumes from the checkpoint in the bucket, the API streams a checkpoint out of the
bucket (never showing the secret key), the tracker's GC deletes the objects it collects, and
the trial's TensorBoard files are in the bucket too (which the GC leaves alone)."""

from __future__ import annotations

import copy
import io
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from cairn.local.servers import ServerProcess
from events.domain.checkpoint_storage import MARKER_FILE
from events.domain.config.secrets import MASK
from events.domain.names import trial_stream
from events.log.store import EventStore
from tests.conftest import S3Server
from tests.e2e.harness import Cluster, events_of, experiment_state, first_trial, wait_for
from tests.helpers import ROOT

SCRIPTED = ROOT / "examples" / "scripted"
PREFIX = "e2e/checkpoints"


@pytest.fixture
async def cluster(
    store: EventStore, db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler, API, tracker and one 2-slot agent, as processes."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_all(slots=2, agent_timeout=3.0)
    c.start("tracker", "services.tracker")
    try:
        await c.login()
        yield c
    finally:
        c.stop()


def s3_experiment(server: S3Server) -> dict[str, Any]:
    """The scripted trial: checkpoints at steps 20 and 40, a crash after 45, then 60 steps done;
    the GC keeps only each trial's latest checkpoint."""
    config = copy.deepcopy(yaml.safe_load((SCRIPTED / "config.yaml").read_text()))
    config["hyperparameters"].update(steps=60, sleep=0.01, checkpoint_every=20, fail_at_step=45)
    config["reproducibility"] = {"experiment_seed": 7}
    config["checkpoint_storage"] = {
        "type": "s3",
        "bucket": server.bucket,
        "prefix": PREFIX,
        "endpoint_url": server.url,
        "access_key": server.ACCESS_KEY,
        "secret_key": server.SECRET_KEY,
        "save_experiment_best": 0,
        "save_trial_best": 0,
        "save_trial_latest": 1,
    }
    return config


async def download(cluster: Cluster, uuid: str) -> tuple[int, bytes]:
    """``GET /checkpoints/{uuid}/download``: the status and the body."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"{cluster.api_url}/api/v1/checkpoints/{uuid}/download",
            headers={"Authorization": f"Bearer {cluster.token}"},
        ) as resp,
    ):
        return resp.status, await resp.read()


@pytest.mark.slow
async def test_s3_checkpoints_save_resume_download_and_gc(
    cluster: Cluster, store: EventStore, s3_server: S3Server
) -> None:
    """Every checkpoint lands in the bucket, the restarted run resumes from one there, the API
    streams the kept one as a tar.gz, and GC removes the others' objects from the bucket (but
    not the trial's TensorBoard files, which are there too)."""
    exp = await cluster.submit(s3_experiment(s3_server), SCRIPTED)
    trial = await first_trial(cluster, store, exp)

    async def completed() -> bool:
        return await experiment_state(store, exp) == "COMPLETED"

    await wait_for(cluster, completed, timeout=120)
    events = await store.read_stream(trial_stream(trial))
    saved = [e.payload for e in events if e.type == "CheckpointSaved"]
    assert len(saved) >= 3, saved
    restarted = [e.payload for e in events if e.type == "TrialRestarted"]
    assert restarted and restarted[0]["latest_checkpoint"] in {s["uuid"] for s in saved}
    started = [e.payload for e in events if e.type == "TrialStarted"]
    assert started[1]["restored_checkpoint"] == restarted[0]["latest_checkpoint"]
    resumed = [
        e.payload["steps_completed"]
        for e in events
        if e.type == "WorkloadCompleted" and e.payload["run_id"] == 2
    ]
    assert resumed and min(resumed) > 40, "run 2 continued from the checkpoint in the bucket"

    async def collected() -> bool:
        return any(
            e.payload["experiment_id"] == exp for e in await events_of(store, "CheckpointsDeleted")
        )

    await wait_for(cluster, collected, timeout=60)
    deleted = {
        u
        for e in await events_of(store, "CheckpointsDeleted")
        if e.payload["experiment_id"] == exp
        for u in e.payload["uuids"]
    }
    latest = max(saved, key=lambda s: s["steps_completed"])["uuid"]
    assert latest not in deleted and deleted == {s["uuid"] for s in saved} - {latest}
    every_key = s3_server.object_keys()
    board = f"{PREFIX}/tensorboard/experiment/{exp}/trial/{trial}/events.out.tfevents."
    assert any(k.startswith(board) for k in every_key), "the trial's TensorBoard files"
    keys = [k for k in every_key if not k.startswith(f"{PREFIX}/tensorboard/")]
    assert keys and all(k.startswith(f"{PREFIX}/{latest}/") for k in keys), keys
    assert f"{PREFIX}/{latest}/metadata.json" in keys

    status, body = await download(cluster, latest)
    assert status == 200
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = set(tar.getnames())
    assert f"{PREFIX}/{latest}/{MARKER_FILE}" in keys  # cairn's marker, not sent
    assert names == {k.removeprefix(f"{PREFIX}/{latest}/") for k in keys} - {MARKER_FILE}
    status, _ = await download(cluster, sorted(deleted)[0])
    assert status == 404

    detail = await cluster.request("GET", f"/experiments/{exp}")
    storage = detail["config"]["checkpoint_storage"]
    assert storage["secret_key"] == MASK and storage["access_key"] == MASK
    assert s3_server.SECRET_KEY not in str(detail)
