"""The scheduler's view of the cluster: the shared fold of every aggregate.

The experiments, trials and agents are folded by :class:`events.domain.aggregates.Cluster`,
the same folds the API answers from, which also keeps the version of every stream. The
scheduler receives every event of the streams it appends its decisions to (:data:`STREAMS`),
the ones it does not fold as bare envelopes, so it knows each one's version; a decision is
appended with the version its plan saw, and a plan made stale by another writer loses instead
of landing twice.

Pure: the state depends only on the events applied, in order. Decisions the scheduler made
earlier come back as events and are folded like any other fact, so a restarted scheduler that
replays the log reaches the same state and does not decide anything twice.
"""

from __future__ import annotations

from events.domain.aggregates import CLUSTER_TYPES, Cluster

STREAMS = frozenset({"trial", "experiment", "agent", "task"})
"""The stream types the scheduler appends its decisions to."""

TYPES = CLUSTER_TYPES
"""The event types the scheduler folds (:meth:`Cluster.apply`)."""

ClusterState = Cluster
"""What the scheduler plans on: the cluster as of ``position``, with every stream's version."""
