"""The web UI in a real headless Chromium against a real cluster of processes.

One cluster and one browser serve the module. A grid search over the scripted trial's length
gives three trials with different hyperparameters and metrics; a slow single-trial experiment
stays ACTIVE for the pause/activate steps. Every page is screenshotted under
``test-artifacts/webui``; a page that logs a console error (or throws) fails its test.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cairn.local.servers import ServerProcess
from tests.browser.support import (
    ARTIFACTS,
    SCRIPTED,
    LiveCluster,
    require_browser,
    start_cluster,
    wait,
)

pytestmark = pytest.mark.timeout(240)
STEPS = (20, 40, 60)


def scripted(checkpoints: Path, **hparams: Any) -> dict[str, Any]:
    """The scripted example's config with these hyperparameters and shared_fs storage."""
    config = copy.deepcopy(yaml.safe_load((SCRIPTED / "config.yaml").read_text()))
    config["hyperparameters"].update(hparams)
    config["checkpoint_storage"] = {"type": "shared_fs", "host_path": str(checkpoints)}
    config["reproducibility"] = {"experiment_seed": 7}
    return config


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveCluster]:
    """The cluster, a user ``bob``, the grid search and the slow experiment."""
    require_browser()
    work = tmp_path_factory.mktemp("webui")
    for cluster in start_cluster(pg_server, work):
        api = cluster.api
        api.call("POST", "/users", {"username": "bob", "password": "bob-password", "admin": False})
        grid = scripted(work / "ckpt", sleep=0.12, report_every=2, checkpoint_every=10)
        grid["name"] = "grid-web"
        grid["profiling"] = {"enabled": True}  # accepted, ignored: the page must say so
        grid["hyperparameters"]["steps"] = {"type": "categorical", "vals": list(STEPS)}
        grid["searcher"] = {
            "name": "grid",
            "metric": "validation_loss",
            "smaller_is_better": True,
        }
        cluster.extra["grid"] = api.submit(grid)
        slow = scripted(work / "ckpt", steps=5000, sleep=0.5, report_every=5)
        slow["name"] = "slow-web"
        cluster.extra["slow"] = api.submit(slow)
        yield cluster


