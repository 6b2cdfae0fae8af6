"""What a TensorBoard task reads: the sources file its agent writes into its work directory.

The agent writes :data:`SOURCES_FILE` into the task's work directory (mode 0600, in a directory
only the task's identity may read) before the server starts, and names it on the server's
command line; nothing secret is ever on a command line. Each source is one experiment: its
trials (``null``: all of them) and where their TensorBoard files are, either a ``directory``
(the experiment's ``tensorboard/experiment/<id>`` under its shared_fs or default storage) or
an ``s3`` storage config. The S3 credentials in it are the experiment's config's, which every
trial of that experiment is given too; the task gets no other.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from cairn.tasks import SERVE_TOKEN_VARIABLE
from events.domain.config.storage import checkpoint_root, tensorboard_experiment_dir

SOURCES_FILE = "tensorboard-sources.json"
"""The sources file's name in the task's work directory."""

TOKEN_VARIABLE = SERVE_TOKEN_VARIABLE
"""The environment variable holding the token every request to the server must carry
(``Authorization: token <t>``, which the API's proxy adds)."""


class TensorboardSourceFile(BaseModel):
    """One experiment's TensorBoard files, as the server reads them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experiment_id: int
    trial_ids: list[int] | None = None
    directory: str | None = None
    """The experiment's TensorBoard directory (holding ``trial/<trial id>/``)."""
    s3: dict[str, Any] | None = None
    """The experiment's S3 ``checkpoint_storage`` (its files under ``<prefix>/tensorboard/...``)."""


class TensorboardSources(BaseModel):
    """The sources file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sources: list[TensorboardSourceFile]


def source_of(
    experiment_id: int,
    trial_ids: Sequence[int] | None,
    storage: Mapping[str, Any] | None,
    default_root: Path,
) -> TensorboardSourceFile:
    """Where the TensorBoard files of ``experiment_id`` are, given its ``checkpoint_storage``
    and the agent's default checkpoint root."""
    ids = None if trial_ids is None else list(trial_ids)
    if isinstance(storage, Mapping) and storage.get("type") == "s3":
        return TensorboardSourceFile(experiment_id=experiment_id, trial_ids=ids, s3=dict(storage))
    root = checkpoint_root(storage, default_root)
    return TensorboardSourceFile(
        experiment_id=experiment_id,
        trial_ids=ids,
        directory=str(root / tensorboard_experiment_dir(experiment_id)),
    )


def write_sources(work: Path, sources: Sequence[TensorboardSourceFile]) -> Path:
    """Writes the sources file into ``work`` (mode 0600) and returns its path."""
    path = work / SOURCES_FILE
    body = TensorboardSources(sources=list(sources)).model_dump_json()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(body)
    return path


def read_sources(path: Path) -> TensorboardSources:
    """The sources file at ``path``.

    Raises:
        OSError: it cannot be read.
        ValueError: it is not a sources file.
    """
    return TensorboardSources.model_validate(json.loads(path.read_text()))
