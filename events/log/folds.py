"""Pure reducers from events to state, and loading state with snapshots as a cache.

A fold never reads a clock, an RNG or the outside world: its state depends only on the events
it was given, so replaying the log always rebuilds the same state. Snapshots are keyed by
(stream, fold name) and carry the fold's version; a snapshot of another version is ignored and
the stream is refolded from the start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel

from events.log.envelope import RecordedEvent
from events.log.store import EventStore

S = TypeVar("S", bound=BaseModel)


class Fold(Protocol[S]):
    """A named, versioned pure reducer."""

    name: str
    version: int
    state_type: type[S]

    def initial(self) -> S:
        """The state before any event."""
        ...

    def apply(self, state: S, event: RecordedEvent) -> S:
        """The state after ``event``; must not mutate ``state``."""
        ...


def fold(reducer: Fold[S], events: Iterable[RecordedEvent], state: S | None = None) -> S:
    """Applies ``events`` in order to ``state`` (or the fold's initial state)."""
    current = reducer.initial() if state is None else state
    for event in events:
        current = reducer.apply(current, event)
    return current


class Loaded(BaseModel, Generic[S]):
    """A folded state and the stream version it reflects."""

    state: S
    version: int


async def load(
    store: EventStore, reducer: Fold[S], stream_id: str, *, use_snapshot: bool = True
) -> Loaded[S]:
    """Folds ``stream_id``, starting from its snapshot when one of the fold's version exists."""
    state, version = reducer.initial(), 0
    if use_snapshot:
        row = await store.pool.fetchrow(
            "SELECT fold_version, stream_version, state FROM snapshots "
            "WHERE stream_id = $1 AND fold = $2",
            stream_id,
            reducer.name,
        )
        if row is not None and row["fold_version"] == reducer.version:
            state = reducer.state_type.model_validate(row["state"])
            version = int(row["stream_version"])
    events = await store.read_stream(stream_id, after_version=version)
    state = fold(reducer, events, state)
    if events:
        version = events[-1].stream_version
    return Loaded[S](state=state, version=version)


async def save_snapshot(
    store: EventStore, reducer: Fold[S], stream_id: str, loaded: Loaded[S]
) -> None:
    """Caches ``loaded`` as the snapshot of ``stream_id`` for this fold."""
    await store.pool.execute(
        """INSERT INTO snapshots (stream_id, fold, fold_version, stream_version, state)
           VALUES ($1, $2, $3, $4, $5)
           ON CONFLICT (stream_id, fold) DO UPDATE SET fold_version = excluded.fold_version,
               stream_version = excluded.stream_version, state = excluded.state""",
        stream_id,
        reducer.name,
        reducer.version,
        loaded.version,
        loaded.state.model_dump(mode="json"),
    )
