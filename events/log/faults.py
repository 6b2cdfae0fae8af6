"""Named fault-injection points for fault tests (inert unless ``CAIRN_FAULTS`` is set).

``CAIRN_FAULTS="relay.after_publish=30,store.before_commit=10"`` makes each named point sleep that
many seconds, giving a test a window in which to SIGKILL the process at exactly that point.
"""

from __future__ import annotations

import asyncio
import os
import sys


def _parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, seconds = item.partition("=")
        points[name] = float(seconds or "0")
    return points


_POINTS = _parse(os.environ.get("CAIRN_FAULTS", ""))


async def point(name: str) -> None:
    """Pauses at ``name`` if a fault test asked for it; announces the pause on stderr."""
    delay = _POINTS.get(name)
    if delay is None:
        return
    print(f"FAULT-POINT {name}", file=sys.stderr, flush=True)
    await asyncio.sleep(delay)
