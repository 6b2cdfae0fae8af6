"""Checkpoints: describe one (projection ``tr_checkpoints``) and download its directory as a
streamed tar.gz."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import tarfile
import threading
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web

from events.config.storage import checkpoint_root
from services.api import projections_read as pr
from services.api.access import readable_checkpoint
from services.api.errors import not_found
from services.api.routing import USERS, RouteTable

log = structlog.get_logger("api")
routes = RouteTable("checkpoints")

CHECKPOINT_ROOT = web.AppKey("cairn_checkpoint_root", Path)
"""The cluster's default checkpoint root (for experiments without ``checkpoint_storage``)."""

CHUNK_BYTES = 1 << 20
QUEUE_CHUNKS = 8


async def _visible_checkpoint(request: web.Request) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint of the path and its experiment's config; 404 unknown, 403 another user's."""
    row, view = await readable_checkpoint(request, request.match_info["uuid"])
    return row, view.config


@routes.get("/api/v1/checkpoints/{uuid}", allow=USERS, response=pr.Checkpoint)
async def get_checkpoint(request: web.Request) -> web.Response:
    """One checkpoint with its validation and searcher metric."""
    row, _ = await _visible_checkpoint(request)
    return web.json_response(row)


class _Chunks:
    """A write-only file handed to :mod:`tarfile` in a worker thread; its chunks go to a
    bounded queue the handler drains (so a slow client slows the archiving down)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[bytes | BaseException | None] = queue.Queue(QUEUE_CHUNKS)
        self.cancelled = threading.Event()
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        """Buffers ``data``; a full chunk goes to the queue."""
        self._buffer += data
        if len(self._buffer) >= CHUNK_BYTES:
            self.flush()
        return len(data)

    def flush(self) -> None:
        """Queues what is buffered."""
        if self._buffer:
            self.put(bytes(self._buffer))
            self._buffer.clear()

    def put(self, item: bytes | BaseException | None) -> None:
        """Queues a chunk, the end (``None``) or a failure, waiting while the queue is full.

        Raises:
            OSError: the download was abandoned.
        """
        while True:
            if self.cancelled.is_set():
                raise OSError("download cancelled")
            try:
                self.queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue


def _archive(directory: Path, out: _Chunks) -> None:
    """Writes ``directory``'s contents (paths relative to it) as a tar.gz into ``out``."""
    try:
        with tarfile.open(fileobj=out, mode="w|gz") as tar:  # type: ignore[call-overload]
            for child in sorted(directory.iterdir()):
                tar.add(child, arcname=child.name)
        out.flush()
        out.put(None)
    except BaseException as exc:  # handed to the handler, which logs it
        with contextlib.suppress(OSError):
            out.put(exc)


@routes.get("/api/v1/checkpoints/{uuid}/download", allow=USERS, raw_response="application/gzip")
async def download_checkpoint(request: web.Request) -> web.StreamResponse:
    """The checkpoint's directory as a tar.gz (entries relative to the directory); 404 when it
    was deleted or its files are missing."""
    row, config = await _visible_checkpoint(request)
    uuid = str(row["uuid"])
    if row["state"] != "COMPLETED":
        raise not_found(f"checkpoint {uuid} was deleted")
    root = checkpoint_root(config.get("checkpoint_storage"), request.app[CHECKPOINT_ROOT])
    directory = root / uuid
    if Path(uuid).name != uuid or uuid in (".", "..") or not directory.is_dir():
        raise not_found(f"checkpoint {uuid} has no files at {directory}")
    chunks = _Chunks()
    worker = threading.Thread(
        target=_archive, args=(directory, chunks), name=f"download-{uuid}", daemon=True
    )
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/gzip",
            "Content-Disposition": f'attachment; filename="{uuid}.tar.gz"',
        }
    )
    await response.prepare(request)
    worker.start()
    try:
        while True:
            try:
                item = await asyncio.to_thread(chunks.queue.get, True, 0.5)
            except queue.Empty:
                if worker.is_alive():
                    continue
                try:
                    item = chunks.queue.get_nowait()
                except queue.Empty:
                    item = OSError("archiver ended without finishing")
            if item is None:
                await response.write_eof()
                break
            if isinstance(item, BaseException):
                log.warning("checkpoint download failed", uuid=uuid, error=str(item))
                if request.transport is not None:
                    request.transport.close()
                break
            await response.write(item)
    except ConnectionResetError:
        log.debug("checkpoint download abandoned", uuid=uuid)
    finally:
        chunks.cancelled.set()
    return response
