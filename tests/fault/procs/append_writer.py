"""A writer process for fault tests: appends one batch to a stream, then exits."""

from __future__ import annotations

import asyncio
import sys

from events.store import EventStore
from events.types import TrialRequested


async def main(dsn: str, stream: str, count: int) -> None:
    store = await EventStore.connect(dsn)
    events = [
        TrialRequested(
            experiment_id=9, trial_id=900 + n, seq=n, request_id=f"r{n}", hparams={}, trial_seed=n
        )
        for n in range(count)
    ]
    await store.append(stream, events)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
