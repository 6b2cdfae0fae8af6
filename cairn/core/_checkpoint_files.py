"""A checkpoint directory's files and metadata: which files it holds and their sizes, copies
of them, their digests, and the checks and merge of the metadata stored with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from events.domain.checkpoint_storage import MARKER_FILE

Selector = Callable[[str], bool]
"""Given a file's path relative to the checkpoint directory (``/``-separated), whether to use it."""


def file_sizes(path: Path, selector: Selector | None = None) -> dict[str, int]:
    """Every file under ``path`` that ``selector`` keeps, as {relative path: bytes} (cairn's
    marker left out)."""
    out: dict[str, int] = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = Path(dirpath) / name
            relative = full.relative_to(path).as_posix()
            if relative == MARKER_FILE:
                continue
            if selector is None or selector(relative):
                out[relative] = full.stat().st_size
    return dict(sorted(out.items()))


def copy_files(source: Path, target: Path, names: Sequence[str]) -> None:
    """Copies ``names`` (relative paths) from ``source`` to ``target``, keeping their layout."""
    for name in names:
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, destination)


def file_digest(path: Path) -> str:
    """The SHA-256 of the file at ``path``, in hex."""
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def merge_metadata(all_metadata: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The union of every rank's metadata.

    Raises:
        RuntimeError: two ranks gave one key different values (names the keys and ranks).
    """
    merged: dict[str, Any] = {}
    owner: dict[str, int] = {}
    conflicts: dict[str, list[int]] = {}
    for rank, meta in enumerate(all_metadata):
        for key, value in meta.items():
            if key in merged and merged[key] != value:
                conflicts.setdefault(key, [owner[key]]).append(rank)
                continue
            merged.setdefault(key, value)
            owner.setdefault(key, rank)
    if conflicts:
        detail = "; ".join(f"{k!r} given differently by ranks {r}" for k, r in conflicts.items())
        raise RuntimeError(
            f"refusing to store a sharded checkpoint with metadata conflicts: {detail}"
        )
    return merged


def checked_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """``metadata`` as a dict, once it is JSON and holds a non-negative ``steps_completed``.

    Raises:
        ValueError: it is not, saying what is wrong.
    """
    meta = dict(metadata or {})
    if "steps_completed" not in meta:
        raise ValueError("checkpoint metadata must contain 'steps_completed'")
    steps = meta["steps_completed"]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps_completed must be a non-negative int, got {steps!r}")
    try:
        json.dumps(meta)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"checkpoint metadata must be JSON-serialisable: {exc}") from exc
    return meta
