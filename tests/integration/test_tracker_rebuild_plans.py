"""A tracker rebuild plans its statements for their parameters: no generic plan cached while
the truncated tables were empty is reused as they fill (which made a rebuild quadratic)."""

from __future__ import annotations

from collections.abc import Sequence

from events.domain.types import TrialStateChanged
from events.log.consumer import PageConsumer
from events.log.envelope import RecordedEvent
from events.log.store import EventStore, Transaction
from services.tracker.rebuild import rebuild_consumer


class _Probe(PageConsumer):
    """Records the plan cache mode each page is applied under."""

    name = "rebuild-probe"

    def __init__(self) -> None:
        self.modes: list[str] = []

    async def handle_page(self, tx: Transaction, events: Sequence[RecordedEvent]) -> None:
        self.modes.append(str(await tx.conn.fetchval("SHOW plan_cache_mode")))


async def test_rebuild_pages_are_planned_per_execution_and_the_session_is_left_as_it_was(
    store: EventStore,
) -> None:
    """Every page of a rebuild runs under ``force_custom_plan``; after it the connection's
    setting is back to its default (the setting is local to the rebuild's transaction)."""
    await store.execute("CREATE TABLE rebuild_probe (x int)")
    for trial_id in range(1, 8):
        await store.append(
            f"trial-{trial_id}", [TrialStateChanged(trial_id=trial_id, state="COMPLETED")]
        )
    probe = _Probe()
    applied = await rebuild_consumer(store, probe, ["rebuild_probe"], batch=3)
    assert applied == 7
    assert probe.modes and set(probe.modes) == {"force_custom_plan"}
    async with store.connection() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
