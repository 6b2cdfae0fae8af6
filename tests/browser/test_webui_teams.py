"""The web UI's workspaces, projects and roles in a real headless Chromium against a real cluster
of processes: an admin builds a workspace and a project, moves an experiment into it, walks
workspace → project → experiment and grants Viewer to a user; that user, in a fresh browser
context, sees the workspace and the experiment but no control to change them; a user with no
role does not see the workspace; a refused action shows the API's message; an admin manages
groups and grants one a role; the user menu leads to a user's permissions and tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from tests.browser.support import Http, LiveCluster, require_browser, start_cluster, wait
from tests.browser.test_webui import Session, logged_in, new_session, scripted

pytestmark = pytest.mark.timeout(240)

WORKSPACE, PROJECT = "vision", "detection"
# A Viewer, a user with no role, an Editor who loses it, a group's member.
USERS = ("vera", "nora", "eddie", "gail")


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCluster]:
    """The cluster (one slot), three users, and one short experiment of admin's."""
    require_browser()
    work = tmp_path_factory.mktemp("webui-teams")
    for cluster in start_cluster(pg_server, work, slots=1):
        for name in USERS:
            body = {"username": name, "password": f"{name}-password", "admin": False}
            cluster.api.call("POST", "/users", body)
        config = scripted(work / "ckpt", steps=10, report_every=5, checkpoint_every=10, sleep=0.01)
        config["name"] = "moving-web"
        cluster.extra["experiment"] = cluster.api.submit(config)
        yield cluster


def workspace_named(api: Http, name: str) -> dict[str, Any] | None:
    """The workspace called ``name`` as admin sees it, if any."""
    found = [w for w in api.call("GET", "/workspaces")["workspaces"] if w["name"] == name]
    return found[0] if found else None


@pytest.fixture
def team(live: LiveCluster) -> dict[str, Any]:
    """Workspace "vision" with project "detection" holding the experiment, and Viewer on it for
    vera: what the admin's test builds through the UI, completed through the API when that test
    did not run first (every step is a no-op when already done)."""
    api, experiment = live.api, live.extra["experiment"]
    workspace = workspace_named(api, WORKSPACE) or api.call(
        "POST", "/workspaces", {"name": WORKSPACE}
    )
    projects = api.call("GET", f"/workspaces/{workspace['id']}/projects")["projects"]
    project = next((p for p in projects if p["name"] == PROJECT), None) or api.call(
        "POST", f"/workspaces/{workspace['id']}/projects", {"name": PROJECT}
    )
    api.call("POST", f"/experiments/{experiment}/move", {"destination_project_id": project["id"]})
    grant = {"role_name": "Viewer", "username": "vera", "workspace": WORKSPACE}
    api.call("POST", "/roles/add-assignments", grant)
    path = f"/experiments?project_id={project['id']}"
    wait(lambda: api.call("GET", path)["experiments"], 30, "the move projected")
    return {"workspace": workspace, "project": project, "experiment": experiment}


def crumbs(session: Session) -> str:
    """The breadcrumbs of the page shown, as text."""
    return str(session.page.inner_text("#breadcrumbs"))


