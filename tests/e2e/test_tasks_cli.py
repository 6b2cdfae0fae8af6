"""Tasks seen everywhere from the CLI on an embedded cluster (``cairn up --slots 1``):
``cairn task list``/``logs -f``, ``cairn job list``, ``cairn usage`` and ``cairn audit``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_cli import Env, embedded_cluster, ok
from tests.helpers import wait_until_sync


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster with one CPU slot for the module."""
    with embedded_cluster("cairn-tasks-") as env:
        yield env


def as_json(env: Env, *args: str) -> Any:
    return json.loads(ok(env, "--json", *args).stdout)


def test_a_command_is_seen_in_task_list_job_list_logs_usage_and_audit(cluster: Env) -> None:
    """A running command holds the queue's first place with a queued one behind it; `task
    list` shows both with type and pool; killing the queued one is in the audit trail; `task
    logs -f` prints the first's output until it ends; the slot-seconds it held are billed."""
    script = "import time; print('shard 1', flush=True); time.sleep(10); print('shard 2')"
    first = ok(cluster, "cmd", "run", "-d", "python", "-c", script).stdout.strip()
    second = ok(cluster, "cmd", "run", "-d", "python", "-c", "print('never')").stdout.strip()

    def jobs() -> list[dict[str, Any]]:
        return list(as_json(cluster, "job", "list")["jobs"])

    queue = wait_until_sync(lambda: (q := jobs()) and q[0]["state"] == "RUNNING" and q, 30)
    assert [(j["job_id"], j["kind"], j["slots"]) for j in queue] == [
        (first, "command", 1),
        (second, "command", 1),
    ]
    assert queue[1]["state"] == "QUEUED" and queue[0]["owner"] == "admin"
    table = ok(cluster, "job", "list").stdout
    assert first in table and "RUNNING" in table

    listed = ok(cluster, "task", "list").stdout
    header = listed.splitlines()[0].lower()
    for column in ("id", "type", "description", "state", "owner", "resource pool", "submitted"):
        assert column in header, header
    assert first in listed and second in listed and "default" in listed
    assert {t["id"] for t in as_json(cluster, "task", "list")["tasks"]} >= {first, second}

    ok(cluster, "cmd", "kill", second)  # still queued behind the first: canceled
    followed = ok(cluster, "task", "logs", "-f", first, timeout=60).stdout
    assert followed.splitlines() == ["shard 1", "shard 2"]
    wait_until_sync(lambda: jobs() == [], 30)

    def audited() -> list[dict[str, Any]]:
        entries = as_json(cluster, "audit", "--type", "TaskKillRequested")["entries"]
        return [e for e in entries if e["stream_id"] == f"task-{second}"]

    (kill,) = wait_until_sync(audited, 30)
    assert kill["actor"] == "admin"
    submitted = as_json(cluster, "audit", "--type", "TaskRequested")["entries"]
    assert f"task-{first}" in {e["stream_id"] for e in submitted}

    def billed() -> float:
        rows = as_json(cluster, "usage", "--by", "experiment")["rows"]
        return sum(r["slot_seconds"] for r in rows if r["experiment"] is None)

    assert wait_until_sync(lambda: billed() >= 10.0, 30)
