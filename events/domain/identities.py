"""Which unix identity each user's code runs as: a pure fold of stream ``unix-identities``.

The uids the cluster gives out itself lie in :data:`ASSIGNED_UIDS`, just above the cluster's own
unprivileged identity :data:`CLUSTER_UID` (code of no particular user), far above the uids that
system and regular accounts and the usual subordinate-uid ranges use. Each user gets the next free
uid once (``AgentUserAssigned``; the decision is appended with the stream version it was made
on, so two users never get the same uid), and a user's gid is their uid. An admin's link
(``AgentUserLinked``) wins over the assignment; a link may not point into the assigned range, so
no linked account can share a uid with another user's assigned one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from events.domain.types.identity import IDENTITIES_STREAM, AgentUserAssigned, AgentUserLinked
from events.log.envelope import RecordedEvent

CLUSTER_UID = 2_000_000_000
"""The cluster's unprivileged identity (uid and gid) for code of no particular user."""
ASSIGNED_UIDS = range(CLUSTER_UID + 1, CLUSTER_UID + 100_000_000)
"""The uids the cluster assigns to users, in order."""
FACTS = ("AgentUserAssigned", "AgentUserLinked")

__all__ = [
    "ASSIGNED_UIDS",
    "CLUSTER_UID",
    "FACTS",
    "IDENTITIES_STREAM",
    "Identities",
    "UnixIdentity",
    "assignment_for",
    "fold_identities",
]


@dataclass(frozen=True)
class UnixIdentity:
    """What a user's code runs as.

    Attributes:
        uid: the uid.
        gid: the primary gid.
        user: the account's name (a link's ``agent_user``, else the cairn username).
        group: the group's name, if a link gave one.
        linked: True when an admin linked it, False when the cluster assigned it.
    """

    uid: int
    gid: int
    user: str
    group: str = ""
    linked: bool = False

    def to_json(self) -> dict[str, object]:
        """The identity as the API hands it out (Determined's ``agent_user_group`` names)."""
        return {
            "agent_uid": self.uid,
            "agent_gid": self.gid,
            "agent_user": self.user,
            "agent_group": self.group,
            "linked": self.linked,
        }


@dataclass
class Identities:
    """The stream folded: every user's identity and the stream version it was read at."""

    version: int = 0
    by_user: dict[str, UnixIdentity] = field(default_factory=dict)
    assigned: dict[str, UnixIdentity] = field(default_factory=dict)
    """What the cluster assigned, kept when a link overrides it (a link never frees a uid)."""

    def of(self, username: str) -> UnixIdentity | None:
        """The identity ``username``'s code runs as, or ``None`` when none was decided yet."""
        return self.by_user.get(username)


def fold_identities(events: Iterable[RecordedEvent]) -> Identities:
    """Folds stream ``unix-identities`` (other events are ignored)."""
    state = Identities()
    for recorded in events:
        if recorded.stream_id != IDENTITIES_STREAM:
            continue
        state.version = max(state.version, recorded.stream_version)
        fact = recorded.decode()
        if isinstance(fact, AgentUserAssigned):
            mine = UnixIdentity(fact.uid, fact.gid, fact.username)
            state.assigned[fact.username] = mine
            state.by_user.setdefault(fact.username, mine)
        elif isinstance(fact, AgentUserLinked):
            state.by_user[fact.username] = UnixIdentity(
                fact.agent_uid,
                fact.agent_gid,
                fact.agent_user or fact.username,
                fact.agent_group,
                linked=True,
            )
    return state


def assignment_for(state: Identities, username: str) -> AgentUserAssigned | None:
    """The assignment to append so that ``username`` has an identity; ``None`` when they have
    one already.

    Raises:
        ValueError: every uid of :data:`ASSIGNED_UIDS` is taken.
    """
    if state.of(username) is not None:
        return None
    taken = {i.uid for i in state.assigned.values()}
    uid = max(taken, default=ASSIGNED_UIDS.start - 1) + 1
    if uid not in ASSIGNED_UIDS:
        raise ValueError("no unassigned uid is left for user code")
    return AgentUserAssigned(username=username, uid=uid, gid=uid)
