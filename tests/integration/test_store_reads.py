"""The store's reads (events.log.reads) against a real PostgreSQL: each returns the events it
names, upcast at the boundary (an old-version fixture row comes back as the current type), in
or out of a transaction, and under a service's own role."""

from __future__ import annotations

import contextlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from events.domain.types import TrialExited, TrialRequested
from events.log.reads import _LIFECYCLE_PREDICATE, LIFECYCLE_TYPES
from events.log.registry import model_for
from events.log.store import EventStore
from services import migrate, roles

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"
LEGACY = -7_000_001
"""Trial "7.1" of the old fixtures, as the upcasters number it."""


def fixture(event_type: str, version: int = 1, **changes: Any) -> tuple[str, int, dict[str, Any]]:
    """An old schema version's fixture payload, with ``changes``."""
    payload = json.loads((FIXTURES / f"{event_type}.v{version}.json").read_text())
    return event_type, version, {**payload, **changes}


async def insert(store: EventStore, stream_id: str, *rows: tuple[str, int, dict[str, Any]]) -> None:
    """Stores rows as an old cairn wrote them (old schema version and payload), as the superuser."""
    async with store.transaction() as tx:
        version = await tx.stream_version(stream_id)
        for event_type, schema_version, payload in rows:
            version += 1
            await tx.conn.execute(
                """INSERT INTO events (stream_id, stream_version, event_id, type, schema_version,
                                       payload)
                   VALUES ($1, $2, $3, $4, $5, $6)""",
                stream_id,
                version,
                uuid.uuid4(),
                event_type,
                schema_version,
                payload,
            )


async def legacy_log(store: EventStore) -> None:
    """Experiment 7 with legacy trial "7.1" (allocated, started from a checkpoint, validated,
    exited), an experiment warm-starting from that checkpoint, and two templates; old payloads."""
    await insert(
        store,
        "experiment-7",
        fixture("ExperimentSubmitted"),
        fixture("TrialRequested"),
        fixture("TrialRequested", trial_id="7.2", request_id="r0002"),
    )
    await insert(
        store,
        "trial-7.1",
        fixture("SlotsAllocated"),
        fixture("TrialStarted", restored_checkpoint="0b7e-0"),
        fixture("ValidationReported"),
        fixture("CheckpointSaved"),
        fixture("TrialExited"),
    )
    warm = {"name": "warm", "searcher": {"metric": "loss", "source_checkpoint_uuid": "0b7e-1"}}
    await insert(
        store, "experiment-8", fixture("ExperimentSubmitted", experiment_id=8, config=warm)
    )
    await insert(store, "template-a", fixture("TemplateSet", name="a"))
    await insert(
        store,
        "template-b",
        fixture("TemplateSet", name="b"),
        fixture("TemplateSet", name="b", config={"max_restarts": 3}),
    )


def is_current(event: Any) -> bool:
    """Whether a read event carries its type's current schema version."""
    return bool(event.schema_version == model_for(event.type).schema_version)


async def test_read_types_upcasts_old_rows_within_bounds(store: EventStore) -> None:
    """read_types returns only the types asked, within (after, upto], upcast to current."""
    await legacy_log(store)
    head = await store.head()
    exits = await store.read_types(["TrialExited"], after=0)
    assert [e.type for e in exits] == ["TrialExited"]
    decoded = exits[0].decode()
    assert isinstance(decoded, TrialExited) and decoded.trial_id == LEGACY
    assert is_current(exits[0])
    assert await store.read_types(["TrialExited"], after=exits[0].position) == []
    requests = await store.read_types(["TrialRequested", "TrialExited"], upto=head - 1)
    assert [e.type for e in requests] == ["TrialRequested", "TrialRequested", "TrialExited"]


async def test_read_streams_reads_the_named_streams_and_types_in_position_order(
    store: EventStore,
) -> None:
    """read_streams reads only the given streams' events of the given types, upcast."""
    await legacy_log(store)
    events = await store.read_streams(
        ["trial-7.1", "experiment-7"], ["ValidationReported", "TrialRequested"]
    )
    assert [e.type for e in events] == ["TrialRequested", "TrialRequested", "ValidationReported"]
    assert [e.position for e in events] == sorted(e.position for e in events)
    assert all(is_current(e) for e in events)
    assert events[-1].payload["trial_id"] == LEGACY


