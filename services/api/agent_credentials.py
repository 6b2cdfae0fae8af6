"""Agents' own credentials, issued once from the cluster's join token (table ``agent_credentials``).

An agent presents the join token once, to ``POST /api/v1/agents/{agent_id}/join``, and receives
an API token bound to its agent id (``agent:<random>``; only its SHA-256 is stored) and, when the
gateway holds the bus's signing key, a NATS user that may read only that agent's command subject
(:mod:`events.log.bus_auth`). The join token opens nothing else.

Invariants:

- One credential per agent id, ever: a second join for an id that holds one (live or revoked) is
  refused, so the join token alone can never act as an existing agent. A revoked agent id stays
  refused; the machine comes back under another id.
- Two agent ids whose command subjects coincide (``a.b`` and ``a_b``) cannot both join: the
  second would read the first's commands.
- The incarnation a credential was last registered with is recorded: reports that name another
  incarnation come from a process that is not the agent's current one.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from events.domain.commands import agent_subject
from events.log.bus_auth import Authority, agent_inbox, public_key, safe_token
from events.log.store import EventStore
from services.api.errors import forbidden

TOKEN_PREFIX = "agent:"


@dataclass(frozen=True)
class AgentCredential:
    """An agent's credential as stored (never the token itself)."""

    agent_id: str
    subject: str
    nats_user: str
    incarnation: str
    issued_at: datetime
    revoked_at: datetime | None
    revoked_by: str | None

    def to_json(self) -> dict[str, Any]:
        """As listed by ``GET /api/v1/agent-credentials``."""
        return {
            "agent_id": self.agent_id,
            "subject": self.subject,
            "nats_user": self.nats_user,
            "incarnation": self.incarnation,
            "issued_at": self.issued_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
            "revoked_by": self.revoked_by,
        }


@dataclass(frozen=True)
class Issued:
    """What a join hands the agent: its API token and, when the bus requires credentials, the
    ``.creds`` text of its NATS user and the inbox prefix that user may receive on."""

    agent_id: str
    token: str
    nats_creds: str | None
    inbox_prefix: str


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _row(row: Any) -> AgentCredential:
    return AgentCredential(
        agent_id=str(row["agent_id"]),
        subject=str(row["subject"]),
        nats_user=str(row["nats_user"]),
        incarnation=str(row["incarnation"]),
        issued_at=row["issued_at"],
        revoked_at=row["revoked_at"],
        revoked_by=row["revoked_by"],
    )


_COLUMNS = "agent_id, subject, nats_user, incarnation, issued_at, revoked_at, revoked_by"


async def issue(store: EventStore, agent_id: str, authority: Authority | None) -> Issued:
    """Issues ``agent_id``'s credential.

    Raises:
        ApiError: 403 when the id (or its command subject) already holds a credential.
    """
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    creds = (
        authority.user_creds(f"cairn-agent-{safe_token(agent_id)}", "agent", agent_id=agent_id)
        if authority is not None
        else None
    )
    nats_user = _creds_user(creds) if creds is not None else ""
    subject = agent_subject(agent_id)
    async with store.connection() as conn, conn.transaction():
        taken = await conn.fetchrow(
            "SELECT agent_id, revoked_at FROM agent_credentials "
            "WHERE agent_id = $1 OR subject = $2 FOR UPDATE",
            agent_id,
            subject,
        )
        if taken is not None:
            if str(taken["agent_id"]) != agent_id:
                raise forbidden(
                    f"agent id {agent_id!r} shares its command subject {subject} with agent "
                    f"{taken['agent_id']!r}; choose an id of letters, digits, - and _"
                )
            if taken["revoked_at"] is not None:
                raise forbidden(
                    f"agent {agent_id}'s credential was revoked; join under another agent id"
                )
            raise forbidden(
                f"agent {agent_id} has already joined; it uses the credential it was given "
                "(an admin can revoke it: cairn agent revoke)"
            )
        await conn.execute(
            "INSERT INTO agent_credentials (agent_id, token_hash, subject, nats_user) "
            "VALUES ($1, $2, $3, $4)",
            agent_id,
            _hash(token),
            subject,
            nats_user,
        )
    return Issued(agent_id, token, creds, agent_inbox(agent_id))


def _creds_user(creds: str) -> str:
    seed = creds.split("-----BEGIN USER NKEY SEED-----\n", 1)[1].split("\n", 1)[0]
    return public_key(seed)


async def lookup(store: EventStore, token: str) -> AgentCredential | None:
    """The live credential whose token is ``token``, or ``None`` (unknown or revoked)."""
    row = await store.fetchrow(
        f"SELECT {_COLUMNS} FROM agent_credentials WHERE token_hash = $1 AND revoked_at IS NULL",
        _hash(token),
    )
    return _row(row) if row is not None else None


async def bind_incarnation(store: EventStore, agent_id: str, incarnation: str) -> None:
    """Records the agent process (incarnation) that registered last with the credential."""
    await store.execute(
        "UPDATE agent_credentials SET incarnation = $2 WHERE agent_id = $1",
        agent_id,
        incarnation,
    )


async def list_all(store: EventStore) -> list[AgentCredential]:
    """Every credential ever issued, by agent id."""
    rows = await store.fetch(f"SELECT {_COLUMNS} FROM agent_credentials ORDER BY agent_id")
    return [_row(r) for r in rows]


async def revoke(store: EventStore, agent_id: str, *, by: str) -> AgentCredential | None:
    """Revokes ``agent_id``'s credential (a no-op if it already was); ``None`` if it has none."""
    row = await store.fetchrow(
        f"""UPDATE agent_credentials
            SET revoked_at = coalesce(revoked_at, now()),
                revoked_by = coalesce(revoked_by, $2)
            WHERE agent_id = $1
            RETURNING {_COLUMNS}""",
        agent_id,
        by,
    )
    return _row(row) if row is not None else None
