"""The tracker's projection tables (migrations namespace ``tracker``), as in ``docs/tracking.md``.

Every ``tr_*`` table is derived from the log by consumer ``tracker-projections``; none holds a
fact of its own, so they can be truncated and rebuilt at any time.
"""

from __future__ import annotations

from collections.abc import Sequence

from events.domain.names import sql_trial_id
from events.log import migrations
from events.log.db import Connection
from events.log.store import EventStore
from services.tracker.audit import TABLES as AUDIT_TABLES
from services.tracker.usage import MIGRATION as USAGE_MIGRATION
from services.tracker.usage import TABLES as USAGE_TABLES
from services.tracker.usage import TASK_WORKSPACES_MIGRATION as USAGE_TASK_WORKSPACES_MIGRATION
from services.tracker.usage import TASKS_MIGRATION as USAGE_TASKS_MIGRATION
from services.tracker.webhooks import TABLES as WEBHOOK_TABLES

NAMESPACE = "tracker"

TABLES: tuple[str, ...] = (
    "tr_experiments",
    "tr_trials",
    "tr_agents",
    "tr_slots",
    "tr_allocations",
    "tr_checkpoints",
    "tr_metrics",
    "tr_series_rollups",
)
"""Every projection table, in a stable order."""

OWNED_TABLES: tuple[str, ...] = TABLES + USAGE_TABLES + AUDIT_TABLES + WEBHOOK_TABLES
"""Every table of the tracker (projections, usage, audit trail, webhook deliveries): only modules of
``services.tracker`` hold SQL naming them; the gateway reads them through
:mod:`services.tracker.read`."""

PRIMARY_KEYS: dict[str, tuple[str, ...]] = {
    "tr_experiments": ("experiment_id",),
    "tr_trials": ("trial_id",),
    "tr_agents": ("agent_id",),
    "tr_slots": ("agent_id", "slot_id"),
    "tr_allocations": ("allocation_id",),
    "tr_checkpoints": ("uuid",),
    "tr_metrics": ("trial_id", "run_id", '"group"', "steps_completed"),
    "tr_series_rollups": ("trial_id", '"group"', "metric", "width"),
}
"""Each table's primary key columns (quoted where needed), for ordered snapshots."""

