"""TensorBoard from the web UI in a real headless Chromium against a real cluster of processes: "Open
TensorBoard" on a finished experiment's page starts one, the tab it opens lands on the real
TensorBoard through the task proxy (the login's session cookie, no token in any URL) showing the
trial's scalars, and the Tasks page lists it; the compare page opens one over the trials compared."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from tests.browser.support import ARTIFACTS, Http, LiveCluster, require_browser, start_cluster, wait
from tests.browser.test_webui import logged_in, scripted

pytestmark = pytest.mark.timeout(300)


def completed(api: Http, experiment_id: int) -> dict[str, Any] | None:
    """The experiment once it completed (``None`` before)."""
    exp = api.call("GET", f"/experiments/{experiment_id}")
    return exp if exp["state"] == "COMPLETED" else None


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCluster]:
    """The cluster (one slot) with user ``nora`` and her finished scripted experiment, whose
    trial wrote TensorBoard scalars into shared_fs storage."""
    require_browser()
    work = tmp_path_factory.mktemp("webui-tensorboards")
    for cluster in start_cluster(pg_server, work, slots=1):
        body = {"username": "nora", "password": "nora-password", "admin": False}
        cluster.api.call("POST", "/users", body)
        nora = Http(cluster.processes.api_url)
        nora.token = nora.login("nora", "nora-password")
        exp_id = nora.submit(scripted(work / "ckpt", steps=20, report_every=5, sleep=0.01))
        exp = wait(functools.partial(completed, nora, exp_id), 120, "the experiment to complete")
        cluster.extra.update(experiment=exp_id, trial=exp["trials"][0]["trial_id"])
        yield cluster


def test_open_tensorboard_on_an_experiment_shows_its_scalars(
    browser: Any, live: LiveCluster
) -> None:
    """Nora clicks "Open TensorBoard" on her experiment: a tab opens and lands on
    ``/proxy/<task>/`` (no token in the URL), where TensorBoard shows the trial's run and its
    ``training/loss`` chart; the Tasks page lists the TensorBoard with an Open link; on the
    compare page the button opens one over the trials compared."""
    exp_id, trial_id = live.extra["experiment"], live.extra["trial"]
    nora = logged_in(browser, live, "nora")
    page = nora.page
    nora.go(f"/experiments/{exp_id}")
    with page.context.expect_page() as opened:
        page.click("#open-tensorboard")
    board = opened.value
    link = page.locator("#tensorboard-link")
    link.wait_for(timeout=120_000)
    task_id = link.get_attribute("data-task")
    wait(lambda: f"/proxy/{task_id}/" in board.url, 60, "the tab to reach TensorBoard")
    assert board.url.startswith(f"{live.processes.api_url}/proxy/{task_id}/")
    assert "token" not in board.url
    try:
        board.get_by_text(f"trial_{trial_id}").first.wait_for(timeout=90_000)
        board.get_by_text("training/loss").first.wait_for(timeout=90_000)
    finally:
        board.screenshot(path=str(ARTIFACTS / "tensorboard-scalars.png"))
    board.close()
    task = live.api.call("GET", f"/tasks/{task_id}")
    assert task["kind"] == "tensorboard" and task["owner"] == "nora"
    assert task["config"]["resources"]["slots"] == 0

    nora.go("/tasks")
    row = f'#tasks-table tr[data-task="{task_id}"]'
    page.wait_for_selector(f'{row} a.task-open[href="/proxy/{task_id}/"]')
    assert "tensorboard" in page.inner_text(row)

    nora.go(f"/compare?trials={trial_id},{trial_id}")
    with page.context.expect_page() as compared:
        page.click("#open-tensorboard")
    page.locator("#tensorboard-link").wait_for(timeout=120_000)
    other = page.get_attribute("#tensorboard-link", "data-task")
    assert other != task_id
    shown = live.api.call("GET", f"/tasks/{other}")["tensorboard_sources"]
    assert [(s["experiment_id"], s["trial_ids"]) for s in shown] == [(exp_id, [trial_id])]
    wait(lambda: f"/proxy/{other}/" in compared.value.url, 60, "the compare tab")
    compared.value.close()
    assert nora.errors == [], nora.errors
