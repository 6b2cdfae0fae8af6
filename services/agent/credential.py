"""The agent's own credential: obtained once with the cluster's join token, kept in its work dir.

``<work_dir>/credential.json`` holds the API token bound to this agent id and the inbox prefix of
its NATS user; ``<work_dir>/nats.creds`` holds that NATS user (when the bus requires credentials).
Both are mode 0600 and written before the agent uses them, so a restarted agent (a new
incarnation) presents the same credential: the join token is needed only on the first start of an
agent id, and the API refuses it for an id that already joined.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import structlog

from events.log.bus_auth import BusAuthError, read_private, write_private
from services.agent.client import ApiClient, ApiError

log = structlog.get_logger("agent")

CREDENTIAL_FILE = "credential.json"
NATS_CREDS_FILE = "nats.creds"


class CredentialError(Exception):
    """The agent has no credential and cannot obtain one (no join token, or the API refused)."""


@dataclass(frozen=True)
class Credential:
    """What the agent speaks with: its API token and, if the bus requires one, its NATS user."""

    agent_id: str
    token: str
    inbox_prefix: str | None
    nats_creds: Path | None


def _load(work_dir: Path, agent_id: str) -> Credential | None:
    path = work_dir / CREDENTIAL_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(read_private(path, what="agent credential"))
    except (BusAuthError, ValueError) as exc:
        raise CredentialError(str(exc)) from exc
    if data.get("agent_id") != agent_id:
        raise CredentialError(
            f"{path} belongs to agent {data.get('agent_id')!r}, not {agent_id!r}; "
            "give each agent its own --work-dir"
        )
    creds = work_dir / NATS_CREDS_FILE
    return Credential(
        agent_id=agent_id,
        token=str(data["token"]),
        inbox_prefix=data.get("inbox_prefix"),
        nats_creds=creds if creds.exists() else None,
    )


def read_join_token(join_token_file: Path | None, fallback: str) -> str:
    """The join token from ``join_token_file`` (mode 0600), else ``fallback``.

    Raises:
        CredentialError: neither gives one, or the file is unreadable or open to others.
    """
    if join_token_file is not None:
        try:
            value = read_private(join_token_file, what="join token").strip()
        except BusAuthError as exc:
            raise CredentialError(str(exc)) from exc
        if value:
            return value
        raise CredentialError(f"the join token file {join_token_file} is empty")
    if fallback:
        return fallback
    raise CredentialError(
        "this agent has not joined the cluster yet and has no join token: pass "
        "--join-token-file (CAIRN_JOIN_TOKEN_FILE)"
    )


async def obtain(
    client: ApiClient,
    work_dir: Path,
    agent_id: str,
    *,
    join_token_file: Path | None,
    fallback_token: str = "",
) -> Credential:
    """The agent's credential from its work dir, or, on its first start, from the API in
    exchange for the join token (then saved).

    Raises:
        CredentialError: no join token, or the API refused the join (the id already joined,
            was revoked, or the token is wrong).
    """
    found = _load(work_dir, agent_id)
    if found is not None:
        return found
    join = read_join_token(join_token_file, fallback_token)
    try:
        answer = await client.join(agent_id, join)
    except ApiError as exc:
        raise CredentialError(f"the API refused this agent's join: {exc}") from exc
    creds_text = answer.nats_creds
    if creds_text:
        write_private(work_dir / NATS_CREDS_FILE, str(creds_text))
    write_private(
        work_dir / CREDENTIAL_FILE,
        json.dumps(
            {
                "agent_id": agent_id,
                "token": answer.token,
                "inbox_prefix": answer.inbox_prefix,
            }
        ),
    )
    log.info("joined the cluster", agent_id=agent_id, nats_user=bool(creds_text))
    loaded = _load(work_dir, agent_id)
    assert loaded is not None
    return loaded
