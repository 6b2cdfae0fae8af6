"""Where an unmanaged ``core_v2`` run (a script started outside a trial) reports: the seam.

:func:`backend_for` picks an :class:`UnmanagedBackend` once per ``core_v2.init()``:

- no master configured (no ``client`` given, none of ``CAIRN_MASTER``, ``DET_MASTER``,
  ``DET_MASTER_ADDR`` set): :class:`LocalBackend`, which runs the script on its own, as
  ``cairn.core`` does off-cluster: reports printed, checkpoints in a local directory, and a trial
  named by both external ids resumed from its latest checkpoint by the next run;
- a master: the cluster's unmanaged-run client. It is not built yet; :func:`backend_for` raises
  :class:`UnmanagedNotSupportedError` there, and that one function is where it plugs in.

A backend turns the run's :class:`~cairn.experimental.core_v2.Config` into a started
:class:`cairn.core.Context` (``start``) and is told when the run ends and whether it failed (the
context's ``on_close`` hook). Everything else of ``core_v2`` (the singleton, the config's
defaults, the managed case) is the same for every backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cairn.core import Context, DistributedContext, PreemptMode, TensorboardMode
from cairn.core._context import DEFAULT_LOCAL_STORAGE, _storage_path, local_context
from cairn.core._reporter import LocalReporter
from cairn.errors import CairnError
from events import settings

if TYPE_CHECKING:
    from cairn.experimental.client import Determined
    from cairn.experimental.core_v2 import Config

MASTER_VARIABLES = tuple(s.name for s in settings.MASTERS)
"""Where a master's address is read from (none set: the run is local)."""
LEDGER_DIR = ".unmanaged"
"""Under a local run's checkpoint directory: one small JSON file per external trial id."""


class UnmanagedNotSupportedError(CairnError):
    """A ``core_v2`` run was pointed at a master, and unmanaged runs on a cluster are not built
    yet."""


class UnmanagedBackend(Protocol):
    """What runs an unmanaged trial."""

    def start(
        self,
        config: Config,
        *,
        checkpoint_storage: str | Mapping[str, Any],
        distributed: DistributedContext | None,
        preempt_mode: PreemptMode,
        tensorboard_mode: TensorboardMode,
    ) -> Context:
        """Creates or resumes the run's trial and returns its started context."""
        ...

    def webui_url(self) -> str:
        """Where the run's experiment is shown."""
        ...


def default_storage() -> Path:
    """Where an unmanaged run's checkpoints go when neither ``init()`` nor its config says:
    ``$XDG_DATA_HOME/cairn/checkpoints`` (``~/.local/share/cairn/checkpoints``)."""
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "cairn" / "checkpoints"


