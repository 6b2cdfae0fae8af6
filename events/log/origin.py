"""Where an append comes from: the actor and the request, stamped on every event's metadata.

The API gateway binds an :class:`Origin` (request id, remote address, and once authenticated
the actor) for the life of each request; a service process names itself once with
:func:`set_service`. :meth:`events.log.store.Transaction.append` fills the metadata fields a call
site left empty from these, so no call site has to pass them and none can forget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from events.log.envelope import Metadata


@dataclass
class Origin:
    """The request an append is made for.

    Attributes:
        request_id: the request's id (the gateway's ``X-Request-ID``).
        remote: the caller's address as the gateway saw it.
        actor: who is calling (``alice``, ``trial:17``, ``agent``), once authenticated.
        appended: how many events were appended under this origin so far.
    """

    request_id: str | None = None
    remote: str | None = None
    actor: str | None = None
    appended: int = 0


_current: ContextVar[Origin | None] = ContextVar("cairn_origin", default=None)
_service: str | None = None


def current() -> Origin | None:
    """The origin bound to the running task, if any."""
    return _current.get()


@contextlib.contextmanager
def bound(origin: Origin) -> Iterator[Origin]:
    """Binds ``origin`` to the running task (and the tasks it starts) for the ``with`` block."""
    token = _current.set(origin)
    try:
        yield origin
    finally:
        _current.reset(token)


def set_service(name: str | None) -> None:
    """Names this process's service; its appends outside a request carry ``service:<name>``."""
    global _service
    _service = name


def service_actor() -> str | None:
    """The actor of appends made by this process outside any request, or ``None``."""
    return f"service:{_service}" if _service else None


def stamp(metadata: Metadata) -> Metadata:
    """``metadata`` with its empty actor, request id and remote address filled in.

    Fields a call site set are kept; a request's actor wins over the process's service name.
    """
    origin = _current.get()
    update: dict[str, str] = {}
    actor = (origin.actor if origin is not None else None) or service_actor()
    if metadata.actor is None and actor is not None:
        update["actor"] = actor
    if origin is not None:
        if metadata.request_id is None and origin.request_id is not None:
            update["request_id"] = origin.request_id
        if metadata.remote is None and origin.remote is not None:
            update["remote"] = origin.remote
    return metadata.model_copy(update=update) if update else metadata


def count_appended(n: int) -> None:
    """Records that ``n`` events were appended under the current origin."""
    origin = _current.get()
    if origin is not None:
        origin.appended += n
