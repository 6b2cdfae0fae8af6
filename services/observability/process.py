"""One process's metric registry: its appends, and the lag of the consumers it runs.

Each process (and each gateway app a test starts) has a registry of its own rather than
prometheus-client's global one, so two in one interpreter never mix their series. The append
histograms are fed by :mod:`events.log.append_timing`; consumer lag is read from the database at
scrape time (:meth:`ProcessMetrics.refresh_lag`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from events.log import append_timing
from events.log.store import EventStore

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The media type of the text exposition format."""

APPEND_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
APPEND_EVENTS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)


class LagGauges:
    """The log's head, and each consumer's checkpoint and lag (head minus checkpoint)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.head = Gauge(
            "cairn_log_head_position", "Highest committed position of the log", registry=registry
        )
        self.checkpoint = Gauge(
            "cairn_consumer_checkpoint_position",
            "Position up to which a consumer has applied the log",
            ["consumer"],
            registry=registry,
        )
        self.lag = Gauge(
            "cairn_consumer_lag_events",
            "Events committed to the log that a consumer has not applied (head - checkpoint)",
            ["consumer"],
            registry=registry,
        )

    def update(self, head: int, checkpoints: Mapping[str, int], only: Iterable[str] | None) -> None:
        """Sets the gauges from one read (``only``: these consumers, 0 for one with no row yet;
        ``None``: every consumer with a checkpoint row)."""
        names = sorted(checkpoints) if only is None else sorted(set(only))
        self.head.set(head)
        self.checkpoint.clear()
        self.lag.clear()
        for name in names:
            position = checkpoints.get(name, 0)
            self.checkpoint.labels(consumer=name).set(position)
            self.lag.labels(consumer=name).set(max(head - position, 0))


class ProcessMetrics:
    """The registry of one process: append latency and batch size, and consumer lag.

    Attributes:
        registry: the process's own registry (what ``/metrics`` exposes).
        consumers: the checkpoint names this process runs (their lag is exported and, for a
            leader, bounds its readiness).
    """

    def __init__(self, consumers: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self.consumers = tuple(consumers)
        self.append_seconds = Histogram(
            "cairn_append_seconds",
            "Seconds one append statement took (lock, checks, insert; its own commit outside a "
            "transaction)",
            buckets=APPEND_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.append_events = Histogram(
            "cairn_append_batch_events",
            "Events written by one append",
            buckets=APPEND_EVENTS_BUCKETS,
            registry=self.registry,
        )
        self.ready = Gauge(
            "cairn_ready", "1 while the process's readiness checks pass", registry=self.registry
        )
        self.lag = LagGauges(self.registry) if self.consumers else None
        self._unwatch = append_timing.watch(self._appended)

    def _appended(self, seconds: float, events: int) -> None:
        self.append_seconds.observe(seconds)
        self.append_events.observe(events)

    async def refresh_lag(self, store: EventStore) -> tuple[int, dict[str, int]]:
        """Reads the head and the checkpoints, sets this process's lag gauges; returns the read.

        Raises:
            EventsError: the database could not be read.
        """
        head, checkpoints = await store.consumer_positions()
        if self.lag is not None:
            self.lag.update(head, checkpoints, self.consumers)
        return head, checkpoints

    def exposition(self) -> bytes:
        """The registry in Prometheus's text format."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Stops observing appends."""
        self._unwatch()
