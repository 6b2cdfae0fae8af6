"""Which unix identity each user's code runs as: the fold of stream ``unix-identities``."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from events.domain.identities import (
    ASSIGNED_UIDS,
    IDENTITIES_STREAM,
    Identities,
    assignment_for,
    fold_identities,
)
from events.domain.types import AgentUserAssigned, AgentUserLinked
from events.log.envelope import Event, RecordedEvent


def recorded(*facts: Event) -> list[RecordedEvent]:
    """The facts as stream ``unix-identities`` holds them."""
    return [
        RecordedEvent(
            position=n,
            stream_id=IDENTITIES_STREAM,
            stream_version=n,
            event_id=uuid.uuid4(),
            type=fact.event_type,
            schema_version=fact.schema_version,
            payload=fact.model_dump(mode="json"),
            metadata={},
            recorded_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        for n, fact in enumerate(facts, start=1)
    ]


def test_users_get_distinct_uids_in_order_and_keep_them() -> None:
    """Each user is assigned the next uid of the range once; gid equals uid; a user who has one
    needs no new assignment."""
    state = Identities()
    facts = []
    for name in ("alice", "bob"):
        fact = assignment_for(state, name)
        assert fact is not None
        facts.append(fact)
        state = fold_identities(recorded(*facts))
    assert [(f.uid, f.gid) for f in facts] == [
        (ASSIGNED_UIDS[0], ASSIGNED_UIDS[0]),
        (ASSIGNED_UIDS[1], ASSIGNED_UIDS[1]),
    ]
    assert assignment_for(state, "alice") is None
    assert state.version == 2


def test_a_link_wins_and_never_frees_the_assigned_uid() -> None:
    """A linked user runs as the link; the next user still gets a uid no one had."""
    first = AgentUserAssigned(username="alice", uid=ASSIGNED_UIDS[0], gid=ASSIGNED_UIDS[0])
    link = AgentUserLinked(username="alice", agent_uid=1001, agent_gid=50, agent_user="al")
    state = fold_identities(recorded(first, link))
    mine = state.of("alice")
    assert mine is not None and (mine.uid, mine.gid, mine.user, mine.linked) == (
        1001,
        50,
        "al",
        True,
    )
    nxt = assignment_for(state, "bob")
    assert nxt is not None and nxt.uid == ASSIGNED_UIDS[1]


def test_a_linked_user_without_an_assignment_needs_none() -> None:
    """A user linked before any run of theirs is never assigned a uid."""
    link = AgentUserLinked(username="carol", agent_uid=1002, agent_gid=1002)
    state = fold_identities(recorded(link))
    assert assignment_for(state, "carol") is None
    mine = state.of("carol")
    assert mine is not None and mine.user == "carol"
