"""Named fault-injection points for fault tests (inert unless ``CAIRN_FAULTS`` is set).

``CAIRN_FAULTS="relay.after_publish=30,store.before_commit=10"`` makes each named point sleep that
many seconds, giving a test a window in which to SIGKILL the process at exactly that point. The
variable is read when a point is reached (:data:`events.settings.FAULTS`), never at import time.
"""

from __future__ import annotations

import asyncio
import sys

from events import settings


async def point(name: str) -> None:
    """Pauses at ``name`` if a fault test asked for it; announces the pause on stderr.

    Raises:
        events.settings.SettingError: ``CAIRN_FAULTS`` is malformed.
    """
    delay = settings.FAULTS.get().get(name)
    if delay is None:
        return
    print(f"FAULT-POINT {name}", file=sys.stderr, flush=True)
    await asyncio.sleep(delay)