def test_admin_creates_a_workspace_and_project_moves_an_experiment_and_grants_viewer(
    browser: Any, live: LiveCluster
) -> None:
    """Through the UI alone, admin creates workspace "vision" and its project "detection",
    moves the experiment there from its page (its breadcrumbs follow), walks Workspaces →
    vision → detection → the experiment, and grants vera Viewer on the workspace."""
    experiment = live.extra["experiment"]
    session = new_session(browser, live)
    session.login("admin", live.processes.admin_password)
    page = session.page
    page.wait_for_selector("#experiments-table table")

    page.click('[data-nav="workspaces"]')
    page.wait_for_selector('#workspaces-table tr[data-key="Uncategorized"]')
    page.fill("#workspace-name", WORKSPACE)
    page.click("#workspace-create")
    page.wait_for_selector("#workspace-title:has-text('Workspace vision')")
    page.fill("#project-name", PROJECT)
    page.fill("#project-description", "boxes around things")
    page.click("#project-create")
    page.wait_for_selector(f'#projects-table tr[data-key="{PROJECT}"]')
    session.shot("workspace")

    session.go(f"/experiments/{experiment}")
    page.wait_for_selector("#breadcrumbs a")
    assert (
        crumbs(session) == f"Workspaces / Uncategorized / Uncategorized / Experiment {experiment}"
    )
    page.click("#experiment-move")
    page.wait_for_selector("#move-form:not([hidden])")
    page.select_option("#move-workspace", label=WORKSPACE)
    wait(
        lambda: page.locator("#move-project option").all_inner_texts() == [PROJECT], 10, "projects"
    )
    session.shot("experiment-move")
    page.click("#move-submit")
    want = f"Workspaces / {WORKSPACE} / {PROJECT} / Experiment {experiment}"
    wait(lambda: crumbs(session) == want, 30, "the breadcrumbs after the move")
    assert page.inner_text("#move-error") == ""

    page.click("#breadcrumbs >> text=Workspaces")
    row = f'#workspaces-table tr[data-key="{WORKSPACE}"]'
    page.wait_for_selector(row)
    assert page.locator(f"{row} td").nth(1).inner_text() == "1"  # one project
    page.click(f"{row} a")
    page.click(f'#projects-table tr[data-key="{PROJECT}"] a')
    page.wait_for_selector("#project-title:has-text('Project detection')")
    assert crumbs(session) == f"Workspaces / {WORKSPACE} / {PROJECT}"
    exp_row = f'#experiments-table tr[data-id="{experiment}"]'
    wait(lambda: page.locator(exp_row).count() == 1, 30, "the moved experiment in its project")
    session.shot("project")
    page.click(f'{exp_row} a[href="#/experiments/{experiment}"] >> nth=0')
    wait(lambda: crumbs(session) == want, 30, "the experiment page from its project")

    page.click(f"#breadcrumbs >> text={WORKSPACE}")
    page.wait_for_selector("#grant-form")
    page.select_option("#grant-role", "Viewer")
    page.select_option("#grant-kind", "user")
    page.fill("#grant-who", "vera")
    page.click("#grant-submit")
    page.wait_for_selector('#members-table tr[data-key="user:vera:Viewer"]')
    session.shot("workspace-members")
    grants = live.api.call("GET", "/roles/assignments")["assignments"]
    assert {"role": "Viewer", "username": "vera", "workspace": WORKSPACE} in [
        {k: g[k] for k in ("role", "username", "workspace")} for g in grants
    ]
    assert session.errors == [], session.errors
    page.context.close()


def test_viewer_sees_the_workspace_and_experiment_but_no_create_or_move(
    browser: Any, live: LiveCluster, team: dict[str, Any]
) -> None:
    """vera, Viewer on "vision", sees it in Workspaces, its project and the moved experiment,
    but is offered no "create workspace", "create project", grant, Move or experiment action."""
    experiment = team["experiment"]
    session = logged_in(browser, live, "vera")
    page = session.page
    session.go("/workspaces")
    row = f'#workspaces-table tr[data-key="{WORKSPACE}"]'
    page.wait_for_selector(row)
    assert page.locator("#workspace-create-form").count() == 0
    page.click(f"{row} a")
    page.wait_for_selector(f'#projects-table tr[data-key="{PROJECT}"]')
    assert "Viewer" in page.inner_text("#my-roles")
    assert page.locator("#project-create-form").count() == 0
    assert page.locator("#grant-form").count() == 0
    assert page.locator("#workspace-actions button").count() == 0
    assert page.locator("#projects-table button").count() == 0
    session.shot("viewer-workspace")
    page.click(f'#projects-table tr[data-key="{PROJECT}"] a')
    exp_row = f'#experiments-table tr[data-id="{experiment}"]'
    page.wait_for_selector(exp_row)
    assert page.locator(f"{exp_row} button").count() == 0
    assert page.locator("#project-actions button").count() == 0
    page.click(f'{exp_row} a[href="#/experiments/{experiment}"] >> nth=0')
    want = f"Workspaces / {WORKSPACE} / {PROJECT} / Experiment {experiment}"
    wait(lambda: crumbs(session) == want, 30, "the experiment page")
    assert not page.locator("#experiment-move").is_visible()
    assert page.locator("#experiment-actions button").count() == 0
    session.shot("viewer-experiment")
    assert session.errors == [], session.errors
    page.context.close()


