"""The gateway's own tables (migrations namespace ``api``): auth, code, telemetry kept out of the log.

Nothing here is a fact of the platform: users and tokens are credentials, code blobs are content
addressed, and heartbeats, progress and logs are high-volume telemetry keyed idempotently (see
``docs/protocol.md``). Metrics are facts in the log, projected by the tracker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from events.domain.names import sql_trial_id
from events.log import migrations
from events.log.store import EventStore

NAMESPACE = "api"

OWNED_TABLES: tuple[str, ...] = (
    "api_users",
    "api_tokens",
    "api_secrets",
    "code_blobs",
    "agent_heartbeats",
    "trial_progress",
    "task_logs",
    "trial_status",
    "agent_credentials",
    "unmanaged_names",
    "unmanaged_heartbeats",
)
"""The gateway's tables: only modules of ``services.api`` hold SQL naming them; other services
read them through :mod:`services.api.read`."""

MIGRATIONS: Sequence[tuple[str, str]] = (
    (
        "0001_auth",
        """
        CREATE TABLE api_users (
            username        text PRIMARY KEY,
            password_hash   text NOT NULL,
            admin           boolean NOT NULL DEFAULT false,
            created_at      timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE api_tokens (
            token_hash  text PRIMARY KEY,
            username    text NOT NULL REFERENCES api_users (username) ON DELETE CASCADE,
            created_at  timestamptz NOT NULL DEFAULT now(),
            expires_at  timestamptz
        );
        CREATE TABLE api_secrets (
            name        text PRIMARY KEY,
            value       text NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now()
        );
        INSERT INTO api_secrets (name, value)
        VALUES ('cluster', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
        """,
    ),
    (
        "0002_code",
        """
        CREATE TABLE code_blobs (
            code_ref    text PRIMARY KEY,
            data        bytea NOT NULL,
            size        bigint NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now()
        );
        """,
    ),
    (
        "0003_telemetry",
        """
        CREATE TABLE agent_heartbeats (
            agent_id    text PRIMARY KEY,
            beat_at     timestamptz NOT NULL DEFAULT now(),
            running     jsonb NOT NULL DEFAULT '[]'
        );
        CREATE TABLE metrics (
            trial_id         text NOT NULL,
            run_id           integer NOT NULL,
            "group"          text NOT NULL,
            steps_completed  bigint NOT NULL,
            metrics          jsonb NOT NULL,
            archived         boolean NOT NULL DEFAULT false,
            reported_at      timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (trial_id, run_id, "group", steps_completed)
        );
        CREATE INDEX metrics_series ON metrics (trial_id, "group", steps_completed);
        CREATE TABLE trial_progress (
            trial_id    text PRIMARY KEY,
            progress    double precision NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE task_logs (
            id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            allocation_id    text NOT NULL,
            trial_id         text NOT NULL,
            idempotency_key  text NOT NULL,
            seq              integer NOT NULL,
            ts               timestamptz NOT NULL,
            rank             integer,
            stream           text NOT NULL,
            line             text NOT NULL,
            UNIQUE (allocation_id, idempotency_key, seq)
        );
        CREATE INDEX task_logs_trial ON task_logs (trial_id, id);
        """,
    ),
    (
        "0004_metrics_to_tracker",
        # Metrics are facts in the log now; the tracker projects them into tr_metrics.
        "DROP TABLE IF EXISTS metrics;",
    ),
    (
        "0005_heartbeat_incarnation",
        # Which agent process sent the running list, and its heartbeat number in that process:
        # the scheduler compares them with the allocations it believes running.
        """
        ALTER TABLE agent_heartbeats ADD COLUMN incarnation text NOT NULL DEFAULT '';
        ALTER TABLE agent_heartbeats ADD COLUMN seq bigint NOT NULL DEFAULT 0;
        """,
    ),
    (
        "0006_trial_status",
        # Like progress, the status text a trial shows is its latest report, not a fact.
        """CREATE TABLE IF NOT EXISTS trial_status (
               trial_id    text PRIMARY KEY,
               status      text NOT NULL,
               updated_at  timestamptz NOT NULL DEFAULT now()
           );""",
    ),
    (
        "0007_user_active",
        # A deactivated user can neither log in nor use a token issued before.
        "ALTER TABLE api_users ADD COLUMN active boolean NOT NULL DEFAULT true;",
    ),
    (
        "0008_integer_trial_ids",
        # Trial ids became integers; legacy "E.N" rows get the id the upcasters give them.
        "\n".join(
            f"ALTER TABLE {table} ALTER COLUMN trial_id TYPE bigint USING {sql_trial_id('trial_id')};"
            for table in ("trial_progress", "task_logs", "trial_status")
        ),
    ),
    (
        "0009_agent_credentials",
        # Each agent's own credential, issued once from the join token (its hash only); a
        # revoked one stays, so the agent id cannot join again with the join token alone.
        """CREATE TABLE agent_credentials (
               agent_id     text PRIMARY KEY,
               token_hash   text NOT NULL UNIQUE,
               subject      text NOT NULL,
               nats_user    text NOT NULL DEFAULT '',
               incarnation  text NOT NULL DEFAULT '',
               issued_at    timestamptz NOT NULL DEFAULT now(),
               revoked_at   timestamptz,
               revoked_by   text
           );
           CREATE UNIQUE INDEX agent_credentials_subject ON agent_credentials (subject);""",
    ),
    (
        "0010_token_ids",
        # User tokens are listed and revoked by an id that is not the token (nor its hash).
        """
        ALTER TABLE api_tokens ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY UNIQUE;
        CREATE INDEX api_tokens_username ON api_tokens (username);
        """,
    ),
    (
        "0011_unmanaged",
        # Unmanaged runs (core_v2 outside the cluster). unmanaged_names indexes the external ids
        # the log records (ExperimentSubmitted/TrialRequested.external_id) per owner, written in
        # the transaction that appends them; external_trial_id '' names the experiment itself.
        # unmanaged_heartbeats is telemetry: when each open run's script was last heard from.
        """
        CREATE TABLE unmanaged_names (
            owner                   text NOT NULL,
            external_experiment_id  text NOT NULL,
            external_trial_id       text NOT NULL,
            experiment_id           bigint NOT NULL,
            trial_id                bigint,
            PRIMARY KEY (owner, external_experiment_id, external_trial_id)
        );
        CREATE TABLE unmanaged_heartbeats (
            trial_id  bigint PRIMARY KEY,
            run_id    integer NOT NULL,
            seen_at   timestamptz NOT NULL DEFAULT now()
        );
        """,
    ),
    (
        "0012_task_logs",
        # A task's output (a command's) is kept beside the trials': its rows name the task
        # (task_id) and no trial (trial_id NULL); every trial read filters on trial_id.
        """
        ALTER TABLE task_logs ALTER COLUMN trial_id DROP NOT NULL;
        ALTER TABLE task_logs ADD COLUMN task_id text;
        CREATE INDEX task_logs_task ON task_logs (task_id, id) WHERE task_id IS NOT NULL;
        """,
    ),
)


async def migrate(store: EventStore) -> int:
    """Applies the gateway's pending migrations; returns how many ran.

    Only the gateway's own. ``python -m services.migrate`` applies every owner's before the
    services start, so on a cluster this only checks (the gateway's role may not change the
    schema and stops with :class:`~events.log.errors.MigrationsPendingError` if one is missing);
    with a superuser's DSN (tests, a gateway started by hand) it applies them. The gateway reads
    the tracker's tables through :mod:`services.tracker.read`, which answers as if they were
    empty until they exist.
    """
    async with store.connection() as conn:
        return await migrations.apply(conn, NAMESPACE, MIGRATIONS)


async def fetch(store: EventStore, sql: str, *args: Any) -> list[Any]:
    """Runs a query on the pool with driver errors translated."""
    return list(await store.fetch(sql, *args))


async def fetchrow(store: EventStore, sql: str, *args: Any) -> Any:
    """Runs a query on the pool and returns its first row (or ``None``)."""
    return await store.fetchrow(sql, *args)


async def fetchval(store: EventStore, sql: str, *args: Any) -> Any:
    """Runs a query on the pool and returns the first column of its first row."""
    return await store.fetchval(sql, *args)


async def execute(store: EventStore, sql: str, *args: Any) -> None:
    """Runs a statement on the pool."""
    await store.execute(sql, *args)
