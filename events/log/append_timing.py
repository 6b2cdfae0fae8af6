"""Who hears how long each append took: observers of the store's appends, for metrics.

:meth:`events.log.store.Transaction.append` reports every successful append here (the seconds
its statement took and how many events it wrote); a process that exports metrics registers an
observer with :func:`watch`. Nothing here imports a metrics library: the log stays free of the
services' exposition, and a process without observers pays one empty loop per append.

An observer runs on the appending task, so it must be quick and must not raise; one that raises
is logged and the append still succeeds.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

Observer = Callable[[float, int], None]
"""``observer(seconds, events)``: one append's statement time and its number of events."""

_observers: list[Observer] = []
log = structlog.get_logger("append_timing")


def watch(observer: Observer) -> Callable[[], None]:
    """Calls ``observer`` after every append of this process; returns what stops it.

    Example::

        stop = append_timing.watch(lambda seconds, events: print(seconds, events))
        ...
        stop()
    """
    _observers.append(observer)

    def unwatch() -> None:
        if observer in _observers:
            _observers.remove(observer)

    return unwatch


def appended(seconds: float, events: int) -> None:
    """Tells every observer that an append of ``events`` events took ``seconds``."""
    for observer in tuple(_observers):
        try:
            observer(seconds, events)
        except Exception as exc:  # an observer must never fail an append that succeeded
            log.warning("append observer failed", error=str(exc))
