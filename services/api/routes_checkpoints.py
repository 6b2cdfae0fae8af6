"""Checkpoints: describe one (projection ``tr_checkpoints``), download its directory as a
streamed tar.gz, and delete some.

A download sends only what cairn wrote: the checkpoint's storage must be one the cluster config
allows, the checkpoint must carry its marker (:meth:`CheckpointStorage.owned`), and only its
regular files go into the archive, read without following any link.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import queue
import tarfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.authorization import Permission
from events.domain.checkpoint_storage import (
    CheckpointStorage,
    StorageError,
    StorageNotAllowedError,
    open_storage,
    safe_uuid,
)
from events.domain.deciders.checkpoint import DeleteCheckpoints, decide_delete_checkpoints
from events.domain.model_registry import lock_registry, registrations
from events.log.store import Transaction
from services.api import projections_read as pr
from services.api.access import check_experiment, readable_checkpoint
from services.api.auth import principal_of
from services.api.errors import ApiError, forbidden, not_found, parse, read_json
from services.api.experiment_commands import decide_on_experiment
from services.api.inbox import in_transaction
from services.api.routing import USERS, RouteTable, cluster_of, store_of

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


def _archive(storage: CheckpointStorage, uuid: str, out: _Chunks) -> None:
    """Writes the checkpoint's regular files (paths relative to it) as a tar.gz into ``out``."""
    try:
        with tarfile.open(fileobj=out, mode="w|gz") as tar:  # type: ignore[call-overload]
            now = int(time.time())
            for name, size in storage.files(uuid).items():
                try:
                    body = storage.open(uuid, name)
                except FileNotFoundError:
                    continue  # removed (or replaced by a link) since it was listed
                with body:
                    info = tarfile.TarInfo(name)
                    info.size = _size_of(body, size)
                    info.mode = 0o644
                    info.mtime = now
                    tar.addfile(info, body)
        out.flush()
        out.put(None)
    except BaseException as exc:  # handed to the handler, which logs it
        with contextlib.suppress(OSError):
            out.put(exc)


def _size_of(body: Any, listed: int) -> int:
    """The size of an open file (a local one may have changed since it was listed)."""
    try:
        return os.fstat(body.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return listed


@routes.get("/api/v1/checkpoints/{uuid}/download", allow=USERS, raw_response="application/gzip")
async def download_checkpoint(request: web.Request) -> web.StreamResponse:
    """The checkpoint's regular files as a tar.gz (entries relative to its directory); 404 when
    it was deleted, its files are missing or they are not a checkpoint cairn wrote (no marker),
    403 when its storage is one the cluster config does not allow."""
    row, config = await _visible_checkpoint(request)
    uuid = str(row["uuid"])
    if row["state"] != "COMPLETED":
        raise not_found(f"checkpoint {uuid} was deleted")
    if not safe_uuid(uuid):
        raise not_found(f"checkpoint {uuid} has no files")
    try:
        storage = open_storage(
            config.get("checkpoint_storage"),
            request.app[CHECKPOINT_ROOT],
            policy=cluster_of(request).checkpoint_storage,
        )
        present = await asyncio.to_thread(storage.owned, uuid)
    except StorageNotAllowedError as exc:
        message = f"checkpoint {uuid} is in storage the cluster does not allow: {exc}"
        raise forbidden(message) from None
    except StorageError as exc:
        log.warning("checkpoint storage unavailable", uuid=uuid, error=str(exc))
        raise ApiError(503, f"checkpoint storage unavailable: {exc}") from None
    if not present:
        raise not_found(f"checkpoint {uuid} has no files cairn wrote in {storage.location}")
    chunks = _Chunks()
    worker = threading.Thread(
        target=_archive, args=(storage, uuid, chunks), name=f"download-{uuid}", daemon=True
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


MAX_DELETE = 1000
"""Most checkpoints one delete request names."""


class DeleteCheckpointsBody(BaseModel):
    """The checkpoints to delete."""

    model_config = {"extra": "forbid"}

    checkpoint_uuids: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=MAX_DELETE
    )


class DeleteCheckpointsResponse(BaseModel):
    """What the tracker will delete, and what was deleted already."""

    deleting: list[str]
    already_deleted: list[str]


@routes.add(
    "DELETE",
    "/api/v1/checkpoints",
    allow=USERS,
    body=DeleteCheckpointsBody,
    response=DeleteCheckpointsResponse,
)
async def delete_checkpoints(request: web.Request) -> web.Response:
    """Asks the tracker to delete checkpoints of ended experiments (their owner or an admin;
    404 for an unknown uuid, 409 while its experiment runs: a trial restarts from them, and
    409 naming the model and version for one registered as a model version)."""
    principal = principal_of(request)
    body = parse(DeleteCheckpointsBody, await read_json(request))
    by_experiment: dict[int, list[str]] = {}
    already: list[str] = []
    for uuid in dict.fromkeys(body.checkpoint_uuids):
        row, view = await readable_checkpoint(request, uuid)
        await check_experiment(store_of(request), principal, view, Permission.UPDATE_EXPERIMENT)
        if row["state"] == "DELETED":
            already.append(uuid)
        else:
            by_experiment.setdefault(view.experiment_id, []).append(uuid)

    async def work(tx: Transaction) -> list[str]:
        # Under the registry lock: none of them can be registered between this read and the
        # commit (events.domain.model_registry).
        await lock_registry(tx)
        kept: dict[str, list[str]] = {}
        for found in await registrations(
            tx, uuids=[u for us in by_experiment.values() for u in us]
        ):
            kept.setdefault(found.checkpoint_uuid, []).append(found.describe())
        deleting: list[str] = []
        for experiment_id, uuids in sorted(by_experiment.items()):
            command = DeleteCheckpoints(
                uuids=tuple(uuids),
                actor=principal.name,
                registered=tuple(d for u in uuids for d in kept.get(u, ())),
            )
            await decide_on_experiment(
                tx,
                principal,
                experiment_id,
                functools.partial(decide_delete_checkpoints, command=command),
            )
            deleting.extend(uuids)
        return deleting

    deleting = await in_transaction(store_of(request), work) if by_experiment else []
    if deleting:
        log.info("checkpoints to delete", count=len(deleting), by=principal.name)
    return web.json_response({"deleting": deleting, "already_deleted": already})
