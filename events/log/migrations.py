"""Schema migrations: an ordered list per namespace, each applied once, under an advisory lock.

The core namespace owns the log itself; services (tracker projections, metrics) pass their own
namespace and list to :func:`apply`.
"""

from __future__ import annotations

from collections.abc import Sequence

from events.log.db import Connection
from events.log.errors import MigrationsPendingError

_LOCK_KEY = 0x6361_6972  # "cair": serializes concurrent migrators

OWNED_TABLES: tuple[str, ...] = (
    "events",
    "checkpoints",
    "inbox",
    "schema_migrations",
    "experiment_ids",
    "trial_ids",
)
"""The relations (tables and sequences) of the log, owned by this package: only modules of
``events`` hold SQL naming them, except that any service may read ``events`` (the log is the
one interface the services share; appends go through :mod:`events.log.store`)."""

SHARED_READ: frozenset[str] = frozenset({"events"})
"""The owned relations other packages may name in a read (never a write)."""

LOG_WRITER = "cairn_log_writer"
"""The role that owns the append functions (migration ``0007_append_owner``): no one logs in
as it, and it is the only role besides the database's superuser that may write ``events``.
Roles are shared by every database of a server, so one role serves them all."""

_APPEND_SIGNATURE = (
    "cairn_append(text, uuid[], text[], int[], text[], text[], bigint, text, bigint, text)"
)
APPEND_FUNCTIONS: tuple[str, ...] = (_APPEND_SIGNATURE, "cairn_lock_appends()")
"""The functions through which the log is appended to (with their argument types, as ``GRANT
EXECUTE`` names them): the only write access to ``events`` a service's role is given."""

