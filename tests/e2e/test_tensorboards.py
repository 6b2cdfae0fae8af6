"""``cairn tensorboard`` end to end on an embedded cluster: a real TensorBoard started by the agent
over the TensorBoard files a trial wrote through the Core API, queried through the API's proxy
with TensorBoard's own HTTP API; other users refused, the port refused without the proxy's
token, unknown experiments a 404, and files written after it started shown."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from cairn.core._tensorboard import EventFileWriter, encode_event, tfrecord
from tests.e2e.test_cli import (
    CONFIG,
    FAST,
    SCRIPTED,
    Env,
    as_user,
    created_id,
    embedded_cluster,
    ok,
)
from tests.helpers import wait_until

NORA = ("nora", "pw-nora-1")
MALLORY = ("mallory", "pw-mallory")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster (one CPU slot for the trials; TensorBoards hold none) with users
    nora and mallory."""
    with embedded_cluster("cairn-tb-") as env:
        for name, password in (NORA, MALLORY):
            ok(env, "user", "create", name, "--password", password)
        yield env


def cli_as(env: Env, who: tuple[str, str], *args: str) -> Any:
    """Runs the CLI as ``who`` from their own home."""
    home = env.shared / who[0]
    home.mkdir(exist_ok=True)
    return as_user(env, home, who[0], who[1], *args)


@pytest.fixture(scope="module")
def experiment(cluster: Env) -> dict[str, Any]:
    """Nora's finished scripted experiment (its trial wrote TensorBoard scalars through the
    Core API): its id, its trial's id and the trial's TensorBoard directory in storage."""
    done = cli_as(cluster, NORA, "experiment", "create", str(CONFIG), str(SCRIPTED), *FAST, "-f")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    exp_id = created_id(done.stdout)
    shown = json.loads(
        cli_as(cluster, NORA, "--json", "experiment", "describe", str(exp_id)).stdout
    )
    trial_id = int(shown["trials"][0]["trial_id"])
    found = [
        p
        for p in cluster.home.rglob(f"tensorboard/experiment/{exp_id}/trial/{trial_id}")
        if p.is_dir() and any(p.glob("events.out.tfevents.*"))
    ]
    assert found, "the trial uploaded no TensorBoard files"
    return {"id": exp_id, "trial": trial_id, "tb_dir": found[0]}


async def login(http: aiohttp.ClientSession, env: Env, who: tuple[str, str]) -> dict[str, str]:
    """A bearer header for ``who``."""
    async with http.post(
        f"{env.api_url}/api/v1/auth/login", json={"username": who[0], "password": who[1]}
    ) as answer:
        assert answer.status == 200
        return {"Authorization": f"Bearer {(await answer.json())['token']}"}


async def scalars(
    http: aiohttp.ClientSession, base: str, headers: dict[str, str], run: str, tag: str
) -> list[int]:
    """The steps TensorBoard shows for ``run``'s ``tag`` (none while it shows none)."""
    async with http.get(
        f"{base}data/plugin/scalars/scalars", params={"run": run, "tag": tag}, headers=headers
    ) as answer:
        if answer.status != 200:
            return []
        return [int(point[1]) for point in await answer.json()]


def server_address(task_id: str) -> str:
    """``http://address:port`` the TensorBoard of ``task_id`` listens on, as a process on the
    agent's host finds it (from the server's command line)."""
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if f"--prefix=/proxy/{task_id}/" in argv:
            flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
            return f"http://{flags['address']}:{flags['port']}"
    raise AssertionError(f"no server process of task {task_id}")


