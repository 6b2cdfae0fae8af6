"""A writer process for fault tests: appends one batch to a stream in a transaction, then exits.

The batch goes through ``Transaction.append``, whose ``store.before_commit`` fault point lets a
test kill the writer between the insert and the commit (``EventStore.append`` is a single
statement that commits on its own: it has no such moment).
"""

from __future__ import annotations

import asyncio
import sys

from events.domain.types import TrialRequested
from events.log.store import EventStore


async def main(dsn: str, stream: str, count: int) -> None:
    store = await EventStore.connect(dsn)
    events = [
        TrialRequested(
            experiment_id=9, trial_id=900 + n, seq=n, request_id=f"r{n}", hparams={}, trial_seed=n
        )
        for n in range(count)
    ]
    async with store.transaction() as tx:
        await tx.append(stream, events)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
