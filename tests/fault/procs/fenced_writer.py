"""A leader process for fault tests: takes a lease, then appends under its fence until refused.

Prints ``LEADING <epoch>`` once it holds the lease and ``FENCED <epoch>`` when the store refuses
a write because a newer leader was elected; then it exits 0.
"""

from __future__ import annotations

import asyncio
import sys

from events.domain.types import ExperimentSubmitted
from events.log.errors import FencedError, StoreUnavailableError
from events.log.lease import LeaderLease
from events.log.store import EventStore


async def main(dsn: str, lease_name: str, stream: str) -> None:
    store = await EventStore.connect(dsn, settings={"idle_in_transaction_session_timeout": "2000"})
    lease = await LeaderLease.acquire(store, lease_name)
    assert lease is not None
    print(f"LEADING {lease.epoch}", file=sys.stderr, flush=True)
    n = 0
    while True:
        n += 1
        try:
            await store.append(
                stream, [ExperimentSubmitted(experiment_id=n, config={})], fence=lease.fence
            )
        except FencedError:
            print(f"FENCED {lease.epoch}", file=sys.stderr, flush=True)
            break
        except StoreUnavailableError:
            pass  # paused mid-transaction: the server ended it; the next write meets the fence
        await asyncio.sleep(0.02)
    await lease.release()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