MIGRATIONS: Sequence[tuple[str, str]] = (
    (
        "0001_projections",
        """
        CREATE TABLE tr_experiments (
            experiment_id      bigint PRIMARY KEY,
            name               text NOT NULL DEFAULT '',
            description        text NOT NULL DEFAULT '',
            labels             jsonb NOT NULL DEFAULT '[]',
            owner              text NOT NULL DEFAULT '',
            state              text NOT NULL,
            archived           boolean NOT NULL DEFAULT false,
            searcher_name      text NOT NULL DEFAULT '',
            searcher_metric    text NOT NULL DEFAULT '',
            smaller_is_better  boolean NOT NULL DEFAULT true,
            max_trials         integer,
            config             jsonb NOT NULL DEFAULT '{}',
            code_ref           text,
            resource_pool      text NOT NULL DEFAULT '',
            num_trials         integer NOT NULL DEFAULT 0,
            submitted_at       timestamptz NOT NULL,
            ended_at           timestamptz,
            best_trial_id      text,
            best_metric        double precision,
            position           bigint NOT NULL
        );
        CREATE INDEX tr_experiments_state ON tr_experiments (state);
        CREATE INDEX tr_experiments_owner ON tr_experiments (owner);

        CREATE TABLE tr_trials (
            trial_id           text PRIMARY KEY,
            experiment_id      bigint NOT NULL,
            seq                integer NOT NULL,
            state              text NOT NULL,
            hparams            jsonb NOT NULL DEFAULT '{}',
            trial_seed         bigint NOT NULL DEFAULT 0,
            run_id             integer NOT NULL DEFAULT 0,
            restarts           integer NOT NULL DEFAULT 0,
            steps_completed    bigint NOT NULL DEFAULT 0,
            latest_checkpoint  text,
            best_metric        double precision,
            latest_validation  jsonb,
            requested_at       timestamptz NOT NULL,
            started_at         timestamptz,
            ended_at           timestamptz
        );
        CREATE INDEX tr_trials_experiment ON tr_trials (experiment_id);

        CREATE TABLE tr_agents (
            agent_id       text PRIMARY KEY,
            resource_pool  text NOT NULL DEFAULT '',
            hostname       text NOT NULL DEFAULT '',
            state          text NOT NULL,
            registered_at  timestamptz NOT NULL,
            lost_at        timestamptz
        );

        CREATE TABLE tr_slots (
            agent_id       text NOT NULL,
            slot_id        text NOT NULL,
            device         text NOT NULL DEFAULT 'cpu',
            name           text NOT NULL DEFAULT '',
            enabled        boolean NOT NULL DEFAULT true,
            draining       boolean NOT NULL DEFAULT false,
            allocation_id  text,
            PRIMARY KEY (agent_id, slot_id)
        );
        CREATE INDEX tr_slots_allocation ON tr_slots (allocation_id)
            WHERE allocation_id IS NOT NULL;

        CREATE TABLE tr_allocations (
            allocation_id  text PRIMARY KEY,
            trial_id       text NOT NULL,
            experiment_id  bigint NOT NULL,
            run_id         integer NOT NULL,
            placements     jsonb NOT NULL DEFAULT '{}',
            state          text NOT NULL,
            outcome        text,
            exit_code      integer,
            agent_id       text,
            allocated_at   timestamptz NOT NULL,
            started_at     timestamptz,
            ended_at       timestamptz
        );
        CREATE INDEX tr_allocations_trial ON tr_allocations (trial_id);
        CREATE INDEX tr_allocations_experiment ON tr_allocations (experiment_id);

        CREATE TABLE tr_checkpoints (
            uuid             text PRIMARY KEY,
            trial_id         text NOT NULL,
            experiment_id    bigint NOT NULL,
            run_id           integer NOT NULL,
            steps_completed  bigint NOT NULL,
            resources        jsonb NOT NULL DEFAULT '{}',
            metadata         jsonb NOT NULL DEFAULT '{}',
            state            text NOT NULL,
            reported_at      timestamptz NOT NULL,
            deleted_at       timestamptz,
            validation       jsonb,
            searcher_metric  double precision
        );
        CREATE INDEX tr_checkpoints_experiment ON tr_checkpoints (experiment_id);
        CREATE INDEX tr_checkpoints_trial ON tr_checkpoints (trial_id, steps_completed);

        CREATE TABLE tr_metrics (
            trial_id         text NOT NULL,
            experiment_id    bigint NOT NULL,
            run_id           integer NOT NULL,
            "group"          text NOT NULL,
            steps_completed  bigint NOT NULL,
            metrics          jsonb NOT NULL,
            archived         boolean NOT NULL DEFAULT false,
            reported_at      timestamptz NOT NULL,
            PRIMARY KEY (trial_id, run_id, "group", steps_completed)
        );
        CREATE INDEX tr_metrics_series ON tr_metrics (trial_id, "group", steps_completed);
        CREATE INDEX tr_metrics_experiment ON tr_metrics (experiment_id);
        """,
    ),
    (
        "0002_integer_trial_ids",
        # Trial ids became integers; rows projected from legacy "E.N" ids get the integer the
        # upcasters give them (events.domain.names), so re-projecting the log would write the same.
        "\n".join(
            f"ALTER TABLE {table} ALTER COLUMN {column} TYPE bigint USING {sql_trial_id(column)};"
            for table, column in (
                ("tr_experiments", "best_trial_id"),
                ("tr_trials", "trial_id"),
                ("tr_allocations", "trial_id"),
                ("tr_checkpoints", "trial_id"),
                ("tr_metrics", "trial_id"),
            )
        ),
    ),
    USAGE_MIGRATION,
    (
        "0004_series_rollups",
        # An ended trial's chart buckets per (group, metric) at a few power-of-two widths
        # (services.tracker.series); buckets in step order as parallel arrays.
        """
        CREATE TABLE tr_series_rollups (
            trial_id       bigint NOT NULL,
            experiment_id  bigint NOT NULL,
            "group"        text NOT NULL,
            metric         text NOT NULL,
            width          bigint NOT NULL,
            firsts         bigint[] NOT NULL,
            lasts          bigint[] NOT NULL,
            lows           double precision[] NOT NULL,
            highs          double precision[] NOT NULL,
            PRIMARY KEY (trial_id, "group", metric, width)
        );
        CREATE INDEX tr_series_rollups_chart
            ON tr_series_rollups (experiment_id, "group", metric, trial_id, width);
        """,
    ),
    (
        "0005_unmanaged",
        # Experiments a script outside the cluster reports to (core_v2): shown marked.
        "ALTER TABLE tr_experiments ADD COLUMN unmanaged boolean NOT NULL DEFAULT false;",
    ),
    USAGE_TASKS_MIGRATION,
    (
        "0007_projects",
        # Every experiment is in a project (1: the default one); lists filter by it.
        """
        ALTER TABLE tr_experiments ADD COLUMN project_id bigint NOT NULL DEFAULT 1;
        CREATE INDEX tr_experiments_project ON tr_experiments (project_id, experiment_id);
        """,
    ),
    USAGE_TASK_WORKSPACES_MIGRATION,
)


async def migrate_conn(conn: Connection) -> int:
    """Applies the tracker's pending migrations on ``conn``; returns how many ran."""
    return await migrations.apply(conn, NAMESPACE, MIGRATIONS)


async def migrate(store: EventStore) -> int:
    """Applies the tracker's pending migrations; returns how many ran."""
    async with store.connection() as conn:
        return await migrate_conn(conn)
