"""Usage by workspace on a real PostgreSQL: a task's slot time counts for the workspace its
``TaskRequested`` named, an experiment's for its project's workspace, in the tracker's report
(``services/tracker/usage.py``), after a rebuild, over ``GET /api/v1/usage`` and in
``cairn usage --by workspace``."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from events.domain.config import parse_config
from events.domain.names import (
    allocation_id,
    experiment_stream,
    task_allocation_id,
    task_stream,
    trial_stream,
)
from events.domain.types import (
    AgentRegistered,
    ExperimentSubmitted,
    SlotsAllocated,
    TaskAllocated,
    TaskExited,
    TaskRequested,
    TrialExited,
    TrialRequested,
)
from events.domain.types.agent import Slot
from events.log.consumer import ConsumerRunner
from events.log.envelope import Event
from events.log.store import EventStore
from services.api.routes_usage import project_workspaces
from services.api.teams import current_teams
from services.tracker import projections, schema, usage
from tests.helpers import cli_env
from tests.integration.test_api_model_workspaces import run_cli, workspace
from tests.integration.test_api_support import CONFIG, Api, running_api
from tests.integration.test_api_teams import created
from tests.integration.test_legacy_trial_ids import fixture, insert

BASE = datetime(2026, 4, 1, 12, 0, tzinfo=UTC)
AGENT = "usage-ws-agent"
TASK_B = "0000000b0000000b"
"""A command in workspace B: 1 slot for 5 s."""
OLD_TASK = "0000000100000001"
"""A task whose ``TaskRequested`` is version 2 (before workspaces): 1 slot for 1 s."""
EXPERIMENT_MS, TASK_B_MS, OLD_TASK_MS = 2 * 10_000, 5_000, 1_000
WINDOW = "from=2026-04-01&to=2026-04-01"


async def write_history(store: EventStore, project_id: int, workspace_b: int) -> None:
    """Appends an experiment in ``project_id`` (2 slots for 10 s), a command in ``workspace_b``
    and an old-payload task, each fact recorded at its chosen instant."""
    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    alloc = allocation_id(1, 1)
    b_alloc, old_alloc = task_allocation_id(TASK_B), task_allocation_id(OLD_TASK)
    slots = [Slot(slot_id=str(i)) for i in range(4)]
    timed: list[tuple[int, str, Event]] = [
        (0, f"agent-{AGENT}", AgentRegistered(agent_id=AGENT, slots=slots)),
        (
            0,
            experiment_stream(1),
            ExperimentSubmitted(
                experiment_id=1, config=config, owner="admin", project_id=project_id
            ),
        ),
        (
            0,
            experiment_stream(1),
            TrialRequested(
                experiment_id=1, trial_id=1, seq=1, request_id="r1", hparams={}, trial_seed=1
            ),
        ),
        (
            1_000,
            trial_stream(1),
            SlotsAllocated(trial_id=1, allocation_id=alloc, placements={AGENT: ["0", "1"]}),
        ),
        (
            2_000,
            task_stream(TASK_B),
            TaskRequested(
                task_id=TASK_B, kind="command", owner="admin", argv=["x"], workspace_id=workspace_b
            ),
        ),
        (
            2_000,
            task_stream(TASK_B),
            TaskAllocated(task_id=TASK_B, allocation_id=b_alloc, placements={AGENT: ["2"]}),
        ),
        (
            7_000,
            task_stream(TASK_B),
            TaskExited(task_id=TASK_B, allocation_id=b_alloc, outcome="completed"),
        ),
        (
            11_000,
            trial_stream(1),
            TrialExited(trial_id=1, run_id=1, allocation_id=alloc, outcome="completed"),
        ),
    ]
    await insert(
        store,
        task_stream(OLD_TASK),
        fixture("TaskRequested", 2, task_id=OLD_TASK, owner="admin", kind="command"),
    )
    old_position = await store.fetchval(
        "SELECT max(position) FROM events WHERE stream_id = $1", task_stream(OLD_TASK)
    )
    async with store.transaction() as tx:
        positions = [(await tx.append(s, [e]))[0].position for _, s, e in timed]
        old = [
            (await tx.append(task_stream(OLD_TASK), [e]))[0].position
            for e in (
                TaskAllocated(task_id=OLD_TASK, allocation_id=old_alloc, placements={AGENT: ["3"]}),
                TaskExited(task_id=OLD_TASK, allocation_id=old_alloc, outcome="completed"),
            )
        ]
        at_ms = [at for at, _, _ in timed] + [3_000, 3_000, 4_000]
        await tx.conn.execute(
            """UPDATE events e SET recorded_at = u.at
               FROM unnest($1::bigint[], $2::timestamptz[]) AS u(position, at)
               WHERE e.position = u.position""",
            [*positions, old_position, *old],
            [BASE + timedelta(milliseconds=ms) for ms in at_ms],
        )


async def by_workspace(store: EventStore) -> list[tuple[int, int]]:
    """The tracker's report by workspace over the day, as (workspace, slot-ms) rows."""
    places = project_workspaces(await current_teams(store))
    start, end = (
        usage.epoch_ms(BASE - timedelta(hours=1)),
        usage.epoch_ms(BASE + timedelta(hours=1)),
    )
    async with store.connection() as conn:
        rows = await usage.usage_report(conn, start, end, "workspace", workspaces=places)
    return [(r["workspace"], r["slot_ms"]) for r in rows]


