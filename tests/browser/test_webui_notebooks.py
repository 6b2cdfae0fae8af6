"""A notebook from the web UI in a real headless Chromium against a real cluster of processes:
launched from the Tasks page, opened through the task proxy with the login's session cookie
(no token in any URL), a cell run in the real JupyterLab, and kept from another user."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from tests.browser.support import (
    ARTIFACTS,
    LiveCluster,
    require_browser,
    start_cluster,
    wait,
)
from tests.browser.test_webui import logged_in

pytestmark = pytest.mark.timeout(300)

CELL = "import cairn as det; print('task', det.get_cluster_info().task_id)"


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCluster]:
    """The cluster (one slot; the notebook holds none) with users ``nora`` and ``mallory``."""
    require_browser()
    pytest.importorskip("jupyterlab")
    work = tmp_path_factory.mktemp("webui-notebooks")
    for cluster in start_cluster(pg_server, work, slots=1):
        for name in ("nora", "mallory"):
            body = {"username": name, "password": f"{name}-password", "admin": False}
            cluster.api.call("POST", "/users", body)
        yield cluster


def run_first_cell(lab: Any, code: str) -> str:
    """Creates a Python notebook from JupyterLab's launcher, runs ``code`` in its first cell
    and returns the cell's output once it shows."""
    lab.click('.jp-LauncherCard[data-category="Notebook"]', timeout=60_000)
    # A cell run before the kernel is connected is dropped, not queued: wait until the status
    # bar says it is idle (the toolbar's indicator says "idle" before there is a kernel at all).
    kernel = lab.locator('.jp-StatusBar-TextItem[title^="Change kernel"]', has_text="| Idle")
    kernel.wait_for(timeout=90_000)
    lab.locator(".jp-NotebookPanel .jp-Cell .cm-content").first.click()
    lab.keyboard.type(code)
    lab.keyboard.press("Shift+Enter")
    output = lab.locator(".jp-NotebookPanel .jp-OutputArea-output").first
    try:
        output.wait_for(timeout=60_000)
    except Exception:
        lab.screenshot(path=str(ARTIFACTS / "notebook-lab-failed.png"))
        raise
    return str(output.inner_text())


def test_a_notebook_launched_in_the_web_ui_opens_in_jupyterlab_for_its_owner_only(
    browser: Any, live: LiveCluster
) -> None:
    """Nora launches a notebook from the Tasks page (no slots), follows its "Open" link once it
    serves, and the proxied JupyterLab (her login's cookie, no token in the URL) runs a cell
    printing the task's id; the task's page links to it too; Mallory's Tasks page does not list
    it, the proxy refuses her (403) and her launch with a bad idle timeout is refused naming the
    field; killing it from the page ends it and removes the link."""
    nora = logged_in(browser, live, "nora")
    page = nora.page
    cookie = {c["name"]: c for c in page.context.cookies()}["cairn_session"]
    assert cookie["path"] == "/proxy/" and cookie["httpOnly"]

    nora.go("/tasks")
    page.click("#launch-notebook")
    row = page.locator('#tasks-table tr[data-task]:has-text("notebook")')
    row.wait_for()
    task_id = row.get_attribute("data-task")
    assert (
        task_id and live.api.call("GET", f"/tasks/{task_id}")["config"]["resources"]["slots"] == 0
    )
    link = f'#tasks-table tr[data-task="{task_id}"] a.task-open'
    page.wait_for_selector(link, timeout=120_000)
    assert page.get_attribute(link, "href") == f"/proxy/{task_id}/lab"
    nora.shot("notebook-tasks")
    nora.go(f"/tasks/{task_id}")
    page.wait_for_selector(f'#task-actions a.task-open[href="/proxy/{task_id}/lab"]')
    nora.go("/tasks")
    page.wait_for_selector(link)

    with page.context.expect_page() as opened:
        page.click(link)
    lab = opened.value
    assert lab.url.startswith(f"{live.processes.api_url}/proxy/{task_id}/lab")
    assert "token" not in lab.url
    output = run_first_cell(lab, CELL)
    assert f"task {task_id}" in output, output
    lab.screenshot(path=str(ARTIFACTS / "notebook-lab.png"))
    lab.close()

    mallory = logged_in(browser, live, "mallory")
    mallory.go("/tasks")
    mallory.page.wait_for_selector("#tasks-table p.muted")
    assert mallory.page.locator("#tasks-table tr[data-task]").count() == 0
    refused = mallory.page.goto(f"{live.processes.api_url}/proxy/{task_id}/lab")
    assert refused is not None and refused.status == 403
    mallory.go("/tasks")
    mallory.page.fill("#notebook-idle-timeout", "soon")
    mallory.page.click("#launch-notebook")
    wait(lambda: "idle_timeout" in mallory.page.inner_text("#action-error"), 30, "the 400")
    assert mallory.page.locator("#tasks-table tr[data-task]").count() == 0

    row_of = f'#tasks-table tr[data-task="{task_id}"]'
    page.click(f"{row_of} button.task-kill")
    wait(lambda: page.get_attribute(row_of, "data-state") == "TERMINATED", 60, "the kill")
    assert page.locator(link).count() == 0
    assert nora.errors == [], nora.errors
