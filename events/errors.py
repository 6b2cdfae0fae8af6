"""Errors of the event backbone. Driver errors (asyncpg, nats) are translated here, nowhere else."""

from __future__ import annotations


class EventsError(Exception):
    """Root of every error raised by the ``events`` package."""


class ConcurrencyError(EventsError):
    """An append's ``expected_version`` did not match the stream's current version."""

    def __init__(self, stream_id: str, expected: int | None, actual: int) -> None:
        super().__init__(f"stream {stream_id}: expected version {expected}, found {actual}")
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual


class FencedError(EventsError):
    """A write carried a leader epoch that is no longer the current one (a zombie leader)."""

    def __init__(self, lease: str, epoch: int, current: int) -> None:
        super().__init__(f"lease {lease}: epoch {epoch} is fenced off by epoch {current}")
        self.lease = lease
        self.epoch = epoch
        self.current = current


class UnknownEventError(EventsError):
    """A stored event's (type, schema_version) has no registered model or upcaster."""


class StoreUnavailableError(EventsError):
    """PostgreSQL could not be reached or dropped the connection."""


class BusUnavailableError(EventsError):
    """NATS could not be reached or refused a request."""