async def test_a_task_bills_to_its_workspace_and_an_experiment_to_its_projects_and_rebuild_equal(
    store: EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command in B and an experiment in A's project give rows for A and B by workspace (an
    old-payload task the default workspace's), a rebuild gives the same rows, the API names them
    (JSON and CSV), by project tasks stay in Uncategorized, and ``cairn usage`` shows them."""
    await schema.migrate(store)
    async with running_api(store, tmp_path) as api:
        a, b = await workspace(api, "a"), await workspace(api, "b")
        project = await created(
            api, "POST", "/api/v1/workspaces/a/projects", api.admin, {"name": "p"}
        )
        await write_history(store, int(project["id"]), b)
        await ConsumerRunner(store, None, projections.ProjectionsConsumer()).catch_up()
        await ConsumerRunner(store, None, usage.UsageConsumer()).catch_up()

        expected = [(1, OLD_TASK_MS), (a, EXPERIMENT_MS), (b, TASK_B_MS)]
        assert await by_workspace(store) == expected
        tables = "SELECT * FROM tr_usage_tasks ORDER BY task_id"
        before = [dict(r) for r in await store.fetch(tables)]
        assert [(r["task_id"], r["workspace_id"]) for r in before] == [(OLD_TASK, 1), (TASK_B, b)]
        await usage.rebuild(store)
        assert [dict(r) for r in await store.fetch(tables)] == before
        assert await by_workspace(store) == expected

        await rows_over_the_api(api, a, b, int(project["id"]))
        cli_env(monkeypatch, tmp_path / "home", api.url)
        code, out = await asyncio.to_thread(
            run_cli, "usage", "--by", "workspace", "--from", "2026-04-01", "--to", "2026-04-01"
        )
        assert code == 0, out
        shown = [line.split()[::2] for line in out.splitlines()[1:-1]]
        assert shown == [["Uncategorized", "1.000"], ["a", "20.000"], ["b", "5.000"]], out


async def rows_over_the_api(api: Api, a: int, b: int, project_id: int) -> None:
    """``GET /api/v1/usage`` by workspace (JSON, CSV) and by project, as the admin."""
    got = await api.ok("GET", f"/api/v1/usage?{WINDOW}&by=workspace", api.admin)
    assert [(r["workspace"], r["name"], r["slot_ms"]) for r in got["rows"]] == [
        (1, "Uncategorized", OLD_TASK_MS),
        (a, "a", EXPERIMENT_MS),
        (b, "b", TASK_B_MS),
    ]
    assert got["total_slot_ms"] == OLD_TASK_MS + EXPERIMENT_MS + TASK_B_MS
    path = f"/api/v1/usage?{WINDOW}&by=workspace&format=csv"
    status, body = await api.call("GET", path, api.admin)
    assert status == 200, body
    table = list(csv.reader(io.StringIO(body.decode())))
    assert table[0] == ["workspace", "slot_type", "slot_seconds", "slot_ms"]
    assert [(row[0], row[3]) for row in table[1:]] == [
        ("1", str(OLD_TASK_MS)),
        (str(a), str(EXPERIMENT_MS)),
        (str(b), str(TASK_B_MS)),
    ]
    per_project = await api.ok("GET", f"/api/v1/usage?{WINDOW}&by=project", api.admin)
    assert [(r["project"], r["name"], r["slot_ms"]) for r in per_project["rows"]] == [
        (1, "Uncategorized", OLD_TASK_MS + TASK_B_MS),
        (project_id, "p", EXPERIMENT_MS),
    ]
