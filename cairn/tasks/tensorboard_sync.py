"""Copying trials' TensorBoard files from their storage into the local logdir TensorBoard reads.

Each trial's files land under ``<logdir>/trial_<trial id>/`` with their layout below the
trial's storage directory kept, so TensorBoard names its runs by trial. A sync copies what is
new and what grew since the last one; it is run again every few seconds while the server runs.

Invariants a change must keep:

- A file TensorBoard may be reading is only ever appended to. TensorBoard keeps an event file
  open and reads on from where it stopped, so a grown file gets only the bytes past the local
  copy's end appended (event files are append-only: the Core API copies them whole at each
  upload, and a trial's file only grows), and one of the same size is left as it is. A new
  file, or one that shrank, is written under a temporary name and renamed into place, so no
  half file is ever seen.
- Nothing is written outside the logdir (and its staging directory beside it): a name from storage that is not a plain relative path
  (``..``, absolute, empty parts) is skipped, and symbolic links in a directory are not followed.
- One failing source (storage unreachable, a file that vanished) is logged and retried at the
  next sync; it never stops the others or the server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cairn.tasks.tensorboard_sources import TensorboardSourceFile
from events.domain.checkpoint_storage import S3Storage, StorageError
from events.domain.checkpoint_storage.base import safe_name
from events.domain.config.storage import tensorboard_experiment_dir

log = logging.getLogger("cairn.tasks.tensorboard")

Stamp = tuple[int, str]
"""A file's size and version (a modification time, an ETag): what tells a change."""


class TrialFiles(Protocol):
    """Where one experiment's trials' TensorBoard files are."""

    @property
    def location(self) -> str:
        """Where, for messages."""

    def listing(self) -> dict[str, Stamp]:
        """Every file as ``{"<trial id>/<relative path>": (bytes, version)}``."""

    def read(self, name: str, offset: int) -> bytes:
        """The file ``name`` (as listed) from byte ``offset`` to its end."""


class DirectoryTrialFiles:
    """An experiment's TensorBoard directory on a file system (``<dir>/trial/<id>/...``).

    Args:
        directory: the experiment's TensorBoard directory.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def location(self) -> str:
        """The directory."""
        return str(self.directory)

    def listing(self) -> dict[str, Stamp]:
        """Regular files under ``trial/``, symbolic links not followed."""
        base = self.directory / "trial"
        out: dict[str, Stamp] = {}
        if not base.is_dir():
            return out
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
            for name in files:
                path = Path(dirpath) / name
                try:
                    stat = path.lstat()
                except OSError:
                    continue
                if not path.is_file() or path.is_symlink():
                    continue
                out[path.relative_to(base).as_posix()] = (stat.st_size, str(stat.st_mtime_ns))
        return out

    def read(self, name: str, offset: int) -> bytes:
        """Reads the file from ``offset``."""
        with (self.directory / "trial" / name).open("rb") as body:
            body.seek(offset)
            return body.read()


class S3TrialFiles:
    """An experiment's TensorBoard files in a bucket (``<prefix>/tensorboard/experiment/<id>/
    trial/<id>/...``).

    Args:
        storage: the experiment's S3 storage.
        experiment_id: the experiment.
    """

    def __init__(self, storage: S3Storage, experiment_id: int) -> None:
        self.storage = storage
        self.base = (tensorboard_experiment_dir(experiment_id) / "trial").as_posix()

    @property
    def location(self) -> str:
        """``s3://bucket/prefix/tensorboard/experiment/<id>/trial``."""
        return f"{self.storage.location}/{self.base}"

    def listing(self) -> dict[str, Stamp]:
        """The objects under the experiment's ``trial/``."""
        return self.storage.tree(self.base)

    def read(self, name: str, offset: int) -> bytes:
        """Reads the object from ``offset``."""
        return self.storage.read_from(f"{self.base}/{name}", offset)


def open_s3(config: Mapping[str, Any]) -> S3Storage:
    """The storage of an experiment's S3 ``checkpoint_storage``."""
    return S3Storage.from_config(config)


