"""Who owns a checkpoint: the trial whose ``CheckpointSaved`` recorded its uuid first.

A uuid names a directory shared by every experiment that uses the same storage, so a later
``CheckpointSaved`` of the same uuid from another trial is a claim, not a fact about the files:
the gateway refuses such claims, and anything that deletes files (the tracker's GC) only acts
on checkpoints owned by the experiment at hand, so a log written before claims were refused
cannot make it delete another experiment's files.
"""

from __future__ import annotations

from collections.abc import Iterable

from events.domain.names import coerce_trial_id
from events.log.db import Connection


async def checkpoint_owners(conn: Connection, uuids: Iterable[str]) -> dict[str, int]:
    """The owning trial id of each of ``uuids`` that the log has recorded (others are absent).

    Args:
        conn: a connection (inside a transaction holding the append lock, the answer cannot
            change before commit).
        uuids: checkpoint uuids.

    Returns:
        ``{uuid: trial_id}`` from each uuid's first ``CheckpointSaved`` by log position.
    """
    wanted = sorted(set(uuids))
    if not wanted:
        return {}
    rows = await conn.fetch(
        """SELECT DISTINCT ON (payload->>'uuid') payload->>'uuid' AS uuid,
                  payload->>'trial_id' AS trial_id
           FROM events
           WHERE type = 'CheckpointSaved' AND payload->>'uuid' = ANY($1::text[])
           ORDER BY payload->>'uuid', position""",
        wanted,
    )
    # Raw payloads: a legacy "E.N" id reads as the integer its upcaster gives it.
    return {str(r["uuid"]): coerce_trial_id(r["trial_id"]) for r in rows}
