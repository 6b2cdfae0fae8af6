"""The web UI's Webhooks page in a real headless Chromium against a real cluster of processes:
a webhook is created from the form (its signing key shown), a test delivery reaches a real
receiver, a finished experiment's delivery shows in the list with the receiver's answer, and
the webhook is deleted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from cairn.local.servers import ServerProcess
from tests.browser.support import LiveCluster, require_browser, start_cluster, wait
from tests.browser.test_webui import new_session, scripted
from tests.browser.test_webui_models import finished_trial

pytestmark = pytest.mark.timeout(240)

HOST = "127.0.0.2"
"""The receiver's address: a loopback address the cluster config allows (the API's is not)."""


class Receiver(ThreadingHTTPServer):
    """A real HTTP receiver: records each POST's path and body, answers 200."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                receiver.seen.append((self.path, self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__((HOST, 0), Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def live(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory, receiver: Receiver
) -> Iterator[LiveCluster]:
    """The cluster, its config allowing webhooks to the receiver."""
    require_browser()
    work = tmp_path_factory.mktemp("webui-webhooks")
    webhooks = (
        "webhooks:\n"
        f'  allowed_urls: ["http://{HOST}:{receiver.port}/"]\n'
        f'  allowed_networks: ["{HOST}/32"]\n'
    )
    for cluster in start_cluster(pg_server, work, slots=1, cluster_config=webhooks):
        cluster.extra["work"] = work
        yield cluster


def test_create_test_watch_and_delete_a_webhook(
    browser: Any, live: LiveCluster, receiver: Receiver
) -> None:
    """The form creates a webhook and shows its key; "test" reports the receiver's 200; an
    experiment's completion is delivered and the row shows it; "delete" removes the row."""
    session = new_session(browser, live)
    session.login("admin", live.processes.admin_password)
    page = session.page
    page.wait_for_selector("#experiments-table")
    session.go("/webhooks")
    page.wait_for_selector("#no-webhooks")
    page.fill("#webhook-name", "web-hook")
    page.fill("#webhook-url", f"http://{HOST}:{receiver.port}/hook")
    page.select_option("#webhook-trigger", "EXPERIMENT_STATE_CHANGE:COMPLETED")
    page.click("#create-webhook")
    wait(lambda: "signed with key" in page.inner_text("#webhook-key"), 30, "the created webhook")
    row = page.wait_for_selector("#webhooks-table tr[data-key]")
    assert row is not None
    key = row.get_attribute("data-key")
    assert "web-hook" in row.inner_text() and "never sent" in row.inner_text()
    session.shot("webhooks-created")

    page.click(f'#webhooks-table tr[data-key="{key}"] button.webhook-test')
    wait(lambda: "answered 200" in page.inner_text("#webhook-tested"), 30, "the test delivery")
    assert [path for path, _ in receiver.seen] == ["/hook"]

    config = scripted(live.extra["work"] / "ckpt", steps=5, report_every=5, sleep=0.01)
    config["name"] = "hooked"
    finished_trial(live.api, live.api.submit(config))
    wait(lambda: len(receiver.seen) == 2, 60, "the completion's delivery")
    assert b'"EXPERIMENT_STATE_CHANGE"' in receiver.seen[1][1]
    selector = f'#webhooks-table tr[data-key="{key}"] .webhook-last-status'
    wait(lambda: page.query_selector(selector) is not None, 30, "the delivery in the list")
    assert page.inner_text(selector) == "answered 200"
    session.shot("webhooks-delivered")

    page.on("dialog", lambda dialog: dialog.accept())
    page.click(f'#webhooks-table tr[data-key="{key}"] button.webhook-delete')
    page.wait_for_selector("#no-webhooks")
    assert session.errors == [], session.errors
    page.context.close()