async def test_lifecycle_reads_upcast_and_take_the_newest_first(store: EventStore) -> None:
    """read_lifecycle reads the lifecycle facts of streams; latest_lifecycle the newest few of
    some of them, newest first; a type outside the index is refused."""
    await legacy_log(store)
    facts = await store.read_lifecycle(["trial-7.1", "experiment-7"])
    assert [e.type for e in facts] == ["ExperimentSubmitted", "SlotsAllocated", "TrialExited"]
    assert all(is_current(e) for e in facts)
    latest = await store.latest_lifecycle("trial-7.1", ["SlotsAllocated", "TrialExited"], limit=1)
    assert [(e.type, e.payload["trial_id"]) for e in latest] == [("TrialExited", LEGACY)]
    with pytest.raises(ValueError, match="TrialStarted"):
        await store.latest_lifecycle("trial-7.1", ["TrialStarted"], limit=1)


def test_the_lifecycle_predicate_lists_the_lifecycle_types() -> None:
    """The literal type list the partial index needs is the list the store declares."""
    for name in LIFECYCLE_TYPES:
        assert f"'{name}'" in _LIFECYCLE_PREDICATE
    assert _LIFECYCLE_PREDICATE.count("'") == 2 * len(LIFECYCLE_TYPES)


async def test_read_stream_facts_filters_requests_by_label_and_position(
    store: EventStore,
) -> None:
    """read_stream_facts gives a stream's head and events, one trial's requests only, as of a
    position when asked."""
    await legacy_log(store)
    types = ["ExperimentSubmitted", "TrialRequested"]
    events, head = await store.read_stream_facts("experiment-7", types, requested_trial="7.1")
    assert head == 3
    assert [e.type for e in events] == ["ExperimentSubmitted", "TrialRequested"]
    request = events[1].decode()
    assert isinstance(request, TrialRequested) and request.trial_id == LEGACY
    first = events[0].position
    assert await store.read_stream_facts("experiment-7", types, at=first) == ([events[0]], 1)
    assert await store.read_stream_facts("experiment-404", types) == ([], 0)


async def test_trial_request_finds_a_legacy_label(store: EventStore) -> None:
    """trial_request finds a request by the label the log stored and returns it upcast."""
    await legacy_log(store)
    found = await store.trial_request("7.1")
    assert found is not None and is_current(found)
    assert found.payload["trial_id"] == LEGACY and found.payload["experiment_id"] == 7
    assert await store.trial_request("8.1") is None


async def test_submission_with_code_matches_owner_and_code(store: EventStore) -> None:
    """submission_with_code finds the owner's submission of a code ref, upcast; not another's."""
    await legacy_log(store)
    found = await store.submission_with_code("sha256:ab12", owner="alice")
    assert found is not None and is_current(found) and found.payload["experiment_id"] == 7
    assert await store.submission_with_code("sha256:ab12", owner="bob") is None
    assert await store.submission_with_code("sha256:cd34", owner="alice") is None


async def test_checkpoint_uses_finds_restores_and_warm_starts(store: EventStore) -> None:
    """checkpoint_uses returns the starts restoring a checkpoint and the submissions naming it
    as their source, upcast."""
    await legacy_log(store)
    uses = await store.checkpoint_uses(["0b7e-0", "0b7e-1"])
    assert [e.type for e in uses] == ["TrialStarted", "ExperimentSubmitted"]
    assert uses[0].payload["trial_id"] == LEGACY and is_current(uses[0])
    assert uses[1].payload["experiment_id"] == 8
    assert await store.checkpoint_uses(["nothing"]) == []


async def test_latest_per_stream_takes_each_templates_newest_fact(store: EventStore) -> None:
    """latest_per_stream gives the newest event of each stream with the prefix."""
    await legacy_log(store)
    latest = await store.latest_per_stream("template-", ["TemplateSet", "TemplateRemoved"])
    assert [(e.stream_id, e.stream_version) for e in latest] == [
        ("template-a", 1),
        ("template-b", 2),
    ]
    assert latest[1].payload["config"] == {"max_restarts": 3}
    assert await store.latest_per_stream("templ_te-", ["TemplateSet"]) == []