CORE: Sequence[tuple[str, str]] = (
    (
        "0001_events",
        """
        CREATE TABLE events (
            position        bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
            stream_id       text        NOT NULL,
            stream_version  bigint      NOT NULL,
            event_id        uuid        NOT NULL UNIQUE,
            type            text        NOT NULL,
            schema_version  integer     NOT NULL,
            payload         jsonb       NOT NULL,
            metadata        jsonb       NOT NULL DEFAULT '{}',
            recorded_at     timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT events_pkey PRIMARY KEY (stream_id, stream_version)
        ) WITH (autovacuum_vacuum_scale_factor = 0.5);
        CREATE INDEX events_type_position ON events (type, position);
        """,
    ),
    (
        "0002_checkpoints",
        """
        CREATE TABLE checkpoints (
            name        text PRIMARY KEY,
            position    bigint NOT NULL DEFAULT 0,
            updated_at  timestamptz NOT NULL DEFAULT now()
        );
        CREATE TABLE snapshots (
            stream_id       text    NOT NULL,
            fold            text    NOT NULL,
            fold_version    integer NOT NULL,
            stream_version  bigint  NOT NULL,
            state           jsonb   NOT NULL,
            PRIMARY KEY (stream_id, fold)
        );
        CREATE TABLE inbox (
            source      text NOT NULL,
            key         text NOT NULL,
            result      jsonb,
            recorded_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (source, key)
        );
        CREATE SEQUENCE experiment_ids;
        """,
    ),
    (
        "0003_ownership_indexes",
        # Looked up under the append lock on every trial report, so neither may scan a stream:
        # which trial recorded a checkpoint uuid first (its owner), and the few lifecycle facts
        # that say whether a trial's run may still report.
        """
        CREATE INDEX events_checkpoint_uuid ON events ((payload->>'uuid'), position)
            WHERE type = 'CheckpointSaved';
        CREATE INDEX events_lifecycle ON events (stream_id, stream_version)
            WHERE type IN ('ExperimentSubmitted', 'ExperimentStateChanged', 'SlotsAllocated',
                           'TrialExited', 'TrialStateChanged');
        """,
    ),
    (
        "0004_trial_ids",
        # Trial ids are cluster-wide integers taken by the searcher; the index finds the
        # experiment of a trial id (the raw payload holds it as text: "17", legacy "9.1").
        """
        CREATE SEQUENCE trial_ids;
        CREATE INDEX events_trial_requested ON events ((payload->>'trial_id'))
            WHERE type = 'TrialRequested';
        """,
    ),
    (
        "0005_lifecycle_index_continued",
        # ExperimentContinued is a lifecycle fact too (it reopens an ended experiment); the
        # partial index must cover every type the run-state query reads, or it is not used.
        """
        DROP INDEX IF EXISTS events_lifecycle;
        CREATE INDEX events_lifecycle ON events (stream_id, stream_version)
            WHERE type IN ('ExperimentSubmitted', 'ExperimentStateChanged', 'ExperimentContinued',
                           'SlotsAllocated', 'TrialExited', 'TrialStateChanged');
        """,
    ),
    (
        "0006_append_function",
        # The whole append in one statement, so a single append outside a transaction costs
        # one round trip (events.log.store): under the append lock, check the leader's fence and
        # the stream's expected version, then insert and queue the wake-up. A refused append
        # inserts nothing and reports why (o_fenced: the lease's epoch; o_current: the
        # stream's version); an empty result never happens.
        """
        CREATE OR REPLACE FUNCTION cairn_append(
            p_stream text, p_ids uuid[], p_types text[], p_versions int[], p_payloads text[],
            p_metas text[], p_expected bigint, p_lease_stream text, p_epoch bigint,
            p_channel text)
        RETURNS TABLE (o_current bigint, o_fenced bigint, o_position bigint, o_version bigint,
                       o_recorded_at timestamptz)
        LANGUAGE plpgsql AS $$
        DECLARE
            v_current bigint;
            v_epoch bigint;
        BEGIN
            PERFORM set_config('lock_timeout', '10s', true);
            LOCK TABLE events IN EXCLUSIVE MODE;
            IF p_lease_stream IS NOT NULL THEN
                SELECT coalesce(max(e.stream_version), 0) INTO v_epoch
                FROM events e WHERE e.stream_id = p_lease_stream;
                IF v_epoch <> p_epoch THEN
                    RETURN QUERY SELECT NULL::bigint, v_epoch, NULL::bigint, NULL::bigint,
                                        NULL::timestamptz;
                    RETURN;
                END IF;
            END IF;
            SELECT coalesce(max(e.stream_version), 0) INTO v_current
            FROM events e WHERE e.stream_id = p_stream;
            IF p_expected IS NOT NULL AND v_current <> p_expected THEN
                RETURN QUERY SELECT v_current, NULL::bigint, NULL::bigint, NULL::bigint,
                                    NULL::timestamptz;
                RETURN;
            END IF;
            PERFORM pg_notify(p_channel, p_stream);
            RETURN QUERY
                INSERT INTO events AS e (event_id, stream_id, stream_version, type,
                                         schema_version, payload, metadata)
                SELECT u.i, p_stream, v_current + u.n, u.t, u.s, u.p::jsonb, u.m::jsonb
                FROM unnest(p_ids, p_types, p_versions, p_payloads, p_metas)
                     WITH ORDINALITY AS u(i, t, s, p, m, n)
                RETURNING v_current, NULL::bigint, e.position, e.stream_version, e.recorded_at;
        END
        $$;
        """,
    ),
    (
        "0007_append_owner",
        # Appends run with the rights of LOG_WRITER, a role nobody logs in as: a service's own
        # role may execute the two functions below but holds no INSERT, UPDATE or DELETE on
        # events, so the only writes to the log are the ones cairn_append makes. LOCK ... IN
        # EXCLUSIVE MODE requires UPDATE, DELETE or TRUNCATE on the table: UPDATE is granted
        # for that alone. search_path is pinned so that a caller's objects are never resolved
        # inside the functions. EXECUTE is revoked from PUBLIC; services.roles grants it.
        f"""
        DO $$
        BEGIN
            CREATE ROLE {LOG_WRITER} NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- another database of this server (or a concurrent migrator) made it
        END
        $$;
        GRANT SELECT, INSERT, UPDATE ON events TO {LOG_WRITER};
        CREATE FUNCTION cairn_lock_appends() RETURNS void LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM set_config('lock_timeout', '10s', true);
            LOCK TABLE events IN EXCLUSIVE MODE;
        END
        $$;
        ALTER FUNCTION {_APPEND_SIGNATURE} OWNER TO {LOG_WRITER};
        ALTER FUNCTION {_APPEND_SIGNATURE} SECURITY DEFINER SET search_path = public, pg_temp;
        ALTER FUNCTION cairn_lock_appends() OWNER TO {LOG_WRITER};
        ALTER FUNCTION cairn_lock_appends() SECURITY DEFINER SET search_path = public, pg_temp;
        REVOKE ALL ON FUNCTION {_APPEND_SIGNATURE} FROM PUBLIC;
        REVOKE ALL ON FUNCTION cairn_lock_appends() FROM PUBLIC;
        """,
    ),
    (
        "0008_checkpoint_rows",
        # A consumer's checkpoint row is written by its own service only: with row security on,
        # a role other than the superuser may read every row but write only the rows a policy
        # of its own allows (services.roles makes one per service's role). The superuser, who
        # owns the table, is not subject to it.
        """
        ALTER TABLE checkpoints ENABLE ROW LEVEL SECURITY;
        CREATE POLICY checkpoints_read ON checkpoints FOR SELECT USING (true);
        """,
    ),
    (
        "0009_drop_snapshots",
        # Fold snapshots were never taken in production: every service refolds the log from
        # its own position (the scheduler, the one decider that refolds after a lost race, folds
        # the whole cluster, which a per-stream snapshot cannot hold). The table goes with the
        # module that wrote it; no role was granted on it.
        "DROP TABLE IF EXISTS snapshots;",
    ),
)


async def pending(
    conn: Connection, namespace: str, migrations: Sequence[tuple[str, str]]
) -> list[str]:
    """The ids of ``namespace``'s migrations not applied yet, in order (read only)."""
    if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        return [mig_id for mig_id, _ in migrations]
    done = {
        r["id"]
        for r in await conn.fetch(
            "SELECT id FROM schema_migrations WHERE namespace = $1", namespace
        )
    }
    return [mig_id for mig_id, _ in migrations if mig_id not in done]


async def apply(conn: Connection, namespace: str, migrations: Sequence[tuple[str, str]]) -> int:
    """Applies the not-yet-applied migrations of ``namespace`` in order; returns how many ran.

    When none is pending this only reads, so a service's role (which may not change the
    schema) passes; otherwise it needs a role that may create in the schema.

    Raises:
        MigrationsPendingError: some are pending and this session may not apply them.
    """
    missing = await pending(conn, namespace, migrations)
    if not missing:
        return 0
    if not await conn.fetchval("SELECT has_schema_privilege(current_schema(), 'CREATE')"):
        raise MigrationsPendingError(namespace, missing)
    ran = 0
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   namespace text NOT NULL, id text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now(),
                   PRIMARY KEY (namespace, id))"""
        )
        done = {
            r["id"]
            for r in await conn.fetch(
                "SELECT id FROM schema_migrations WHERE namespace = $1", namespace
            )
        }
        for mig_id, sql in migrations:
            if mig_id in done:
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO schema_migrations (namespace, id) VALUES ($1, $2)", namespace, mig_id
            )
            ran += 1
    return ran
