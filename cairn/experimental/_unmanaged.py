"""Where an unmanaged ``core_v2`` run (a script started outside a trial) reports: the seam.

:func:`backend_for` picks an :class:`UnmanagedBackend` once per ``core_v2.init()``:

- no master configured (no ``client`` given, none of ``CAIRN_MASTER``, ``DET_MASTER``,
  ``DET_MASTER_ADDR`` set): :class:`LocalBackend`, which runs the script on its own, as
  ``cairn.core`` does off-cluster: reports printed, checkpoints in a local directory, and a trial
  named by both external ids resumed from its latest checkpoint by the next run;
- a master: :class:`ClusterBackend`, which reports to it as the user logged in there (the
  CLI's stored login, or ``CAIRN_USER``/``DET_USER`` and their passwords; see
  :mod:`cairn.auth`). The master creates (once per user, ``external_experiment_id`` and
  ``external_trial_id``) an unmanaged experiment and trial and opens the trial's next run
  (``POST /api/v1/unmanaged/trials``); the run reports metrics and checkpoints with its own trial
  token as a managed trial does, ships its stdout and stderr as the run's logs
  (:mod:`cairn.experimental._log_shipper`), sends heartbeats while it lives, and is closed COMPLETED or
  ERROR when the context closes (``core_v2.close()`` or process exit). A script killed outright
  is ended ERROR by the master once its heartbeats stop (the cluster config's
  ``unmanaged.heartbeat_timeout``). Under a launcher only the chief (rank 0) talks to the master;
  the other ranks get its answer through the :class:`DistributedContext` and report nothing.

A backend turns the run's :class:`~cairn.experimental.core_v2.Config` into a started
:class:`cairn.core.Context` (``start``) and is told when the run ends and whether it failed (the
context's ``on_close`` hook). Everything else of ``core_v2`` (the singleton, the config's
defaults, the managed case) is the same for every backend.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import json
import os
import threading
import urllib.parse
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cairn.core import Context, DistributedContext, PreemptMode, TensorboardMode
from cairn.core._context import (
    DEFAULT_LOCAL_STORAGE,
    _storage_path,
    cluster_context,
    local_context,
)
from cairn.core._http import HTTPStatusError, Session
from cairn.core._info import ClusterInfo, TrialInfo
from cairn.core._reporter import LocalReporter
from cairn.errors import CairnError
from cairn.experimental._log_shipper import LogShipper
from events import settings

if TYPE_CHECKING:
    from cairn.client import Client
    from cairn.experimental.client import Determined
    from cairn.experimental.core_v2 import Config

MASTER_VARIABLES = tuple(s.name for s in settings.MASTERS)
"""Where a master's address is read from (none set: the run is local)."""
LEDGER_DIR = ".unmanaged"
"""Under a local run's checkpoint directory: one small JSON file per external trial id."""


class UnmanagedNotSupportedError(CairnError):
    """Kept for scripts that catch it: raised by cairn versions that ran ``core_v2`` only
    locally, when a master was configured. Nothing raises it now."""


@dataclasses.dataclass(frozen=True)
class RunStart:
    """What :meth:`UnmanagedBackend.start` resolved for a backend to start the run with.

    Attributes:
        config: the run's description.
        storage: the checkpoint storage config.
        distributed: this process's rank and size.
        preempt_mode: see :class:`cairn.core.PreemptMode`.
        tensorboard_mode: see :class:`cairn.core.TensorboardMode`.
    """

    config: Config
    storage: dict[str, Any]
    distributed: DistributedContext
    preempt_mode: PreemptMode
    tensorboard_mode: TensorboardMode


class UnmanagedBackend(abc.ABC):
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
        """Creates or resumes the run's trial and returns its started context.

        Raises:
            ValueError: ``external_trial_id`` without ``external_experiment_id``, or a storage
                shortcut that is not understood.
            cairn.client.ApiError: the master refused the run (the message says why).
        """
        if config.external_trial_id and not config.external_experiment_id:
            raise ValueError("external_trial_id needs an external_experiment_id to go with it")
        return self._start(
            RunStart(
                config=config,
                storage=storage_config(checkpoint_storage),
                distributed=distributed or DistributedContext.from_env(),
                preempt_mode=preempt_mode,
                tensorboard_mode=tensorboard_mode,
            )
        )

    @abc.abstractmethod
    def _start(self, start: RunStart) -> Context:
        """Starts the run this backend's way and returns its context."""

    @abc.abstractmethod
    def webui_url(self) -> str:
        """Where the run's experiment is shown."""


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
    """The backend of an unmanaged run: the master's when one is configured, else local."""
    if master_configured(client):
        return ClusterBackend(client)
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


