"""The scheduler's view of the cluster: the shared fold of every aggregate, plus stream versions.

The experiments, trials and agents are folded by :class:`events.domain.aggregates.Cluster`,
the same folds the API answers from; the scheduler adds only what it decides with: the version
of every stream it appends to (:data:`STREAMS`). It receives every event of those streams, the
ones it does not fold as bare envelopes, and a decision is appended with the version its plan
saw, so a plan made stale by another writer loses instead of landing twice.

Pure: the state depends only on the events applied, in order. Decisions the scheduler made
earlier come back as events and are folded like any other fact, so a restarted scheduler that
replays the log reaches the same state and does not decide anything twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events.domain.aggregates import CLUSTER_TYPES, Cluster
from events.log.envelope import Event, RecordedEvent

STREAMS = frozenset({"trial", "experiment", "agent", "task"})
"""The stream types the scheduler appends its decisions to."""

TYPES = CLUSTER_TYPES
"""The event types the scheduler folds (:meth:`Cluster.apply`)."""


@dataclass
class ClusterState(Cluster):
    """The cluster as of ``position``, and the version of each stream seen."""

    versions: dict[str, int] = field(default_factory=dict)

    def apply(self, recorded: RecordedEvent, event: Event | None = None) -> None:
        """Folds one event (or the bare envelope of one on a stream in :data:`STREAMS`).

        An event at or before ``position`` was folded already and is skipped: after a page lost
        an append race, its events are read again (they stay facts; only the decisions were
        rolled back), and the state need not be folded anew.
        """
        if recorded.position <= self.position:
            return
        self.versions[recorded.stream_id] = recorded.stream_version
        super().apply(recorded, event)

    def version(self, stream_id: str) -> int:
        """The version of ``stream_id`` as of ``position`` (0: no event on it yet)."""
        return self.versions.get(stream_id, 0)