async def test_tensorboard_shows_the_trials_scalars_to_its_owner_only(
    cluster: Env, experiment: dict[str, Any]
) -> None:
    """Nora starts a TensorBoard on her experiment with the CLI (no slots); through the proxy
    TensorBoard's scalars API lists run ``trial_<id>`` with the trial's training and validation
    tags and their steps; Mallory's start on that experiment and her proxy request are 403, an
    unknown experiment is a 404, the server's port refuses a request without the proxy's token;
    ``list``, ``open``, ``logs`` and ``config`` show it, and once killed the proxy answers 410."""
    exp_id, trial_id = experiment["id"], experiment["trial"]
    started = cli_as(cluster, NORA, "--json", "tensorboard", "start", str(exp_id), "--no-browser")
    assert started.returncode == 0, f"{started.stdout}\n{started.stderr}"
    task = json.loads(started.stdout)
    task_id = task["id"]
    assert task["ready"] and task["url"].endswith(f"/proxy/{task_id}/")
    assert task["config"]["resources"]["slots"] == 0
    assert task["tensorboard_sources"] == [
        {"experiment_id": exp_id, "trial_ids": None, "storage": None}
    ]
    base = f"{cluster.api_url}/proxy/{task_id}/"
    run = f"trial_{trial_id}"

    async with aiohttp.ClientSession() as http:
        nora = await login(http, cluster, NORA)
        mallory = await login(http, cluster, MALLORY)

        async def tagged() -> dict[str, Any] | None:
            async with http.get(f"{base}data/plugin/scalars/tags", headers=nora) as answer:
                assert answer.status == 200, await answer.text()
                tags = await answer.json()
            wanted = {"training/loss", "validation/validation_loss"}
            return tags if wanted <= set(tags.get(run, {})) else None

        tags = await wait_until(tagged, timeout=60)
        assert set(tags) == {run}
        steps = await scalars(http, base, nora, run, "training/loss")
        assert steps == [5, 10, 15, 20]

        async with http.get(f"{base}data/plugin/scalars/tags", headers=mallory) as answer:
            assert answer.status == 403
        async with http.post(
            f"{cluster.api_url}/api/v1/tensorboards",
            json={"experiment_ids": [exp_id]},
            headers=mallory,
        ) as answer:
            assert answer.status == 403, await answer.text()
        async with http.post(
            f"{cluster.api_url}/api/v1/tensorboards",
            json={"trial_ids": [trial_id]},
            headers=mallory,
        ) as answer:
            assert answer.status == 403, await answer.text()
        for body, status, says in (
            ({"experiment_ids": [987654]}, 404, "no experiment 987654"),
            ({"trial_ids": [987654]}, 404, "no trial 987654"),
            ({}, 400, "at least one experiment"),
            ({"experiment_ids": list(range(1, 102))}, 400, "experiment_ids"),
            ({"experiment_ids": [exp_id], "config": {"idle_timeout": "5m"}}, 400, "idle_timeout"),
        ):
            async with http.post(
                f"{cluster.api_url}/api/v1/tensorboards", json=body, headers=nora
            ) as answer:
                assert answer.status == status, (body, await answer.text())
                assert says in (await answer.json())["error"]["message"]

        # Whoever reaches the port without the proxy is refused: TensorBoard itself has no
        # credential, the token check in front of it does.
        direct = f"{server_address(task_id)}/proxy/{task_id}/data/plugin/scalars/tags"
        async with http.get(direct) as answer:
            assert answer.status == 403
        async with http.get(direct, headers=nora) as answer:
            assert answer.status == 403  # a cairn session is no credential there either

    listed = cli_as(cluster, MALLORY, "--json", "tensorboard", "list")
    assert json.loads(listed.stdout)["tasks"] == []
    mine = cli_as(cluster, NORA, "tensorboard", "list")
    assert task_id in mine.stdout and f"exp {exp_id}" in mine.stdout
    opened = cli_as(cluster, NORA, "tensorboard", "open", task_id, "--no-browser")
    assert opened.stdout.strip() == f"{cluster.api_url}/proxy/{task_id}/"
    logs = cli_as(cluster, NORA, "tensorboard", "logs", task_id)
    assert "copied 1 TensorBoard file(s)" in logs.stdout + logs.stderr
    assert "resources:" in cli_as(cluster, NORA, "tensorboard", "config").stdout
    nothing = cli_as(cluster, NORA, "tensorboard", "start")
    assert nothing.returncode != 0 and "name experiments" in nothing.stderr
    killed = cli_as(cluster, NORA, "tensorboard", "kill", task_id)
    assert killed.returncode == 0, killed.stderr
    async with aiohttp.ClientSession() as http:
        nora = await login(http, cluster, NORA)

        async def gone() -> bool:
            async with http.get(base, headers=nora) as answer:
                return answer.status == 410

        await wait_until(gone, timeout=30)


def append_scalar(path: Path, step: int, tag: str, value: float) -> None:
    """Appends one scalar event to the event file ``path`` (as a trial's next report does)."""
    with path.open("ab") as out:
        out.write(tfrecord(encode_event(time.time(), step, scalars={tag: value})))


async def test_files_written_after_the_tensorboard_started_show_up(
    cluster: Env, experiment: dict[str, Any]
) -> None:
    """A TensorBoard on one trial (``-t``) shows a step appended to the trial's event file and a
    tag in a new event file, both written in storage after it started serving."""
    trial_id = experiment["trial"]
    started = cli_as(
        cluster, NORA, "--json", "tensorboard", "start", "-t", str(trial_id), "--no-browser"
    )
    assert started.returncode == 0, f"{started.stdout}\n{started.stderr}"
    task = json.loads(started.stdout)
    base = f"{cluster.api_url}/proxy/{task['id']}/"
    run = f"trial_{trial_id}"
    async with aiohttp.ClientSession() as http:
        nora = await login(http, cluster, NORA)

        async def first() -> list[int] | None:
            return await scalars(http, base, nora, run, "training/loss") or None

        assert max(await wait_until(first, timeout=60)) == 20

        event_file = sorted(experiment["tb_dir"].glob("events.out.tfevents.*"))[0]
        append_scalar(event_file, 25, "training/loss", 0.25)
        tag = f"extra/{uuid.uuid4().hex[:6]}"
        writer = EventFileWriter(experiment["tb_dir"], suffix=".late")
        writer.add_scalars(7, {tag: 0.5})
        writer.close()

        async def refreshed() -> bool:
            steps = await scalars(http, base, nora, run, "training/loss")
            return 25 in steps and await scalars(http, base, nora, run, tag) == [7]

        await wait_until(refreshed, timeout=60)
    killed = cli_as(cluster, NORA, "tensorboard", "kill", task["id"])
    assert killed.returncode == 0, killed.stderr