async def test_position_at_and_head(store: EventStore) -> None:
    """position_at gives the last position recorded by a moment; head the last of all."""
    assert await store.head() == 0
    assert await store.position_at(datetime.now(UTC)) == 0
    await legacy_log(store)
    head = await store.head()
    assert await store.position_at(datetime.now(UTC) + timedelta(seconds=5)) == head
    assert await store.position_at(datetime(2000, 1, 1, tzinfo=UTC)) == 0


async def test_position_at_equals_the_scan_over_gaps_and_out_of_order_times(
    store: EventStore,
) -> None:
    """position_at's bisection answers as a full scan does at every moment of a log with gaps in
    its positions and a transaction's times out of position order (within the slack)."""
    start = datetime(2026, 3, 1, tzinfo=UTC)
    async with store.transaction() as tx:
        for n in range(1, 61):
            position = n * 3 if n % 10 else n * 3 + 1  # gaps, as rolled-back appends leave
            # Times grow with positions, except every seventh event, which was recorded 20 s
            # earlier: a transaction that began before its neighbours and inserted after them.
            recorded = start + timedelta(seconds=10 * n - (20 if n % 7 == 0 else 0))
            await tx.conn.execute(
                """INSERT INTO events (position, stream_id, stream_version, event_id, type,
                                       schema_version, payload, recorded_at)
                   OVERRIDING SYSTEM VALUE
                   VALUES ($1, $2, 1, $3, 'TemplateSet', 1, $4, $5)""",
                position,
                f"template-t{n}",
                uuid.uuid4(),
                {"name": f"t{n}", "config": {}},
                recorded,
            )
    moments = [start + timedelta(seconds=s) for s in range(-5, 620, 5)]
    for moment in moments:
        scanned = await store.fetchval(
            "SELECT coalesce(max(position), 0) FROM events WHERE recorded_at <= $1", moment
        )
        assert await store.position_at(moment) == scanned, moment


async def test_cursor_in_a_read_transaction_filters_and_may_stop_early(store: EventStore) -> None:
    """A read transaction's cursor reads filtered events upcast, and a reader may stop early."""
    await legacy_log(store)
    async with store.read_transaction() as tx:
        page = tx.cursor(0, types=None, streams=["trial-7.1"], limit=100, prefetch=2)
        async with contextlib.aclosing(page):
            seen = [e async for e in page]
        assert [e.stream_id for e in seen] == ["trial-7.1"] * 5
        assert all(is_current(e) for e in seen)
        named = tx.cursor(
            0, named_streams=["experiment-8"], named_categories=["template"], limit=100
        )
        async with contextlib.aclosing(named):
            async for event in named:
                assert event.stream_id.startswith(("experiment-8", "template-"))
                break
        # The same reads run in the transaction as on the store.
        assert await tx.head() == await store.head()
        assert await tx.trial_request("7.1") == await store.trial_request("7.1")


async def test_every_read_runs_under_each_services_role(
    store: EventStore, db_url: str, tmp_path: Path
) -> None:
    """Each service's own role may run every store read (it holds SELECT on events only)."""
    await legacy_log(store)
    logins = tmp_path / "secrets"
    await migrate.run(db_url, logins)
    for role in roles.SERVICE_ROLES:
        dsn = (logins / role.service / migrate.DSN_FILE).read_text().strip()
        as_role = await EventStore.connect(dsn)
        try:
            assert await as_role.head() == await store.head()
            assert await as_role.position_at(datetime.now(UTC)) > 0
            assert await as_role.read_types(["TrialExited"])
            assert await as_role.read_streams(["trial-7.1"], ["TrialExited"])
            assert await as_role.read_lifecycle(["trial-7.1"])
            assert await as_role.latest_lifecycle("trial-7.1", ["TrialExited"], limit=1)
            assert (await as_role.read_stream_facts("experiment-7", ["TrialRequested"]))[1] == 3
            assert await as_role.trial_request("7.1") is not None
            assert await as_role.submission_with_code("sha256:ab12", owner="alice") is not None
            assert await as_role.checkpoint_uses(["0b7e-1"])
            assert await as_role.latest_per_stream("template-", ["TemplateSet"])
            async with as_role.read_transaction() as tx:
                assert [e async for e in tx.cursor(0, limit=2)]
        finally:
            await as_role.close()