def storage_config(storage: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint storage config from Determined's shortcuts: a path or ``file://`` URL is a
    directory, ``s3://bucket/prefix`` an S3 bucket; a mapping is taken as it is.

    Raises:
        ValueError: a URL scheme other than ``file`` and ``s3``.
    """
    if isinstance(storage, Mapping):
        return dict(storage)
    text = os.fspath(storage)
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else text
        return {"type": "directory", "container_path": str(Path(path).expanduser().absolute())}
    if parsed.scheme == "s3":
        config: dict[str, Any] = {"type": "s3", "bucket": parsed.netloc}
        prefix = parsed.path.strip("/")
        if prefix:
            config["prefix"] = prefix
        return config
    raise ValueError(f"checkpoint_storage {text!r}: only paths, file:// and s3:// URLs work")


def master_configured(client: Determined | None) -> bool:
    """Whether the run is pointed at a master (a ``client``, or a master variable set)."""
    return client is not None or any(s.get() for s in settings.MASTERS)


def backend_for(client: Determined | None) -> UnmanagedBackend:
    """The backend of an unmanaged run: local unless a master is configured.

    Raises:
        UnmanagedNotSupportedError: a master is configured (unmanaged runs on a cluster come
            later; this is where their client plugs in).
    """
    if master_configured(client):
        master = (
            client.master
            if client is not None
            else next(value for s in settings.MASTERS if (value := s.get()))
        )
        raise UnmanagedNotSupportedError(
            f"core_v2 outside a trial reports to a master ({master}) in a later cairn; "
            "for now it runs locally when no master is configured (unset "
            f"{', '.join(MASTER_VARIABLES)} and pass no client)"
        )
    return LocalBackend()


class _LedgerReporter(LocalReporter):
    """Prints reports as off-cluster runs do and keeps the latest checkpoint in the ledger."""

    def __init__(self, ledger: Ledger | None) -> None:
        super().__init__()
        self._ledger = ledger

    def submit(self, item: dict[str, Any]) -> None:
        super().submit(item)
        if self._ledger is not None and item.get("kind") == "checkpoint":
            self._ledger.checkpointed(str(item["uuid"]), int(item.get("steps_completed") or 0))


def _quote(text: str) -> str:
    """``text`` as one file name."""
    return urllib.parse.quote(text, safe="") or "_"


class Ledger:
    """A local trial's record, ``<storage>/.unmanaged/<experiment id>/<trial id>.json``: its
    runs, its latest checkpoint and its state (what a master keeps for a cluster's run)."""

    def __init__(self, root: Path, experiment_id: str, trial_id: str) -> None:
        self.path = root / LEDGER_DIR / _quote(experiment_id) / f"{_quote(trial_id)}.json"

    def read(self) -> dict[str, Any]:
        """The record (``{}`` for a new trial)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write(self, data: Mapping[str, Any]) -> None:
        """Replaces the record atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(data), indent=2, sort_keys=True))
        os.replace(tmp, self.path)

    def update(self, **fields: Any) -> None:
        """Sets some fields of the record."""
        self.write({**self.read(), **fields})

    def checkpointed(self, uuid: str, steps_completed: int) -> None:
        """Records a new latest checkpoint."""
        self.update(latest_checkpoint=uuid, steps_completed=steps_completed)


class LocalBackend:
    """An unmanaged run with no master: it runs where it is started, as an off-cluster
    ``cairn.core.init()`` does, and a trial named by both external ids resumes from the latest
    checkpoint its earlier runs saved in the same storage."""

    def __init__(self) -> None:
        self._root: Path | None = None

    def start(
        self,
        config: Config,
        *,
        checkpoint_storage: str | Mapping[str, Any],
        distributed: DistributedContext | None,
        preempt_mode: PreemptMode,
        tensorboard_mode: TensorboardMode,
    ) -> Context:
        """Creates the run's context (a trial named by both external ids resumes).

        Raises:
            ValueError: ``external_trial_id`` without ``external_experiment_id``, or a storage
                shortcut that is not understood.
        """
        if config.external_trial_id and not config.external_experiment_id:
            raise ValueError("external_trial_id needs an external_experiment_id to go with it")
        storage = storage_config(checkpoint_storage)
        dist = distributed or DistributedContext.from_env()
        root = self._root = (
            Path(DEFAULT_LOCAL_STORAGE) if storage.get("type") == "s3" else _storage_path(storage)
        ).absolute()
        ledger = None
        if config.external_experiment_id and config.external_trial_id:
            ledger = Ledger(root, config.external_experiment_id, config.external_trial_id)
        record = ledger.read() if ledger is not None else {}
        latest = str(record.get("latest_checkpoint") or "") or None
        run_id = int(record.get("runs") or 0) + 1
        if dist.size > 1:  # every rank resumes from what the chief read
            latest, run_id = dist.broadcast((latest, run_id))
        chief_ledger = ledger if ledger is not None and dist.is_chief else None
        context = local_context(
            distributed=dist,
            checkpoint_storage=storage,
            preempt_mode=preempt_mode,
            tensorboard_mode=tensorboard_mode,
            hparams=config.hparams,
            reporter=_LedgerReporter(chief_ledger),
            resume=latest,
            run_id=run_id,
            config=config.experiment_config(storage),
        )
        if latest and latest not in {uuid for uuid, _ in context.checkpoint.checkpoints()}:
            context.info = dataclasses.replace(context.info, latest_checkpoint=None)  # deleted
        if chief_ledger is not None:
            chief_ledger.update(runs=run_id, state="RUNNING")

            def ended(failed: bool) -> None:
                with contextlib.suppress(OSError):
                    chief_ledger.update(state="ERROR" if failed else "COMPLETED")

            context.on_close(ended)
        return context

    def webui_url(self) -> str:
        """A local run has no web UI: the ``file://`` URL of its checkpoint directory."""
        root = self._root or default_storage()
        return root.as_uri()