class Session:
    """A browser page that records console errors and takes screenshots."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        page.on(
            "response",
            lambda r: (
                self.errors.append(f"status of {r.status}: {r.url}") if r.status >= 400 else None
            ),
        )

    def go(self, route: str) -> None:
        """Opens ``#<route>`` of the UI."""
        self.page.goto(f"{self.base}/#{route}")

    def login(self, username: str, password: str) -> None:
        """Logs in through the form."""
        self.go("/login")
        self.page.fill("#username", username)
        self.page.fill("#password", password)
        self.page.click("#login-form button[type=submit]")

    def shot(self, name: str) -> None:
        """Saves a full-page screenshot as a test artifact."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def new_session(browser: Any, live: LiveCluster) -> Session:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    return Session(context.new_page(), live.processes.api_url)


def logged_in(browser: Any, live: LiveCluster, name: str) -> Session:
    """A page logged in as ``name`` (password ``<name>-password``), on the experiment list."""
    session = new_session(browser, live)
    session.login(name, f"{name}-password")
    session.page.wait_for_selector("#experiments-table")
    return session


@pytest.fixture
def admin(browser: Any, live: LiveCluster) -> Iterator[Session]:
    """A page logged in as admin; fails the test on any console error."""
    session = new_session(browser, live)
    session.login("admin", live.processes.admin_password)
    session.page.wait_for_selector("#experiments-table table")
    yield session
    session.page.context.close()
    assert session.errors == [], session.errors


def points(session: Session, selector: str = "#learning-curves") -> int:
    """How many points the chart under ``selector`` holds now."""
    value = session.page.get_attribute(selector, "data-points")
    return int(value or 0)


def test_experiment_curves_grow_live_and_hparam_plots_brush(
    admin: Session, live: LiveCluster
) -> None:
    """The experiment page draws every trial's curve, adds new points from the event stream
    without reloading, brushing the parallel coordinates filters the trials, and the history
    slider shows the experiment as it was at its submission (no trials yet) until "now"."""
    grid = live.extra["grid"]
    page = admin.page
    admin.go(f"/experiments/{grid}")
    page.wait_for_selector("#learning-curves canvas")
    page.evaluate("window.__sameDocument = true")
    wait(lambda: points(admin) > 0, 60, "a first point on the chart")
    first = points(admin)
    wait(lambda: points(admin) > first, 60, "the curve growing live")
    assert page.evaluate("window.__sameDocument") is True  # no reload happened
    wait(
        lambda: int(page.get_attribute("#learning-curves", "data-series") or 0) == 3, 60, "3 trials"
    )
    assert page.locator("#config-yaml").inner_text().count("searcher:") == 1
    assert "profiling" in page.locator("#config-warnings").inner_text()
    headers = page.locator("#trials-table th").all_inner_texts()
    assert "steps" in headers  # one column per hyperparameter
    admin.shot("experiment")

    # Click a trial row: its curve is highlighted.
    page.locator("#trials-table tbody tr").first.click()
    wait(lambda: page.get_attribute("#learning-curves", "data-highlighted"), 10, "a highlight")

    # Every trial has finished; brush the metric axis of the parallel coordinates.
    wait(
        lambda: page.locator("#trials-table .state-COMPLETED").count() == 3,
        90,
        "the grid's three trials completed",
    )
    page.click("[data-tab=hparams]")
    page.wait_for_selector("#pcp canvas")
    page.wait_for_selector("#heatmap canvas")
    box = page.locator("#pcp").bounding_box()
    assert box is not None
    # Two axes (steps, validation_loss) between the grid's left 60 px and right 90 px.
    x = box["x"] + box["width"] - 90
    top, bottom = box["y"] + 40, box["y"] + box["height"] - 30
    page.mouse.move(x, top - 5)
    page.mouse.down()
    page.mouse.move(x, top + (bottom - top) * 0.45, steps=8)
    page.mouse.up()
    wait(lambda: "of 3 trials selected" in page.inner_text("#pcp-selection"), 10, "a brush")
    selected = int(page.inner_text("#pcp-selection").split()[0])
    assert 0 < selected < 3
    assert page.locator("#trials-table tr.dim").count() == 3 - selected
    admin.shot("experiment-hparams")

    page.click("[data-tab=checkpoints]")
    page.wait_for_selector("#checkpoints-table tbody tr")
    page.click("[data-tab=logs]")
    wait(lambda: "done at step" in page.inner_text(".logs"), 30, "experiment logs")

    # The history slider: at its submission the experiment had no trials; "now" is live again.
    page.click("[data-tab=trials]")
    page.eval_on_selector(
        "#history-slider", "el => { el.value = el.min; el.dispatchEvent(new Event('change')); }"
    )
    wait(lambda: "as it was at" in page.inner_text("#history-label"), 30, "the past state")
    assert page.locator("#trials-table tbody tr").count() == 0
    assert page.inner_text("#experiment-state").startswith("ACTIVE")
    assert page.locator("#experiment-actions button").count() == 0
    page.click("#history-now")
    wait(lambda: page.locator("#trials-table tbody tr").count() == 3, 30, "the present again")


def test_trial_page_follows_log_filters_and_downloads(admin: Session, live: LiveCluster) -> None:
    """The trial page draws a chart per metric and a log that follows the running trial and
    filters by text and level."""
    slow = live.extra["slow"]
    trials = wait(lambda: live.api.call("GET", f"/experiments/{slow}")["trials"], 60, "a trial")
    trial_id = trials[0]["trial_id"]
    page = admin.page
    admin.go(f"/trials/{trial_id}")
    page.wait_for_selector("#trial-charts canvas", timeout=60_000)
    wait(lambda: "step 5 loss" in page.inner_text(".logs"), 60, "log lines")
    seen = page.inner_text(".log-count")
    wait(lambda: page.inner_text(".log-count") != seen, 30, "the log following new lines")
    page.fill(".log-text", "step 10 loss")
    wait(lambda: page.inner_text(".log-count").startswith("1 of"), 10, "the text filter")
    page.fill(".log-text", "")
    page.select_option(".log-level", "ERROR")
    wait(lambda: page.inner_text(".log-count").startswith("0 of"), 10, "the level filter")
    page.select_option(".log-level", "")
    with page.expect_download() as download:
        page.click(".log-download")
    assert download.value.suggested_filename == f"trial-{trial_id}.log"
    charts = page.locator("#trial-charts [data-metric]").evaluate_all(
        "els => els.map(e => e.dataset.metric)"
    )
    assert {"loss", "validation_loss"} <= set(charts)
    admin.shot("trial")


def test_compare_two_trials_with_differences_only(admin: Session, live: LiveCluster) -> None:
    """Comparing two trials overlays their curves and "differences only" keeps the rows that
    differ (the grid's ``steps``) and drops the equal ones (``sleep``)."""
    grid = live.extra["grid"]
    page = admin.page
    admin.go(f"/experiments/{grid}")
    page.wait_for_selector("#trials-table tbody tr")
    boxes = page.locator("#trials-table input.pick")
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.click("#compare-selected")
    page.wait_for_selector("#compare-charts canvas")
    names = page.locator("#compare-hparams tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.name)"
    )
    assert {"steps", "sleep"} <= set(names)
    page.check("#differences-only")
    names = page.locator("#compare-hparams tbody tr").evaluate_all(
        "rs => rs.map(r => r.dataset.name)"
    )
    assert "steps" in names and "sleep" not in names
    series = page.locator("#compare-charts [data-series]").first.get_attribute("data-series")
    assert series == "2"
    admin.shot("compare")


def test_pause_and_activate_from_the_experiment_list(admin: Session, live: LiveCluster) -> None:
    """The row counts running/total trials; its pause and activate buttons change its state,
    shown live."""
    slow = live.extra["slow"]
    page = admin.page
    row = page.locator(f"#experiments-table tr[data-id='{slow}']")
    wait(lambda: "1/1" in row.inner_text(), 60, "its one trial running (running/total)")
    row.locator("[data-action=pause]").click()
    wait(lambda: row.locator(".state-PAUSED").count() == 1, 20, "PAUSED")
    assert live.api.call("GET", f"/experiments/{slow}")["state"] == "PAUSED"
    admin.shot("experiments")
    row.locator("[data-action=activate]").click()
    wait(lambda: row.locator(".state-ACTIVE").count() == 1, 20, "ACTIVE again")
    assert live.api.call("GET", f"/experiments/{slow}")["state"] == "ACTIVE"


def test_cluster_page_shows_agent_slots_and_holders(admin: Session, live: LiveCluster) -> None:
    """The cluster page lists the agent with its slots, who holds them, and the pools."""
    page = admin.page
    admin.go("/cluster")
    page.wait_for_selector("#agents-table tr[data-agent='agent-a']")
    wait(lambda: "trial" in page.inner_text("#agents-table"), 30, "a slot held by a trial")
    assert "default" in page.inner_text("#pools-table")
    page.wait_for_selector("#utilisation canvas")
    admin.shot("cluster")


def test_bad_input_wrong_password_not_allowed_not_found(browser: Any, live: LiveCluster) -> None:
    """A wrong password shows an error; bob sees "Not allowed" on admin's experiment and
    "Not found" on unknown experiment and trial ids."""
    session = new_session(browser, live)
    page = session.page
    session.login("admin", "wrong")
    page.wait_for_selector("#login-error:has-text('Wrong username or password')")
    session.shot("login-error")
    session.login("bob", "bob-password")
    page.wait_for_selector("#experiments-table")
    assert "No experiments match." in page.inner_text("#experiments-table")
    session.go(f"/experiments/{live.extra['grid']}")
    page.wait_for_selector("#page-error[data-status='403']:has-text('Not allowed')")
    session.shot("not-allowed")
    session.go("/experiments/987654")
    page.wait_for_selector("#page-error[data-status='404']:has-text('Not found')")
    session.go("/trials/987654.1")
    page.wait_for_selector("#page-error[data-status='404']:has-text('Not found')")
    session.shot("not-found")
    # The only console errors are the browser's own notes of the refused requests.
    unexpected = [e for e in session.errors if "status of 40" not in e]
    assert unexpected == []
    page.context.close()