@dataclass
class SyncReport:
    """What one sync did."""

    created: list[Path] = field(default_factory=list)
    appended: list[Path] = field(default_factory=list)
    replaced: list[Path] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    """The sources (their locations) that could not be read, with why."""


@dataclass
class _Source:
    config: TensorboardSourceFile
    trial_ids: frozenset[int] | None
    files: TrialFiles | None
    problem: str = ""

    @property
    def experiment_id(self) -> int:
        return self.config.experiment_id


class TensorboardSync:
    """Keeps ``logdir`` a copy of the TensorBoard files of ``sources``.

    Args:
        sources: the experiments and trials to copy (the sources file's).
        logdir: the directory TensorBoard reads.
        s3: opens an S3 storage from its config (a test may give its own).
    """

    def __init__(
        self,
        sources: list[TensorboardSourceFile],
        logdir: Path,
        *,
        s3: Callable[[Mapping[str, Any]], S3Storage] = open_s3,
    ) -> None:
        self.logdir = logdir
        self.staging = logdir.parent / f".{logdir.name}.staging"
        """Where a file is written before it is renamed into the logdir (outside it, so
        TensorBoard never reads half a file)."""
        self._open_s3 = s3
        self._seen: dict[Path, Stamp] = {}
        self._sources = [
            _Source(s, None if s.trial_ids is None else frozenset(s.trial_ids), None)
            for s in sources
        ]

    def _files(self, source: _Source) -> TrialFiles:
        if source.files is None:
            config = source.config
            if config.s3 is not None:
                source.files = S3TrialFiles(self._open_s3(config.s3), source.experiment_id)
            elif config.directory is not None:
                source.files = DirectoryTrialFiles(Path(config.directory))
            else:
                raise ValueError(f"experiment {source.experiment_id}: no directory and no s3")
        return source.files

    def sync(self) -> SyncReport:
        """Copies every new or grown file of every source (see the module's invariants)."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        report = SyncReport()
        for source in self._sources:
            try:
                files = self._files(source)
                listing = files.listing()
                for name, stamp in sorted(listing.items()):
                    self._copy(source, files, name, stamp, report)
            except (OSError, StorageError, ValueError) as exc:
                where = f"experiment {source.experiment_id}"
                if source.files is not None:
                    where += f" ({source.files.location})"
                problem = f"{where}: {exc}"
                report.failed.append(problem)
                if problem != source.problem:
                    log.warning("cannot read TensorBoard files of %s", problem)
                source.problem = problem
            else:
                source.problem = ""
        return report

    def _copy(
        self, source: _Source, files: TrialFiles, name: str, stamp: Stamp, report: SyncReport
    ) -> None:
        trial, _, relative = name.partition("/")
        if not trial.isdigit() or not safe_name(relative) or not safe_name(name):
            return
        if any(part.startswith(".") for part in relative.split("/")):
            return  # an upload in progress (the Core API's ``.<name>.<pid>.partial``)
        if source.trial_ids is not None and int(trial) not in source.trial_ids:
            return
        target = self.logdir / f"trial_{int(trial)}" / relative
        if self._seen.get(target) == stamp:
            return
        try:
            local: int | None = target.stat().st_size if target in self._seen else None
        except FileNotFoundError:
            local = None
        size = stamp[0]
        try:
            if local is not None and size == local:
                pass  # append-only: nothing new (the version moved with a same-size copy)
            elif local is not None and size > local:
                data = files.read(name, local)
                with target.open("ab") as out:
                    out.write(data)
                report.appended.append(target)
            else:
                data = files.read(name, 0)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.staging.mkdir(parents=True, exist_ok=True)
                partial = self.staging / f"{len(self._seen)}.partial"
                partial.write_bytes(data)
                os.replace(partial, target)
                (report.replaced if local is not None else report.created).append(target)
        except FileNotFoundError:
            return  # gone since it was listed: the next listing says what is there
        self._seen[target] = stamp
