"""Which ``checkpoint_storage`` configs the cluster allows (its ``checkpoint_storage`` policy).

A directory storage (``shared_fs``, ``directory``) must lie under the cluster's default
checkpoint root or one of the cluster config's ``allowed_roots``, both as written and once
symbolic links are resolved; an ``s3`` storage that brings no credentials of its own is reached
with the services' credentials, so its bucket and endpoint must be granted by
``s3_server_credentials``. The API refuses other configs at submission (400 naming the field),
and the checkpoint download and GC refuse to touch such a storage whatever the log says.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from events.domain.checkpoint_storage.base import StorageError
from events.domain.config.cluster import CheckpointStoragePolicy


class StorageNotAllowedError(StorageError):
    """A ``checkpoint_storage`` config names a place the cluster config does not allow.

    Attributes:
        path: the config field at fault (``checkpoint_storage.host_path``).
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


Resolve = Callable[[str], str]


def _inside(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


def allowed_roots(policy: CheckpointStoragePolicy, default_root: Path) -> list[str]:
    """The default root and the policy's roots, normalised, in that order, without repeats."""
    roots = [posixpath.normpath(str(default_root)), *map(posixpath.normpath, policy.allowed_roots)]
    return list(dict.fromkeys(roots))


def root_violation(
    path: str, roots: Sequence[str], *, resolve: Resolve = os.path.realpath
) -> str | None:
    """Why directory ``path`` is not under one of ``roots`` (``None`` when it is).

    ``path`` must be under a root as written (normalised) and once both are resolved
    (``resolve``: :func:`os.path.realpath`, so a symbolic link inside an allowed root that
    points elsewhere does not count as inside).
    """
    written = posixpath.normpath(path)
    if not written.startswith("/"):
        return f"{path} is not an absolute path"
    real = resolve(written)
    for root in roots:
        if _inside(written, root) and _inside(real, resolve(root)):
            return None
    shown = written if real == written else f"{written} (which resolves to {real})"
    return f"{shown} is outside the allowed roots [{', '.join(roots)}]"


def _endpoint(value: Any) -> str | None:
    return str(value).rstrip("/") if value else None


def check_storage(
    storage: Any,
    policy: CheckpointStoragePolicy,
    *,
    default_root: Path,
    resolve: Resolve = os.path.realpath,
) -> None:
    """Refuses a ``checkpoint_storage`` config the policy does not allow.

    Args:
        storage: the config's ``checkpoint_storage`` (a mapping as validated, or ``None``).
        policy: the cluster config's ``checkpoint_storage`` section.
        default_root: the cluster's default checkpoint root (always allowed).
        resolve: how a path's symbolic links are resolved.

    Raises:
        StorageNotAllowedError: naming the field and the value at fault.
    """
    if not isinstance(storage, Mapping):
        return
    kind = storage.get("type")
    roots = allowed_roots(policy, default_root)
    if kind == "shared_fs":
        host = str(storage.get("host_path") or "")
        problem = root_violation(host, roots, resolve=resolve)
        if problem:
            raise StorageNotAllowedError("checkpoint_storage.host_path", problem)
        sub = storage.get("storage_path")
        if sub:
            joined = posixpath.join(host, str(sub))
            problem = root_violation(joined, roots, resolve=resolve)
            if problem:
                raise StorageNotAllowedError("checkpoint_storage.storage_path", problem)
    elif kind == "directory":
        path = str(storage.get("container_path") or "")
        problem = root_violation(path, roots, resolve=resolve)
        if problem:
            raise StorageNotAllowedError("checkpoint_storage.container_path", problem)
    elif kind == "s3" and not (storage.get("access_key") and storage.get("secret_key")):
        bucket = str(storage.get("bucket") or "")
        endpoint = _endpoint(storage.get("endpoint_url"))
        for grant in policy.s3_server_credentials:
            if (
                fnmatch.fnmatchcase(bucket, grant.bucket)
                and _endpoint(grant.endpoint_url) == endpoint
            ):
                return
        where = f"at {endpoint}" if endpoint else "on AWS"
        granted = ", ".join(
            f"{g.bucket} at {g.endpoint_url or 'AWS'}" for g in policy.s3_server_credentials
        )
        raise StorageNotAllowedError(
            "checkpoint_storage.bucket",
            f"bucket {bucket!r} {where} may not use the cluster's own S3 credentials "
            f"(allowed: [{granted}]); give access_key and secret_key",
        )
