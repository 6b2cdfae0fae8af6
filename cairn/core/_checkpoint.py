"""Checkpoints on a shared file system or in an S3 bucket (mirrors ``det.core.CheckpointContext``).

A checkpoint is the directory ``<root>/<uuid>/`` holding the user's files plus ``metadata.json``.
The root is ``CAIRN_CHECKPOINT_DIR`` on a cluster (a shared_fs/directory storage every agent
mounts) or a local directory off-cluster. With ``checkpoint_storage: {type: s3}`` the files are
objects ``<prefix>/<uuid>/<file>`` instead: a checkpoint is written into a local scratch
directory and uploaded when complete (``metadata.json`` last), and read back by downloading.
When a checkpoint is complete the chief writes cairn's marker (``.cairn-checkpoint``, naming the
uuid; it is not among the checkpoint's files) and reports it (``kind: checkpoint`` with
``resources`` = {relative path: bytes}). On a cluster each new checkpoint's uuid is issued by the
API (``POST /trials/{id}/checkpoint-ids``), which accepts reports only under uuids it issued;
off-cluster it is a random UUID.

Sharded checkpoints (``shard=True``) are a collective: every rank calls, the chief's uuid is
broadcast, each rank contributes its files, and the ranks' metadata dicts are merged. A file two
ranks contribute with different contents, or a metadata key they give different values, fails
the upload on every rank; the chief alone reports the merged checkpoint.
"""

from __future__ import annotations

import contextlib
import enum
import fnmatch
import json
import logging
import os
import shutil
import tempfile
import uuid as uuidlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cairn.core._checkpoint_files import (
    Selector,
    checked_metadata,
    copy_files,
    file_digest,
    file_sizes,
    merge_metadata,
)
from cairn.core._distributed import DistributedContext
from cairn.core._reporter import Reporter
from events.domain.checkpoint_storage import MARKER_FILE, CheckpointStorage, marker_bytes
from events.log.errors import EventsError

log = logging.getLogger("cairn.core")

METADATA_FILE = "metadata.json"

NewUuid = Callable[[], str]
"""Gives the uuid of a new checkpoint."""


def random_uuid() -> str:
    """A new random checkpoint uuid (off-cluster)."""
    return str(uuidlib.uuid4())


class DownloadMode(enum.Enum):
    """How the ranks of one machine fetch a checkpoint they all restore.

    Checkpoints live on storage every agent mounts, so without a selector both modes read the
    checkpoint in place; with a selector each rank gets its own copy of the files it selected.

    Attributes:
        LocalWorkersShareDownload: the local chief fetches, the other local ranks share it.
        NoSharedDownload: every rank fetches on its own.
    """

    LocalWorkersShareDownload = "LOCAL_WORKERS_SHARE_DOWNLOAD"
    NoSharedDownload = "NO_SHARED_DOWNLOAD"


