"""The web UI's Tasks page in a real headless Chromium against a real cluster of processes:
a user lists their command tasks, reads one's output and kills another; another user's list
does not show them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from tests.browser.support import LiveCluster, require_browser, start_cluster, wait
from tests.browser.test_webui import logged_in

pytestmark = pytest.mark.timeout(240)

SLEEPER = "import time; print('waiting for work', flush=True); time.sleep(600)"
PRINTER = "print('prepared 42 shards')"


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCluster]:
    """The cluster (two slots) with users ``bob`` and ``carol``; bob runs two commands."""
    require_browser()
    work = tmp_path_factory.mktemp("webui-tasks")
    for cluster in start_cluster(pg_server, work, slots=2):
        api = cluster.api
        for name in ("bob", "carol"):
            body = {"username": name, "password": f"{name}-password", "admin": False}
            api.call("POST", "/users", body)
        bob = api.login("bob", "bob-password")
        for key, script in (("printer", PRINTER), ("sleeper", SLEEPER)):
            body = {"argv": ["python", "-c", script], "config": {"description": key}}
            cluster.extra[key] = api.call("POST", "/commands", body, bob)["id"]
        yield cluster


def test_tasks_page_lists_a_users_commands_shows_output_and_kills_one(
    browser: Any, live: LiveCluster
) -> None:
    """Bob's Tasks page lists both his commands; one's page shows its output and outcome; the
    kill button on the other (running) ends it ``killed``; Carol's page lists neither."""
    printer, sleeper = live.extra["printer"], live.extra["sleeper"]
    bob = logged_in(browser, live, "bob")
    page = bob.page
    bob.go("/tasks")
    page.wait_for_selector(f'#tasks-table tr[data-task="{printer}"]')
    assert page.locator(f'#tasks-table tr[data-task="{sleeper}"]').count() == 1
    assert "command" in page.inner_text(f'#tasks-table tr[data-task="{printer}"]')

    page.click(f'#tasks-table a[href="#/tasks/{printer}"]')
    wait(lambda: "prepared 42 shards" in page.inner_text("#task-logs .logs"), 60, "its output")
    wait(lambda: page.get_attribute("#task-facts", "data-state") == "TERMINATED", 30, "its exit")
    assert "completed" in page.inner_text("#task-facts")
    bob.shot("task")

    bob.go("/tasks")
    row = f'#tasks-table tr[data-task="{sleeper}"]'
    wait(lambda: page.get_attribute(row, "data-state") == "RUNNING", 60, "the sleeper running")
    page.click(f"{row} button.task-kill")
    wait(lambda: page.get_attribute(row, "data-state") == "TERMINATED", 60, "the kill")
    assert "killed" in page.inner_text(row)
    bob.shot("tasks")
    assert bob.errors == [], bob.errors

    carol = logged_in(browser, live, "carol")
    carol.go("/tasks")
    carol.page.wait_for_selector("#tasks-table p.muted")
    assert carol.page.locator("#tasks-table tr[data-task]").count() == 0
    assert carol.errors == [], carol.errors


def test_a_ready_shell_names_its_attach_command_instead_of_a_page_and_is_killed_from_it(
    browser: Any, live: LiveCluster
) -> None:
    """Bob's shell is listed as a ``shell``; once it serves its row names `cairn shell open ID`
    and offers no Open link (a shell has no page); its kill button ends it ``killed``."""
    token = live.api.login("bob", "bob-password")
    body = {"config": {"resources": {"slots": 0}, "description": "bob's shell"}}
    shell = live.api.call("POST", "/shells", body, token)["id"]
    bob = logged_in(browser, live, "bob")
    page = bob.page
    bob.go("/tasks")
    row = f'#tasks-table tr[data-task="{shell}"]'
    attach = f"{row} code.task-attach"
    wait(lambda: page.locator(attach).count() == 1, 90, "the shell serving")
    assert page.inner_text(attach) == f"cairn shell open {shell}"
    assert "shell" in page.inner_text(row) and page.locator(f"{row} a.task-open").count() == 0
    page.click(f"{row} button.task-kill")
    wait(lambda: page.get_attribute(row, "data-state") == "TERMINATED", 60, "the kill")
    assert "killed" in page.inner_text(row)
    assert bob.errors == [], bob.errors


def test_tasks_show_their_workspace_and_a_viewer_there_sees_but_cannot_kill(
    browser: Any, live: LiveCluster
) -> None:
    """Bob's command in workspace ``lab`` is listed with its workspace; Carol, a Viewer of
    ``lab``, sees it (its page names the workspace) without a kill button; the workspace filter
    shows ``lab``'s tasks only."""
    api = live.api
    api.call("POST", "/workspaces", {"name": "lab"})
    for role, name in (("Editor", "bob"), ("Viewer", "carol")):
        api.call(
            "POST", "/roles/add-assignments",
            {"role_name": role, "username": name, "workspace": "lab"},
        )  # fmt: skip
    bob_token = api.login("bob", "bob-password")
    body = {
        "argv": ["python", "-c", SLEEPER],
        "config": {"description": "lab sleeper", "resources": {"slots": 0}},
        "workspace": "lab",
    }
    in_lab = api.call("POST", "/commands", body, bob_token)
    assert in_lab["workspace"] == "lab"

    bob = logged_in(browser, live, "bob")
    bob.go("/tasks")
    row = f'#tasks-table tr[data-task="{in_lab["id"]}"]'
    bob.page.wait_for_selector(row)
    assert bob.page.inner_text(f"{row} td.task-workspace") == "lab"
    assert bob.page.locator(f"{row} button.task-kill").count() == 1
    assert bob.errors == [], bob.errors

    carol = logged_in(browser, live, "carol")
    page = carol.page
    carol.go("/tasks")
    page.wait_for_selector(row)
    assert page.inner_text(f"{row} td.task-workspace") == "lab"
    assert page.locator(f"{row} button.task-kill").count() == 0
    assert page.locator("#tasks-table tr[data-task]").count() == 1  # bob's others are his own
    lab_id = next(
        w["id"] for w in api.call("GET", "/workspaces")["workspaces"] if w["name"] == "lab"
    )
    page.select_option("#filter-workspace", str(lab_id))
    wait(lambda: page.locator("#tasks-table tr[data-task]").count() == 1, 30, "lab's tasks")
    page.select_option("#filter-workspace", "1")
    wait(lambda: page.locator("#tasks-table p.muted").count() == 1, 30, "no uncategorized task")
    carol.go(f"/tasks/{in_lab['id']}")
    page.wait_for_selector("#task-facts dd")
    assert "lab" in page.inner_text("#task-facts")
    assert page.locator("#task-actions button.task-kill").count() == 0
    carol.shot("tasks-viewer")
    assert carol.errors == [], carol.errors
    api.call("POST", f"/tasks/{in_lab['id']}/kill", {}, bob_token)
