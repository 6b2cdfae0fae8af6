"""The web UI's model registry in a real headless Chromium against a real cluster of processes:
a checkpoint of a finished trial is registered from the trial's page (the model is made on the
way), the Models page lists the model with its workspace, its page lists the version linking to
its trial, and a model moves to another workspace from its page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from tests.browser.support import Http, LiveCluster, require_browser, start_cluster, wait
from tests.browser.test_webui import new_session, scripted

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCluster]:
    """The cluster (one slot) with one short scripted experiment run to completion."""
    require_browser()
    work = tmp_path_factory.mktemp("webui-models")
    for cluster in start_cluster(pg_server, work, slots=1):
        config = scripted(work / "ckpt", steps=20, report_every=5, checkpoint_every=10, sleep=0.01)
        config["name"] = "registry-web"
        cluster.extra["trial"] = finished_trial(cluster.api, cluster.api.submit(config))
        yield cluster


def finished_trial(api: Http, experiment_id: int) -> int:
    """The first trial of ``experiment_id`` once the experiment has completed."""
    path = f"/experiments/{experiment_id}"
    wait(lambda: api.call("GET", path)["state"] == "COMPLETED", 120, "the experiment's end")
    return int(api.call("GET", path)["trials"][0]["trial_id"])


def test_register_a_checkpoint_from_the_trial_page_and_browse_the_model(
    browser: Any, live: LiveCluster
) -> None:
    """ "register" on a trial's checkpoint makes model "web model" with version 1; the Models
    page lists it, its page lists the version with its checkpoint, and the version's trial link
    leads back to the trial."""
    trial = live.extra["trial"]
    session = new_session(browser, live)
    session.login("admin", live.processes.admin_password)
    page = session.page
    page.wait_for_selector("#experiments-table")
    session.go(f"/trials/{trial}")
    page.wait_for_selector("#trial-checkpoints button.ckpt-register")
    uuid = page.get_attribute("#trial-checkpoints button.ckpt-register", "data-uuid")
    page.click("#trial-checkpoints button.ckpt-register")
    page.fill("#register-model", "web model")
    page.click("#register-submit")
    wait(lambda: "version 1 of" in page.inner_text("#register-result"), 30, "the registration")
    session.shot("trial-register")

    page.click("#register-result a")
    page.wait_for_selector('#model-versions tr[data-key="1"]')
    row = page.inner_text('#model-versions tr[data-key="1"]')
    assert uuid is not None and uuid in row
    assert "COMPLETED" in row
    session.shot("model")

    session.go("/models")
    page.wait_for_selector('#models-table tr[data-key="web model"]')
    assert "1" in page.inner_text('#models-table tr[data-key="web model"]')
    session.shot("models")
    page.click('#models-table a[href="#/models/web%20model"]')
    page.click('#model-versions tr[data-key="1"] a.version-trial')
    page.wait_for_selector("#trial-info")
    assert page.url.endswith(f"#/trials/{trial}")
    assert session.errors == [], session.errors
    page.context.close()


def test_the_models_page_shows_workspaces_and_a_model_moves_from_its_page(
    browser: Any, live: LiveCluster
) -> None:
    """The Models page shows each model's workspace; on the model's page "Move" offers the
    workspaces where the user may create models, and moving there shows the new workspace on
    the page and in the list."""
    live.api.call("POST", "/workspaces", {"name": "lab"})
    live.api.call("POST", "/models", {"name": "moving model"})
    session = new_session(browser, live)
    session.login("admin", live.processes.admin_password)
    page = session.page
    page.wait_for_selector("#experiments-table")
    session.go("/models")
    row = '#models-table tr[data-key="moving model"]'
    page.wait_for_selector(row)
    assert "Uncategorized" in page.inner_text(row)

    session.go("/models/moving%20model")
    page.wait_for_selector("#model-workspace")
    assert page.inner_text("#model-workspace") == "Uncategorized"
    assert not page.is_visible("#model-move-form")
    page.click("#model-move")
    page.wait_for_selector("#model-move-form", state="visible")
    page.select_option("#model-move-workspace", label="lab")
    page.click("#model-move-submit")
    wait(lambda: page.inner_text("#model-workspace") == "lab", 30, "the move")
    session.shot("model-moved")
    assert page.inner_text("#model-move-error") == ""
    assert not page.is_visible("#model-move-form")

    session.go("/models")
    page.wait_for_selector(row)
    wait(lambda: "lab" in page.inner_text(row), 30, "the list to show the new workspace")
    assert session.errors == [], session.errors
    page.context.close()