def test_user_without_a_role_does_not_see_the_workspace(
    browser: Any, live: LiveCluster, team: dict[str, Any]
) -> None:
    """nora, with no role, sees only Uncategorized in Workspaces; "vision"'s page and the
    experiment moved into it answer Not found and Not allowed."""
    session = logged_in(browser, live, "nora")
    page = session.page
    session.go("/workspaces")
    page.wait_for_selector('#workspaces-table tr[data-key="Uncategorized"]')
    keys = page.eval_on_selector_all(
        "#workspaces-table tbody tr", "rs => rs.map(r => r.dataset.key)"
    )
    assert keys == ["Uncategorized"]
    session.go(f"/workspaces/{team['workspace']['id']}")
    page.wait_for_selector("#page-error[data-status='404']")
    session.go(f"/experiments/{team['experiment']}")
    page.wait_for_selector("#page-error[data-status='403']")
    session.shot("no-role")
    unexpected = [e for e in session.errors if "status of 40" not in e]
    assert unexpected == [], unexpected
    page.context.close()


def test_refused_actions_show_the_apis_message(
    browser: Any, live: LiveCluster, team: dict[str, Any]
) -> None:
    """A project name taken in the workspace shows the API's 409; eddie, Viewer and Editor, whose
    Editor role is withdrawn after his page offered "create project", sees the 403 naming
    create_project, and no project is made."""
    api, workspace = live.api, team["workspace"]
    admin = new_session(browser, live)
    admin.login("admin", live.processes.admin_password)
    admin.page.wait_for_selector("#experiments-table")
    admin.go(f"/workspaces/{workspace['id']}")
    admin.page.fill("#project-name", PROJECT)
    admin.page.click("#project-create")
    wait(lambda: "has a project named" in admin.page.inner_text("#action-error"), 10, "the 409")
    assert admin.errors and all("status of 409" in e for e in admin.errors), admin.errors
    admin.shot("project-conflict")
    admin.page.context.close()

    editor = {"role_name": "Editor", "username": "eddie", "workspace": WORKSPACE}
    api.call("POST", "/roles/add-assignments", editor)
    api.call("POST", "/roles/add-assignments", editor | {"role_name": "Viewer"})
    session = logged_in(browser, live, "eddie")
    page = session.page
    session.go(f"/workspaces/{workspace['id']}")
    page.wait_for_selector("#project-create-form")
    api.call("POST", "/roles/remove-assignments", editor)
    page.fill("#project-name", "too-late")
    page.click("#project-create")
    wait(lambda: page.inner_text("#action-error"), 10, "the 403's message")
    message = page.inner_text("#action-error")
    assert "eddie lacks permission create_project" in message, message
    assert WORKSPACE in message
    names = [
        p["name"] for p in api.call("GET", f"/workspaces/{workspace['id']}/projects")["projects"]
    ]
    assert "too-late" not in names
    session.shot("project-refused")
    page.context.close()


def member_names(page: Any, group: str) -> list[str]:
    """The members the groups table shows for ``group``."""
    row = f'#groups-table tr[data-key="{group}"] .member'
    return list(page.eval_on_selector_all(row, "ms => ms.map(m => m.dataset.member)"))


