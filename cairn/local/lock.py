"""One supervisor per data directory, held by an ``flock`` on ``DIR/cluster.lock``.

The lock lives as long as the supervisor's process: the kernel drops it when the process dies,
however it dies, so a crashed supervisor never blocks the next ``cairn up``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from cairn.local.supervisor import ClusterStartError


@contextlib.contextmanager
def supervisor_lock(data_dir: Path) -> Iterator[None]:
    """Holds ``DIR/cluster.lock`` so that only one supervisor runs per data directory.

    Raises:
        ClusterStartError: another supervisor holds it.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "cluster.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise ClusterStartError(f"another supervisor is running on {data_dir}") from exc
        yield
    finally:
        os.close(fd)
