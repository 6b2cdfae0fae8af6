"""The identities' decider: an admin links a user to the unix account their code runs as.

Decided over the folded identities stream (:class:`~events.domain.identities.Identities`); the
link applies from the user's next run on. That the user exists is the caller's check (users
live in the gateway's table, not in the log).
"""

from __future__ import annotations

from dataclasses import dataclass

from events.domain.deciders import Decision
from events.domain.identities import Identities
from events.domain.types import AgentUserLinked


@dataclass(frozen=True)
class LinkAgentUser:
    """Run ``username``'s code as ``agent_uid``/``agent_gid`` (named ``agent_user`` and
    ``agent_group`` inside containers; empty: the defaults)."""

    username: str
    agent_uid: int
    agent_gid: int
    actor: str
    agent_user: str = ""
    agent_group: str = ""


def decide_link(state: Identities, command: LinkAgentUser) -> Decision:
    """``AgentUserLinked``, recorded every time (the latest link stands)."""
    del state  # every link is recorded; the stream's version orders it after what was folded
    return [
        AgentUserLinked(
            username=command.username,
            agent_uid=command.agent_uid,
            agent_gid=command.agent_gid,
            agent_user=command.agent_user,
            agent_group=command.agent_group,
            actor=command.actor,
        )
    ]
