"""What other services may read of the tracker's tables: typed rows, one query each.

The tracker owns every ``tr_*`` and ``audit_*`` table (``schema.OWNED_TABLES``) and is the only
package whose modules hold SQL naming them; the gateway's query API and web pages read them
through this package only, by the names below (its modules group the queries by what they
answer; the chart series and usage reads delegate to the modules that keep those paths' SQL
together). Each takes a connection outside a transaction and answers as if the tables were
empty while they do not exist yet (a database migrated only by services that started before the
tracker, under a superuser). Rows keep database types (``datetime``, decoded JSON); presenting
them is the reader's business.
"""

from __future__ import annotations

from services.tracker.read import gauges
from services.tracker.read.audit import AuditRow, audit_page
from services.tracker.read.charts import (
    USAGE_CSV_COLUMNS,
    SeriesBuckets,
    UsageBy,
    epoch_ms,
    experiment_series,
    experiment_series_width,
    projections_position,
    series_metric_names,
    series_trial_count,
    series_trial_ids,
    slot_seconds_text,
    trial_series,
    usage_report,
)
from services.tracker.read.checkpoints import (
    CheckpointRow,
    CheckpointState,
    checkpoint,
    list_checkpoints,
)
from services.tracker.read.cluster import (
    AgentRow,
    AllocationSpanRow,
    LiveAllocationRow,
    SlotRow,
    WaitingTrialRow,
    allocation_spans,
    enabled_slots,
    list_agents,
    list_slots,
    live_allocations,
    waiting_trials,
)
from services.tracker.read.experiments import (
    AllocationRow,
    ExperimentRow,
    MetricRow,
    TrialRow,
    allocations_of,
    experiment,
    experiments_of_trials,
    list_experiments,
    list_trials,
    trial,
    trial_metrics,
)
from services.tracker.read.webhooks import (
    DeliveryRecord,
    delivery_records,
    webhook_signing_secret,
)

__all__ = [
    "USAGE_CSV_COLUMNS",
    "AgentRow",
    "AllocationRow",
    "AllocationSpanRow",
    "AuditRow",
    "CheckpointRow",
    "CheckpointState",
    "DeliveryRecord",
    "ExperimentRow",
    "LiveAllocationRow",
    "MetricRow",
    "SeriesBuckets",
    "SlotRow",
    "TrialRow",
    "UsageBy",
    "WaitingTrialRow",
    "allocation_spans",
    "allocations_of",
    "audit_page",
    "checkpoint",
    "delivery_records",
    "enabled_slots",
    "epoch_ms",
    "experiment",
    "experiment_series",
    "experiment_series_width",
    "experiments_of_trials",
    "gauges",
    "list_agents",
    "list_checkpoints",
    "list_experiments",
    "list_slots",
    "list_trials",
    "live_allocations",
    "projections_position",
    "series_metric_names",
    "series_trial_count",
    "series_trial_ids",
    "slot_seconds_text",
    "trial",
    "trial_metrics",
    "trial_series",
    "usage_report",
    "waiting_trials",
    "webhook_signing_secret",
]
