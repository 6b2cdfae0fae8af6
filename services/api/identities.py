"""The unix identity each user's code runs as (see :mod:`events.domain.identities`), as the gateway
reads and decides it: assigned the first time a run of the user's needs one, linked by an admin.
"""

from __future__ import annotations

from events.domain.identities import (
    FACTS,
    IDENTITIES_STREAM,
    Identities,
    UnixIdentity,
    assignment_for,
)
from events.domain.identities import fold_identities as fold
from events.log.envelope import new
from events.log.store import EventStore, Transaction
from services.api.errors import ApiError
from services.api.inbox import in_transaction
from services.api.views import Reader, read_facts


async def load_identities(reader: Reader) -> Identities:
    """Stream ``unix-identities`` folded (its version is the stream's head)."""
    events, head = await read_facts(reader, IDENTITIES_STREAM, FACTS)
    state = fold(events)
    state.version = head
    return state


async def identity_for_run(store: EventStore, username: str) -> UnixIdentity:
    """The identity ``username``'s code runs as, assigning one first if they have none.

    Raises:
        ApiError: 503 when no uid is left to assign.
    """

    async def decide(tx: Transaction) -> UnixIdentity:
        state = await load_identities(tx)
        try:
            assignment = assignment_for(state, username)
        except ValueError as exc:
            raise ApiError(503, str(exc)) from None
        if assignment is None:
            found = state.of(username)
            assert found is not None
            return found
        await tx.append(IDENTITIES_STREAM, [new(assignment)], expected_version=state.version)
        return UnixIdentity(assignment.uid, assignment.gid, username)

    state = await load_identities(store)
    found = state.of(username)
    if found is not None:
        return found
    return await in_transaction(store, decide)
