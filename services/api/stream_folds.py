"""A stream folded by the gateway: afresh in a transaction (to decide on), or kept per store and
brought up to date with what was appended since (to read on every request at the cost of one
indexed query).

Used for the small streams every request may consult, ``teams`` and ``webhooks``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from events.log.envelope import RecordedEvent
from events.log.store import EventStore
from services.api.views import Reader, read_facts


class Versioned(Protocol):
    """A folded state that knows the stream version it was read at."""

    version: int


S = TypeVar("S", bound=Versioned)


class StreamFold(Generic[S]):
    """How to fold stream ``stream`` (only ``facts``) into a new ``S`` with ``apply``.

    Args:
        stream: the stream id.
        facts: the event types the fold reads.
        empty: makes the state of an empty stream.
        apply: folds one recorded event into the state.
    """

    def __init__(
        self,
        stream: str,
        facts: Sequence[str],
        empty: Callable[[], S],
        apply: Callable[[S, RecordedEvent], None],
    ) -> None:
        self.stream = stream
        self.facts = tuple(facts)
        self.empty = empty
        self.apply = apply
        self._cache: weakref.WeakKeyDictionary[EventStore, tuple[S, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )

    async def load(self, reader: Reader, *, at: int | None = None) -> S:
        """The stream folded afresh (as it was at log position ``at``, when given); its version
        is the stream's head, the version a decision appends at."""
        events, head = await read_facts(reader, self.stream, self.facts, at=at)
        state = self.empty()
        for recorded in events:
            self.apply(state, recorded)
        state.version = head
        return state

    async def current(self, store: EventStore) -> S:
        """The stream as of now: the store's kept fold plus what was appended since (read only;
        never mutate it)."""
        state, lock = self._cache.setdefault(store, (self.empty(), asyncio.Lock()))
        async with lock:
            events, head = await read_facts(
                store, self.stream, self.facts, after_version=state.version
            )
            for recorded in events:
                self.apply(state, recorded)
            state.version = max(state.version, head)
            return state

    async def for_reader(self, reader: Reader) -> S:
        """:meth:`current` of a store; folded afresh in a transaction (what it will decide on)."""
        if isinstance(reader, EventStore):
            return await self.current(reader)
        return await self.load(reader)


__all__ = ["StreamFold", "Versioned"]