class CheckpointContext:
    """Stores, restores, lists and deletes checkpoints under one storage root.

    Args:
        root: the storage root (created on first use); with a remote ``storage``, a local
            directory for what is not a checkpoint (TensorBoard files).
        reporter: where completed checkpoints are reported.
        distributed: this process's rank (only the chief stores unsharded checkpoints).
        run_id: the trial run the checkpoints belong to.
        storage: a storage that is not a mounted directory (an S3 bucket); ``None``: ``root``.
        new_uuid: gives each new checkpoint's uuid (the chief calls it; on a cluster it asks
            the API); default: a random UUID.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        reporter: Reporter,
        distributed: DistributedContext,
        run_id: int,
        storage: CheckpointStorage | None = None,
        *,
        new_uuid: NewUuid = random_uuid,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self._reporter = reporter
        self._distributed = distributed
        self._run_id = run_id
        self._remote = storage if storage is not None and storage.local_root() is None else None
        self._new_uuid = new_uuid

    def _issue_uuid(self, *, collective: bool) -> str:
        """A new checkpoint's uuid: the chief's, broadcast to every rank when ``collective``.

        Raises:
            RuntimeError: no uuid could be had (on every rank of a collective alike, so none is
                left waiting in it).
        """
        if not collective:
            return self._new_uuid()
        dist = self._distributed
        mine, failure = "", ""
        if dist.is_chief:
            try:
                mine = self._new_uuid()
            except RuntimeError as exc:
                failure = str(exc)
        mine, failure = dist.broadcast((mine, failure))
        if failure:
            raise RuntimeError(failure)
        return str(mine)

    @property
    def location(self) -> str:
        """Where the checkpoints are (a directory, or ``s3://bucket/prefix``)."""
        return self._remote.location if self._remote is not None else str(self.root)

    def _remote_files(self, storage_id: str) -> dict[str, int]:
        assert self._remote is not None
        self._path(storage_id)  # refuses what is not a checkpoint id
        files = self._remote.files(storage_id)
        if not files:
            raise FileNotFoundError(f"checkpoint {storage_id} not found in {self.location}")
        return files

    def _path(self, storage_id: str) -> Path:
        name = str(storage_id)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a checkpoint id: {storage_id!r}")
        return self.root / name

    @property
    def distributed(self) -> DistributedContext:
        """The rank of this process."""
        return self._distributed

    def _complete(
        self,
        path: Path,
        storage_id: str,
        meta: dict[str, Any],
        uploaded: Mapping[str, int] | None = None,
    ) -> None:
        """Writes cairn's marker, then ``metadata.json`` (last: it marks the checkpoint
        complete), and reports it.

        ``uploaded`` lists the files already in remote storage; ``None``: the storage is the
        directory ``path``.
        """
        text = json.dumps(meta, indent=2, sort_keys=True)
        if self._remote is not None and uploaded is not None:
            data = text.encode()
            self._remote.put_bytes(storage_id, MARKER_FILE, marker_bytes(storage_id))
            self._remote.put_bytes(storage_id, METADATA_FILE, data)
            resources = dict(sorted({**uploaded, METADATA_FILE: len(data)}.items()))
        else:
            (path / MARKER_FILE).write_bytes(marker_bytes(storage_id))
            (path / METADATA_FILE).write_text(text)
            resources = file_sizes(path)
        self._reporter.submit(
            {
                "kind": "checkpoint",
                "uuid": storage_id,
                "steps_completed": meta["steps_completed"],
                "resources": resources,
                "metadata": meta,
                "run_id": self._run_id,
            }
        )

    def _merged(self, metadata: Mapping[str, Any] | None) -> dict[str, Any]:
        """Every rank's metadata merged and checked (a collective: all ranks call)."""
        return checked_metadata(merge_metadata(self._distributed.allgather(dict(metadata or {}))))

    @contextlib.contextmanager
    def store_path(
        self, metadata: Mapping[str, Any] | None = None, *, shard: bool = False
    ) -> Iterator[tuple[Path, str]]:
        """Yields ``(directory, uuid)`` to write a checkpoint into; reports it on exit.

        Args:
            metadata: JSON-serialisable dict; must contain ``steps_completed`` (with
                ``shard=True``: the ranks' dicts merged must).
            shard: every rank calls and writes its own files into the same directory.

        Raises:
            ValueError: ``metadata`` lacks ``steps_completed``.
            RuntimeError: a non-chief rank called without ``shard=True``, or ranks gave one
                metadata key different values.
        """
        dist = self._distributed
        if not shard and not dist.is_chief:
            raise RuntimeError("only the chief (rank 0) stores a checkpoint unless shard=True")
        meta = self._merged(metadata) if shard else checked_metadata(metadata)
        storage_id = self._issue_uuid(collective=shard)
        if self._remote is not None:
            yield from self._store_remote(storage_id, meta, shard)
            return
        path = self._path(storage_id)
        path.mkdir(parents=True, exist_ok=shard)
        try:
            yield path, storage_id
        except BaseException:
            if dist.is_chief:
                shutil.rmtree(path, ignore_errors=True)
            raise
        if shard:
            dist.allgather(None)  # every rank has finished writing
        if dist.is_chief:
            self._complete(path, storage_id, meta)

    def _store_remote(
        self, storage_id: str, meta: dict[str, Any], shard: bool
    ) -> Iterator[tuple[Path, str]]:
        """``store_path`` for remote storage: each rank writes into its own scratch directory
        and uploads its files; the chief adds ``metadata.json`` once every rank has."""
        assert self._remote is not None
        dist = self._distributed
        scratch = Path(tempfile.mkdtemp(prefix=f"cairn-store-{storage_id}-"))
        try:
            yield scratch, storage_id
            mine = {k: v for k, v in file_sizes(scratch).items() if k != METADATA_FILE}
            failed = ""
            try:
                self._remote.upload(scratch, storage_id, list(mine))
            except (OSError, EventsError) as exc:
                failed = f"rank {dist.rank}: {exc}"
            everyone: list[Any] = dist.allgather((mine, failed)) if shard else [(mine, failed)]
            failures = [f for _, f in everyone if f]
            if failures:
                if dist.is_chief:
                    self._remote.delete(storage_id)
                raise RuntimeError(f"checkpoint upload failed: {'; '.join(failures)}")
            if dist.is_chief:
                uploaded: dict[str, int] = {}
                for files, _ in everyone:
                    uploaded.update(files)
                self._complete(scratch, storage_id, meta, uploaded)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    @contextlib.contextmanager
    def restore_path(
        self,
        storage_id: str,
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> Iterator[Path]:
        """Yields the directory of checkpoint ``storage_id`` (read it; do not modify it).

        Without a selector that is the checkpoint itself, in storage. With one it is a temporary
        directory holding only the selected files, removed when the block ends.

        Args:
            storage_id: the checkpoint's uuid.
            download_mode: see :class:`DownloadMode`.
            selector: keeps the files (by relative path) to restore.

        Raises:
            FileNotFoundError: no such checkpoint.
            ValueError: ``download_mode`` is not a :class:`DownloadMode`.
        """
        DownloadMode(download_mode)
        if self._remote is not None:
            files = self._remote_files(storage_id)
            with tempfile.TemporaryDirectory(prefix=f"cairn-restore-{storage_id}-") as scratch:
                keep = [n for n in files if selector is None or selector(n)]
                self._remote.download(storage_id, Path(scratch), keep)
                yield Path(scratch)
            return
        path = self._path(storage_id)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {storage_id} not found under {self.root}")
        if selector is None:
            yield path
            return
        with tempfile.TemporaryDirectory(prefix=f"cairn-restore-{storage_id}-") as scratch:
            copy_files(path, Path(scratch), list(file_sizes(path, selector)))
            yield Path(scratch)

    def upload(
        self,
        ckpt_dir: str | os.PathLike[str] | None,
        metadata: Mapping[str, Any] | None = None,
        *,
        shard: bool = False,
        selector: Selector | None = None,
    ) -> str:
        """Copies ``ckpt_dir`` (its name is not kept) into storage as a new checkpoint and
        reports it.

        With ``shard=False`` only the chief calls. With ``shard=True`` every rank calls (ranks
        with nothing to give pass ``ckpt_dir=None``); the checkpoint holds the union of their
        files. Ranks sharing one directory without a selector upload it once; a file given by
        several ranks must have the same contents everywhere.

        Args:
            ckpt_dir: the directory to upload.
            metadata: JSON-serialisable dict with ``steps_completed`` (merged across ranks when
                sharded).
            shard: whether this is a collective upload of every rank's files.
            selector: keeps the files (by relative path) to upload.

        Returns:
            The new checkpoint's uuid (the same on every rank).

        Raises:
            ValueError: the (merged) metadata lacks ``steps_completed``.
            RuntimeError: a worker called with ``shard=False``; no rank gave a directory; ranks
                gave conflicting files or metadata.
        """
        dist = self._distributed
        source = None if ckpt_dir is None else Path(ckpt_dir)
        if not shard:
            if not dist.is_chief:
                raise RuntimeError(
                    f"only the chief uploads a checkpoint unless shard=True (rank {dist.rank})"
                )
            if source is None:
                raise RuntimeError("upload(ckpt_dir=None, shard=False) would upload nothing")
            meta = checked_metadata(metadata)
            names = [n for n in file_sizes(source, selector) if n != METADATA_FILE]
            storage_id = self._issue_uuid(collective=False)
            if self._remote is not None:
                try:
                    self._remote.upload(source, storage_id, names)
                    sizes = file_sizes(source, selector)
                    uploaded = {n: sizes[n] for n in names}
                    self._complete(source, storage_id, meta, uploaded)
                except BaseException:
                    with contextlib.suppress(OSError, EventsError):
                        self._remote.delete(storage_id)
                    raise
                return storage_id
            path = self._path(storage_id)
            path.mkdir(parents=True)
            try:
                copy_files(source, path, names)
                self._complete(path, storage_id, meta)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
            return storage_id
        return self._upload_sharded(source, metadata, selector)

    def _upload_sharded(
        self, source: Path | None, metadata: Mapping[str, Any] | None, selector: Selector | None
    ) -> str:
        # Every decision below is taken from allgathered data, so all ranks take it alike and
        # raise alike: a rank that raised alone would leave the others waiting in a collective.
        dist = self._distributed
        if selector is not None and source is None:
            raise RuntimeError("a selector needs a ckpt_dir")
        storage_id = self._issue_uuid(collective=True)
        ident = None
        if source is not None:
            stat = source.stat()
            ident = (stat.st_dev, stat.st_ino)
        idents = dist.allgather(ident)
        if all(i is None for i in idents):
            raise RuntimeError("upload(shard=True): every rank passed ckpt_dir=None")
        uploads = source is not None and (selector is not None or idents.index(ident) == dist.rank)
        mine: dict[str, int] = {}
        if uploads:
            assert source is not None
            mine = {k: v for k, v in file_sizes(source, selector).items() if k != METADATA_FILE}
        everyone: list[dict[str, int]] = dist.allgather(mine)
        givers: dict[str, list[int]] = {}
        for rank, files in enumerate(everyone):
            for name in files:
                givers.setdefault(name, []).append(rank)
        shared = sorted(name for name, ranks in givers.items() if len(ranks) > 1)
        digests = (
            {name: file_digest(source / name) for name in shared if name in mine} if source else {}
        )
        all_digests: list[dict[str, str]] = dist.allgather(digests)
        conflicts = {
            name: givers[name]
            for name in shared
            if len({d[name] for d in all_digests if name in d}) > 1
        }
        if conflicts:
            detail = "; ".join(f"{n} given by ranks {r}" for n, r in sorted(conflicts.items()))
            raise RuntimeError(
                f"refusing to upload a sharded checkpoint with conflicting files: {detail}"
            )
        meta = self._merged(metadata)
        path = self._path(storage_id)
        remote = self._remote
        if dist.is_chief and remote is None:
            path.mkdir(parents=True)
        dist.allgather(None)  # the directory exists
        mine_to_copy = [n for n in mine if min(givers[n]) == dist.rank]
        failed = ""
        if source is not None:
            try:
                if remote is not None:
                    remote.upload(source, storage_id, mine_to_copy)
                else:
                    copy_files(source, path, mine_to_copy)
            except (OSError, EventsError) as exc:
                failed = f"rank {dist.rank}: {exc}"
        failures = [f for f in dist.allgather(failed) if f]
        if failures:
            if dist.is_chief:
                if remote is not None:
                    with contextlib.suppress(OSError, EventsError):
                        remote.delete(storage_id)
                else:
                    shutil.rmtree(path, ignore_errors=True)
            raise RuntimeError(f"sharded checkpoint upload failed: {'; '.join(failures)}")
        if dist.is_chief:
            uploaded: dict[str, int] = {}
            for files in everyone:
                uploaded.update(files)
            self._complete(path, storage_id, meta, uploaded if remote is not None else None)
        return storage_id

    def download(
        self,
        storage_id: str,
        ckpt_dir: str | os.PathLike[str],
        download_mode: DownloadMode = DownloadMode.LocalWorkersShareDownload,
        *,
        selector: Selector | None = None,
    ) -> None:
        """Copies checkpoint ``storage_id`` (or the files ``selector`` keeps) into ``ckpt_dir``
        (created if missing).

        Args:
            storage_id: the checkpoint's uuid.
            ckpt_dir: the destination directory.
            download_mode: see :class:`DownloadMode`.
            selector: keeps the files (by relative path) to download.

        Raises:
            FileNotFoundError: no such checkpoint.
        """
        DownloadMode(download_mode)
        target = Path(ckpt_dir)
        if self._remote is not None:
            files = self._remote_files(storage_id)
            target.mkdir(parents=True, exist_ok=True)
            keep = [n for n in files if selector is None or selector(n)]
            self._remote.download(storage_id, target, keep)
            return
        path = self._path(storage_id)
        if not path.is_dir():
            raise FileNotFoundError(f"checkpoint {storage_id} not found under {self.root}")
        target.mkdir(parents=True, exist_ok=True)
        copy_files(path, target, list(file_sizes(path, selector)))

    def get_metadata(self, storage_id: str) -> dict[str, Any]:
        """The ``metadata.json`` of checkpoint ``storage_id``."""
        if self._remote is not None:
            self._path(storage_id)
            loaded: dict[str, Any] = json.loads(self._remote.read_bytes(storage_id, METADATA_FILE))
            return loaded
        with self.restore_path(storage_id) as path:
            data: dict[str, Any] = json.loads((path / METADATA_FILE).read_text())
            return data

    def delete(self, storage_id: str, globs: Sequence[str] | None = None) -> None:
        """Removes checkpoint ``storage_id`` from storage, or only its files matching ``globs``
        (chief only; a missing checkpoint or file is fine).

        Args:
            storage_id: the checkpoint's uuid.
            globs: ``fnmatch`` patterns over relative paths (``"*.pt"``, ``"optimizer/*"``);
                ``None`` removes the whole checkpoint.
        """
        if not self._distributed.is_chief:
            return
        path = self._path(storage_id)
        if isinstance(globs, str):
            globs = [globs]
        if self._remote is not None:
            if globs is None:
                self._remote.delete(storage_id)
                return
            doomed = [
                name
                for name in self._remote.files(storage_id)
                if name != METADATA_FILE and any(fnmatch.fnmatchcase(name, g) for g in globs)
            ]
            if doomed:
                self._remote.delete(storage_id, doomed)
            return
        if globs is None:
            shutil.rmtree(path, ignore_errors=True)
            return
        if not path.is_dir():
            return
        for name in file_sizes(path):
            if name != METADATA_FILE and any(fnmatch.fnmatchcase(name, g) for g in globs):
                (path / name).unlink(missing_ok=True)

    def checkpoints(self) -> list[tuple[str, dict[str, Any]]]:
        """Complete checkpoints under the root as ``(uuid, metadata)``, oldest step first."""
        found: list[tuple[int, float, str, dict[str, Any]]] = []
        if self._remote is not None:
            for name in self._remote.uuids():
                try:
                    meta = json.loads(self._remote.read_bytes(name, METADATA_FILE))
                    found.append((int(meta.get("steps_completed", 0)), 0.0, name, meta))
                except (FileNotFoundError, ValueError, TypeError, AttributeError):
                    continue
            found.sort(key=lambda f: f[0])
            return [(name, meta) for _, _, name, meta in found]
        if not self.root.is_dir():
            return []
        for child in self.root.iterdir():
            meta_file = child / METADATA_FILE
            try:
                meta = json.loads(meta_file.read_text())
                found.append(
                    (
                        int(meta.get("steps_completed", 0)),
                        meta_file.stat().st_mtime,
                        child.name,
                        meta,
                    )
                )
            except (OSError, ValueError, TypeError, AttributeError):
                continue
        found.sort(key=lambda f: (f[0], f[1]))
        return [(name, meta) for _, _, name, meta in found]

    def latest(self) -> str | None:
        """The uuid of the checkpoint with the most steps (newest on a tie), or ``None``."""
        listed = self.checkpoints()
        return listed[-1][0] if listed else None
