"""Where an embedded cluster keeps its files: which data directory, and what lies in it.

``DIR/pg`` and ``DIR/nats`` hold the servers' data, ``DIR/run`` the services' readiness files,
``DIR/cluster.yaml`` the administrator's config and ``DIR/join.token`` the agents' join token (its
path, never its value, is handed on). The logs' place is in :mod:`cairn.local.logs`, the state
file's in :mod:`cairn.local.state`.
"""

from __future__ import annotations

from pathlib import Path

from cairn.local.private_files import read_or_create_secret
from cairn.local.state import remembered_cluster, state_path
from events import settings
from events.domain.config.cluster import CLUSTER_CONFIG_FILE

DEFAULT_DIR_NAME = ".cairn"


def default_data_dir() -> Path:
    """``$CAIRN_HOME``; else ``./.cairn`` if a cluster was started there; else the cluster the
    user started last (wherever that was), if its data directory is still there; else
    ``./.cairn``. Absolute."""
    home = settings.cairn_home()
    if home is not None:
        return home
    here = Path(DEFAULT_DIR_NAME).resolve()
    if state_path(here).exists():
        return here
    return remembered_cluster() or here


def run_dir(data_dir: Path) -> Path:
    """Where readiness files go."""
    return data_dir / "run"


def cluster_config_path(data_dir: Path) -> Path:
    """The embedded cluster's config file (:mod:`events.domain.config.cluster`): ``DIR/cluster.yaml``.

    Every service gets its path (``CAIRN_CLUSTER_CONFIG``) when it exists; without it every
    setting has its default (checkpoints only under ``DIR/checkpoints``).
    """
    return data_dir / CLUSTER_CONFIG_FILE


def join_token_file(data_dir: Path) -> Path:
    """The cluster's join token (``DIR/join.token``, mode 0600), created on first use: agents
    present it once for their own credential. Its path, never its value, reaches the API and
    the agents."""
    path = data_dir / "join.token"
    read_or_create_secret(path)
    return path
