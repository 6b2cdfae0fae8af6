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


class DuplicateEventError(EventsError):
    """An append reused an ``event_id`` that the log already holds; the event is not stored twice.

    Retrying the same append can never succeed: the event is already a fact (or its id collides).
    """

    def __init__(self, stream_id: str | None, event_id: str | None) -> None:
        where = f"stream {stream_id}: " if stream_id else ""
        what = f"event id {event_id}" if event_id else "an event id"
        super().__init__(f"{where}{what} is already in the log")
        self.stream_id = stream_id
        self.event_id = event_id


class UnknownEventError(EventsError):
    """A stored event's (type, schema_version) has no registered model or upcaster."""


class StoreUnavailableError(EventsError):
    """PostgreSQL could not be reached or dropped the connection."""


class StatementError(EventsError):
    """The database refused a statement (a constraint, a missing table, a bad query).

    Retrying the same statement does not help, unlike :class:`StoreUnavailableError`.

    Attributes:
        sqlstate: PostgreSQL's five-character error code (``42P01``: no such table).
        constraint: the violated constraint's name, when there is one.
    """

    def __init__(self, message: str, sqlstate: str | None, constraint: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.constraint = constraint

    @property
    def undefined_table(self) -> bool:
        """Whether the statement named a table that does not exist (yet)."""
        return self.sqlstate == "42P01"


class BusUnavailableError(EventsError):
    """NATS could not be reached or refused a request."""


class EventTooLargeError(EventsError):
    """An event's encoded payload and metadata are larger than the store accepts.

    Attributes:
        stream_id: the stream it was to be appended to.
        event_type: its type.
        size: its encoded payload plus metadata, in bytes.
        limit: the most the store accepts, in bytes.
        part: the dotted path of the payload part that makes it large (``""``: the whole).
        part_size: that part's encoded size, in bytes.
    """

    def __init__(
        self, stream_id: str, event_type: str, size: int, limit: int, part: str, part_size: int
    ) -> None:
        where = f"; its largest part is {part} ({part_size} bytes)" if part else ""
        super().__init__(
            f"stream {stream_id}: {event_type} is {size} bytes encoded, over the limit of "
            f"{limit} bytes{where}"
        )
        self.stream_id = stream_id
        self.event_type = event_type
        self.size = size
        self.limit = limit
        self.part = part
        self.part_size = part_size


class MigrationsPendingError(EventsError):
    """The database lacks migrations that this session's role may not apply.

    A service's own role cannot change the schema; the migrations are applied by the cluster's
    superuser (``python -m services.migrate``, which ``cairn up`` runs at every start).

    Attributes:
        namespace: the migrations' namespace (``core``, ``api``, ...).
        missing: the ids of the pending migrations, in order.
    """

    def __init__(self, namespace: str, missing: list[str]) -> None:
        names = ", ".join(f"{namespace}/{m}" for m in missing)
        super().__init__(
            f"the database lacks migrations {names}, and this role may not apply them: run "
            "`python -m services.migrate --db-file FILE` with the superuser's DSN in FILE "
            "(`cairn up` does so at every start)"
        )
        self.namespace = namespace
        self.missing = missing
