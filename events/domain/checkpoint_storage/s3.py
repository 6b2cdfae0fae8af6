"""Checkpoints in an S3-compatible bucket: object ``<prefix>/<uuid>/<file>`` per file.

Credentials come from the config's ``access_key``/``secret_key`` or, when absent, from boto3's
usual sources (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` in the environment, a profile).
``endpoint_url`` points at any S3-compatible server (MinIO, Ceph, a local test server).
boto3's errors are translated into :class:`StorageError` here and nowhere else; no message
carries a credential.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

from events.domain.checkpoint_storage.base import (
    MARKER_FILE,
    CheckpointStorage,
    StorageError,
    safe_name,
    safe_uuid,
)

DELETE_BATCH = 1000
"""Most keys one ``DeleteObjects`` call removes (S3's own limit)."""


class S3Storage(CheckpointStorage):
    """Checkpoints in ``bucket`` under ``prefix``.

    Args:
        bucket: the bucket (it must exist).
        prefix: the key prefix of every checkpoint (``""``: the bucket's top level).
        endpoint_url: an S3-compatible server; ``None``: AWS.
        access_key: the access key id; ``None``: from the environment.
        secret_key: the secret access key; ``None``: from the environment.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        try:  # boto3 is the s3 extra's: a trial image without it still imports the Core API
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError
        except ImportError:
            raise StorageError(
                f"{self.location}: S3 checkpoint storage needs boto3: install cairn[s3] (the trial "
                "image: CAIRN_TRIAL_EXTRAS=s3 deploy/images/build.sh trial)"
            ) from None

        try:
            self._client: Any = boto3.session.Session().client(
                "s3",
                endpoint_url=endpoint_url or None,
                aws_access_key_id=access_key or None,
                aws_secret_access_key=secret_key or None,
                region_name=os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                config=Config(
                    connect_timeout=10,
                    read_timeout=60,
                    retries={"max_attempts": 3, "mode": "standard"},
                ),
            )
        except (BotoCoreError, ValueError) as exc:
            raise StorageError(f"{self.location}: cannot open: {exc}") from None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> S3Storage:
        """The storage of an ``{type: s3, bucket, prefix, endpoint_url, access_key,
        secret_key}`` config."""
        return cls(
            str(config["bucket"]),
            str(config.get("prefix") or ""),
            endpoint_url=config.get("endpoint_url") or None,
            access_key=config.get("access_key") or None,
            secret_key=config.get("secret_key") or None,
        )

    @property
    def location(self) -> str:
        """``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _base(self, uuid: str) -> str:
        if not safe_uuid(uuid):
            raise FileNotFoundError(f"not a checkpoint id: {uuid!r}")
        return f"{self.prefix}/{uuid}/" if self.prefix else f"{uuid}/"

    def _key(self, uuid: str, name: str) -> str:
        if not safe_name(name):
            raise FileNotFoundError(f"not a file of a checkpoint: {name!r}")
        return self._base(uuid) + name

    @contextlib.contextmanager
    def _translated(self, what: str) -> Iterator[None]:
        """Turns boto3's errors into :class:`StorageError` (a missing key into
        ``FileNotFoundError``)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"{self.location}: {what}: not found") from None
            message = error.get("Message") or code
            raise StorageError(f"{self.location}: {what}: {code} {message}".strip()) from None
        except BotoCoreError as exc:
            raise StorageError(f"{self.location}: {what}: {exc}") from None

    def _list(self, prefix: str, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        with self._translated("list"):
            yield from self._client.get_paginator("list_objects_v2").paginate(**kwargs)

    def _objects(self, uuid: str) -> dict[str, int]:
        """Every object under ``<prefix>/<uuid>/`` (whatever its name), relative to it."""
        if not safe_uuid(uuid):
            return {}
        base = self._base(uuid)
        out: dict[str, int] = {}
        for page in self._list(base):
            for item in page.get("Contents", []):
                out[str(item["Key"])[len(base) :]] = int(item["Size"])
        return dict(sorted(out.items()))

    def files(self, uuid: str) -> dict[str, int]:
        """The checkpoint's files: objects under ``<prefix>/<uuid>/`` named like relative
        paths (no ``..``, no empty component), the marker left out."""
        return {
            name: size
            for name, size in self._objects(uuid).items()
            if name != MARKER_FILE and safe_name(name)
        }

    def upload(self, source: Path, uuid: str, names: Iterable[str]) -> None:
        """Uploads each file (multipart for large ones)."""
        for name in names:
            key = self._key(uuid, name)
            with self._translated(f"upload {key}"):
                self._client.upload_file(str(source / name), self.bucket, key)

    def put_bytes(self, uuid: str, name: str, data: bytes) -> None:
        """Writes one object."""
        key = self._key(uuid, name)
        with self._translated(f"put {key}"):
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def read_bytes(self, uuid: str, name: str) -> bytes:
        """Reads one object."""
        with self.open(uuid, name) as body, self._translated(f"read {name}"):
            return body.read()

    def open(self, uuid: str, name: str) -> BinaryIO:
        """Streams one object."""
        key = self._key(uuid, name)
        with self._translated(f"get {key}"):
            answer = self._client.get_object(Bucket=self.bucket, Key=key)
        return cast(BinaryIO, answer["Body"])

    def download(self, uuid: str, target: Path, names: Iterable[str]) -> None:
        """Downloads each object into ``target``."""
        for name in names:
            key = self._key(uuid, name)
            destination = target / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            with self._translated(f"download {key}"):
                self._client.download_file(self.bucket, key, str(destination))

    def delete(self, uuid: str, names: Iterable[str] | None = None) -> bool:
        """Deletes the checkpoint's objects (or the named ones that exist)."""
        if not safe_uuid(uuid):
            return False
        present = self._objects(uuid)
        doomed = list(present) if names is None else [n for n in names if n in present]
        base = self._base(uuid)
        keys = [base + name for name in doomed]
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": key} for key in keys[start : start + DELETE_BATCH]]
            with self._translated(f"delete {uuid}"):
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            errors = answer.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(
                    f"{self.location}: delete {first.get('Key')}: {first.get('Code')}"
                )
        return bool(keys)

    def _path_key(self, path: str) -> str:
        if not safe_name(path):
            raise FileNotFoundError(f"not a relative path: {path!r}")
        return f"{self.prefix}/{path}" if self.prefix else path

    def tree(self, path: str) -> dict[str, tuple[int, str]]:
        """Every object under ``<prefix>/<path>/`` (files that are not checkpoints, such as
        TensorBoard's), as ``{name relative to it: (bytes, ETag)}``; names that are not plain
        relative paths are left out."""
        base = self._path_key(path) + "/"
        out: dict[str, tuple[int, str]] = {}
        for page in self._list(base):
            for item in page.get("Contents", []):
                name = str(item["Key"])[len(base) :]
                if safe_name(name):
                    out[name] = (int(item["Size"]), str(item.get("ETag", "")))
        return dict(sorted(out.items()))

    def read_from(self, path: str, offset: int = 0) -> bytes:
        """The object ``<prefix>/<path>`` from byte ``offset`` to its end.

        Raises:
            FileNotFoundError: no such object.
        """
        key = self._path_key(path)
        extra = {"Range": f"bytes={offset}-"} if offset > 0 else {}
        with self._translated(f"get {key}"):
            answer = self._client.get_object(Bucket=self.bucket, Key=key, **extra)
            return bytes(answer["Body"].read())

    def put_file(self, path: str, source: Path) -> None:
        """Uploads ``source`` as the object ``<prefix>/<path>`` (multipart for a large one)."""
        key = self._path_key(path)
        with self._translated(f"upload {key}"):
            self._client.upload_file(str(source), self.bucket, key)

    def uuids(self) -> list[str]:
        """The uuids that have objects under the prefix."""
        base = f"{self.prefix}/" if self.prefix else ""
        out: set[str] = set()
        for page in self._list(base, delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                out.add(str(common["Prefix"])[len(base) :].rstrip("/"))
        return sorted(u for u in out if safe_uuid(u))
