"""Facts about the unix identities user code runs as (stream ``unix-identities``).

User code never runs as the services' uid. Each cairn user's trials run under an unprivileged
uid and gid of their own, given once by the cluster (``AgentUserAssigned``), unless an admin
linked the user to an account of the machines (``AgentUserLinked``, as Determined's
``agent_user_group``), so files on shared storage carry that account as their owner.
"""

from __future__ import annotations

from events.log.envelope import Event
from events.log.registry import register

IDENTITIES_STREAM = "unix-identities"
"""The one stream both types are appended to (a new uid is decided against every other)."""


@register
class AgentUserAssigned(Event):
    """The cluster gave ``username`` a uid and gid of their own, the first time code of theirs
    was about to run; every later run of theirs uses it (until an admin links the user)."""

    event_type = "AgentUserAssigned"

    username: str
    uid: int
    gid: int


@register
class AgentUserLinked(Event):
    """An admin linked ``username`` to a unix account: their code runs as ``agent_uid`` and
    ``agent_gid`` from now on (``agent_user``/``agent_group``: the account's names, if given)."""

    event_type = "AgentUserLinked"

    username: str
    agent_uid: int
    agent_gid: int
    agent_user: str = ""
    agent_group: str = ""
    actor: str = ""