def test_admin_manages_a_group_and_grants_it_a_role(
    browser: Any, live: LiveCluster, team: dict[str, Any]
) -> None:
    """On Groups, admin creates "labelers" with gail, adds vera, removes gail; on "vision"'s
    page grants the group Editor (gail, no longer a member, gains nothing); deleting the group
    withdraws its grant."""
    api = live.api
    session = new_session(browser, live)
    session.login("admin", live.processes.admin_password)
    page = session.page
    page.wait_for_selector("#experiments-table")
    page.click('[data-nav="groups"]')
    page.wait_for_selector("#group-create-form")
    page.fill("#group-name", "labelers")
    page.fill("#group-members", "gail")
    page.click("#group-create")
    page.wait_for_selector('#groups-table tr[data-key="labelers"]')
    assert member_names(page, "labelers") == ["gail"]
    page.fill('#groups-table tr[data-key="labelers"] input.add-member', "vera")
    page.click('#groups-table tr[data-key="labelers"] [data-action="add-member"]')
    wait(lambda: member_names(page, "labelers") == ["gail", "vera"], 10, "vera added")
    page.click('#groups-table tr[data-key="labelers"] [data-member="gail"] button')
    wait(lambda: member_names(page, "labelers") == ["vera"], 10, "gail removed")
    session.shot("groups")

    session.go(f"/workspaces/{team['workspace']['id']}")
    page.wait_for_selector("#grant-form")
    page.select_option("#grant-role", "Editor")
    page.select_option("#grant-kind", "group")
    page.fill("#grant-who", "labelers")
    page.click("#grant-submit")
    page.wait_for_selector('#members-table tr[data-key="group:labelers:Editor"]')
    vera = Http(live.api.url, live.api.login("vera", "vera-password"))
    gail = Http(live.api.url, live.api.login("gail", "gail-password"))
    assert "create_project" in vera.call("GET", "/permissions/summary")["workspaces"][WORKSPACE]
    assert WORKSPACE not in gail.call("GET", "/permissions/summary")["workspaces"]

    session.go("/groups")
    delete = '#groups-table tr[data-key="labelers"] [data-action="delete"]'
    page.click(delete)
    page.click(delete)  # confirm
    wait(lambda: page.locator('#groups-table tr[data-key="labelers"]').count() == 0, 10, "gone")
    assert "create_project" not in vera.call("GET", "/permissions/summary")["workspaces"][WORKSPACE]
    assert not [g for g in api.call("GET", "/roles/assignments")["assignments"] if g["group_name"]]
    assert session.errors == [], session.errors
    page.context.close()


def test_user_menu_shows_permissions_and_revokes_a_token_then_logs_out(
    browser: Any, live: LiveCluster, team: dict[str, Any]
) -> None:
    """vera's user menu names her and leads to her account: Viewer on "vision", its
    permissions, and her tokens; revoking the other session's token ends it at once (the API
    answers 401 to it); "Log out" returns to the login form."""
    other = live.api.login("vera", "vera-password")
    listed = live.api.call("GET", "/tokens", token=other)["tokens"]
    other_id = next(t["id"] for t in listed if t["current"])
    session = logged_in(browser, live, "vera")
    page = session.page
    assert page.inner_text("#user-menu-button").startswith("vera")
    page.click("#user-menu-button")
    page.click("#menu-account")
    page.wait_for_selector("#tokens-table tbody tr")
    assert page.inner_text("#account-username") == "vera"
    roles = page.inner_text("#my-assignments")
    assert "Viewer" in roles and WORKSPACE in roles
    perms = page.inner_text(f'#my-workspace-permissions tr[data-key="{WORKSPACE}"]')
    assert "view_experiment" in perms and "create_project" not in perms

    current = page.locator("#tokens-table tbody tr:has-text('this session')")
    assert current.count() == 1
    mine = current.get_attribute("data-key")
    assert mine != str(other_id)
    revoke = page.locator(f'#tokens-table tr[data-key="{other_id}"] [data-action="revoke"]')
    revoke.click()
    revoke.click()  # confirm
    gone = f'#tokens-table tr[data-key="{other_id}"]'
    wait(lambda: page.locator(gone).count() == 0, 10, "the token revoked")
    assert page.locator(f'#tokens-table tr[data-key="{mine}"]').count() == 1
    session.shot("account")
    try:
        live.api.call("GET", "/permissions/summary", token=other)
        answered = "200"
    except AssertionError as exc:
        answered = str(exc)
    assert "-> 401" in answered, answered

    page.click("#user-menu-button")
    page.click("#logout")
    page.wait_for_selector("#login-form")
    assert session.errors == [], session.errors
    page.context.close()