class LocalBackend(UnmanagedBackend):
    """An unmanaged run with no master: it runs where it is started, as an off-cluster
    ``cairn.core.init()`` does, and a trial named by both external ids resumes from the latest
    checkpoint its earlier runs saved in the same storage."""

    def __init__(self) -> None:
        self._root: Path | None = None

    def _start(self, start: RunStart) -> Context:
        """Creates the run's context (a trial named by both external ids resumes)."""
        config, storage, dist = start.config, start.storage, start.distributed
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
            preempt_mode=start.preempt_mode,
            tensorboard_mode=start.tensorboard_mode,
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


class ClusterBackend(UnmanagedBackend):
    """An unmanaged run on a cluster: the master keeps its experiment, trial and runs.

    Only the chief calls the master (opening the run, heartbeats, closing it); every rank gets
    the opened run's facts from the chief and builds the same context, whose reports only the
    chief sends.
    """

    def __init__(self, client: Determined | None) -> None:
        self._client = client
        self._master = ""
        self._experiment_id = 0

    def _user_session(self) -> Client:
        if self._client is not None:
            return self._client._session
        from cairn.auth import session

        return session()

    def _open(self, config: Config, storage: dict[str, Any]) -> dict[str, Any]:
        client = self._user_session()
        experiment_id = config.external_experiment_id or f"unmanaged-{uuid.uuid4().hex}"
        trial_id = config.external_trial_id or uuid.uuid4().hex
        answer = client.post(
            "/unmanaged/trials",
            {
                "external_experiment_id": experiment_id,
                "external_trial_id": trial_id,
                "config": config.experiment_config(storage),
                "hparams": dict(config.hparams or {}),
            },
        )
        return {"master": client.master, **dict(answer)}

    def _start(self, start: RunStart) -> Context:
        """Opens the run on the master (the chief does) and returns its context."""
        config, storage, dist = start.config, start.storage, start.distributed
        answer = self._open(config, storage) if dist.is_chief else None
        if dist.size > 1:
            answer = dist.broadcast(answer)
        if answer is None:
            raise RuntimeError(
                f"rank {dist.rank} of {dist.size} got no run from the chief: initialise "
                "torch.distributed before core_v2.init() (or pass distributed=...)"
            )
        self._master, self._experiment_id = answer["master"], int(answer["experiment_id"])
        info = ClusterInfo(
            master_url=answer["master"],
            token=answer["token"],
            agent_id="",
            allocation_id=answer["allocation_id"],
            slot_ids=[],
            latest_checkpoint=answer["latest_checkpoint"],
            checkpoint_dir=None,
            trial=TrialInfo(
                trial_id=int(answer["trial_id"]),
                experiment_id=int(answer["experiment_id"]),
                hparams=dict(answer["hparams"]),
                steps_completed=int(answer["steps_completed"]),
                run_id=int(answer["run_id"]),
                config=dict(answer["config"]),
            ),
            task_id=str(answer["allocation_id"]),
            user=str(answer["owner"]),
        )
        context = cluster_context(
            info,
            distributed=dist,
            checkpoint_storage=storage,
            preempt_mode=start.preempt_mode,
            tensorboard_mode=start.tensorboard_mode,
            preemptible=False,
        )
        if dist.is_chief:
            run = Session(info.master_url, info.token)
            beats = _Heartbeats(run, float(answer["heartbeat_interval"]))
            beats.start()
            shipper = LogShipper(run, info.allocation_id)
            shipper.start()

            def ended(failed: bool) -> None:
                beats.stop()
                shipper.stop()
                with contextlib.suppress(HTTPStatusError, OSError):
                    run.request("POST", "/unmanaged/runs/close", {"failed": failed})

            context.on_close(ended)
        return context

    def webui_url(self) -> str:
        """The run's experiment in the master's web UI."""
        return f"{self._master}/#/experiments/{self._experiment_id}"


class _Heartbeats(threading.Thread):
    """Tells the master every ``interval`` seconds that the run's script is alive."""

    def __init__(self, session: Session, interval: float) -> None:
        super().__init__(name="cairn-unmanaged-heartbeat", daemon=True)
        self._session = session
        self._interval = max(interval, 0.1)
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._session.request("POST", "/unmanaged/runs/heartbeat", {}, timeout=10)
            except HTTPStatusError as exc:
                if not exc.retryable:
                    return  # the run has ended (closed or expired): nothing to keep alive
            except OSError:
                continue  # the master is unreachable for now: the next beat may get through

    def stop(self) -> None:
        """Stops beating (the run is being closed)."""
        self._stopped.set()
