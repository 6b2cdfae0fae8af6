"""Which checkpoint storages the cluster allows, and checkpoint directories that are never
followed out of their root (links swapped in, links inside, devices and FIFOs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from events.domain.checkpoint_storage import (
    MARKER_FILE,
    DirectoryStorage,
    StorageError,
    StorageNotAllowedError,
    check_storage,
    marker_bytes,
)
from events.domain.config.cluster import CheckpointStoragePolicy, parse_cluster_config


def policy(**section: object) -> CheckpointStoragePolicy:
    """The storage section of a cluster config holding ``section``."""
    return parse_cluster_config({"checkpoint_storage": section}).checkpoint_storage


def refusal(storage: dict[str, object], allowed: CheckpointStoragePolicy, root: Path) -> str:
    """The message of the refusal of ``storage`` (the test fails if it is allowed)."""
    with pytest.raises(StorageNotAllowedError) as caught:
        check_storage(storage, allowed, default_root=root)
    return str(caught.value)


def test_by_default_only_the_default_root_is_allowed(tmp_path: Path) -> None:
    """Without allowed_roots a shared_fs storage must be the default root or under it."""
    root = tmp_path / "checkpoints"
    check_storage(None, policy(), default_root=root)
    check_storage({"type": "shared_fs", "host_path": str(root)}, policy(), default_root=root)
    inside = {"type": "shared_fs", "host_path": str(root), "storage_path": "team"}
    check_storage(inside, policy(), default_root=root)
    message = refusal({"type": "shared_fs", "host_path": "/etc"}, policy(), root)
    assert message == f"checkpoint_storage.host_path: /etc is outside the allowed roots [{root}]"


def test_every_way_out_of_an_allowed_root_is_refused_naming_the_field(tmp_path: Path) -> None:
    """``..`` in host_path, storage_path leaving host_path, a link inside an allowed root that
    points out of it, a sibling whose name starts like the root, and a directory storage's
    container_path are each refused at their own field."""
    root, allowed = tmp_path / "default", tmp_path / "shared"
    (allowed / "team").mkdir(parents=True)
    (allowed / "team" / "out").symlink_to("/etc")
    rules = policy(allowed_roots=[str(allowed)])
    cases = {
        "checkpoint_storage.host_path": [
            {"type": "shared_fs", "host_path": f"{allowed}/../etc"},
            {"type": "shared_fs", "host_path": f"{allowed}/team/out"},
            {"type": "shared_fs", "host_path": f"{allowed}-evil"},
        ],
        "checkpoint_storage.storage_path": [
            {"type": "shared_fs", "host_path": str(allowed), "storage_path": "team/out/x"},
        ],
        "checkpoint_storage.container_path": [
            {"type": "directory", "container_path": "/var/lib"},
        ],
    }
    for field, storages in cases.items():
        for storage in storages:
            assert refusal(storage, rules, root).startswith(f"{field}: "), storage
    assert "(which resolves to /etc)" in refusal(
        cases["checkpoint_storage.host_path"][1], rules, root
    )
    check_storage({"type": "shared_fs", "host_path": f"{allowed}/team"}, rules, default_root=root)
    check_storage({"type": "directory", "container_path": str(allowed)}, rules, default_root=root)


def test_s3_without_its_own_keys_needs_a_grant(tmp_path: Path) -> None:
    """An s3 storage without access_key/secret_key uses the services' credentials: only a
    granted bucket at its endpoint may; one with its own keys goes anywhere."""
    rules = policy(
        s3_server_credentials=[
            {"bucket": "team-*", "endpoint_url": "http://minio:9000/"},
            {"bucket": "aws-bucket"},
        ]
    )
    ok = [
        {"type": "s3", "bucket": "team-a", "endpoint_url": "http://minio:9000"},
        {"type": "s3", "bucket": "aws-bucket"},
        {"type": "s3", "bucket": "anything", "endpoint_url": "http://evil", "access_key": "a",
         "secret_key": "s"},
    ]  # fmt: skip
    for storage in ok:
        check_storage(storage, rules, default_root=tmp_path)
    refused = [
        {"type": "s3", "bucket": "team-a", "endpoint_url": "http://evil:9000"},
        {"type": "s3", "bucket": "other", "endpoint_url": "http://minio:9000"},
        {"type": "s3", "bucket": "team-a"},
        {"type": "s3", "bucket": "other", "access_key": "a"},
    ]
    for storage in refused:
        message = refusal(storage, rules, tmp_path)
        assert message.startswith("checkpoint_storage.bucket: "), message
        assert "may not use the cluster's own S3 credentials" in message


def checkpoint(root: Path, uuid: str, files: dict[str, bytes]) -> Path:
    """A checkpoint directory as the Core API leaves it."""
    directory = root / uuid
    for name, data in {**files, MARKER_FILE: marker_bytes(uuid)}.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return directory


def decoy(tmp_path: Path) -> Path:
    """A directory outside the storage root standing in for ``/etc``."""
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_bytes(b"root:x:0:0")
    return outside


def test_a_checkpoint_swapped_for_a_link_is_neither_read_nor_deleted(tmp_path: Path) -> None:
    """After save the directory is replaced by a link to a decoy (with a forged marker):
    nothing is listed, read or owned through it, and delete removes nothing it points at."""
    root, outside = tmp_path / "root", decoy(tmp_path)
    storage = DirectoryStorage(root)
    checkpoint(root, "u1", {"model.pt": b"w"})
    assert storage.owned("u1") and storage.files("u1") == {"model.pt": 1}
    (outside / MARKER_FILE).write_bytes(marker_bytes("u1"))
    (root / "u1" / MARKER_FILE).unlink()
    (root / "u1" / "model.pt").unlink()
    (root / "u1").rmdir()
    (root / "u1").symlink_to(outside)
    assert not storage.owned("u1")
    assert storage.files("u1") == {}
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("u1", "passwd")
    assert storage.delete("u1") is False
    assert storage.delete("u1", ["passwd"]) is False
    assert (outside / "passwd").read_bytes() == b"root:x:0:0"
    assert storage.uuids() == []


def test_links_inside_a_checkpoint_are_skipped_and_unlinked_not_followed(tmp_path: Path) -> None:
    """A link to a file or directory outside, a link to a directory inside, a FIFO: listing
    and reading see only regular files, and deleting the checkpoint leaves the targets."""
    root, outside = tmp_path / "root", decoy(tmp_path)
    storage = DirectoryStorage(root)
    directory = checkpoint(root, "u1", {"model.pt": b"w", "sub/a.txt": b"a"})
    (directory / "passwd").symlink_to(outside / "passwd")
    (directory / "etc").symlink_to(outside)
    (directory / "sub" / "loop").symlink_to(directory / "sub")
    os.mkfifo(directory / "pipe")
    assert storage.files("u1") == {"model.pt": 1, "sub/a.txt": 1}
    for name in ("passwd", "etc/passwd", "pipe", "sub/loop/a.txt", "../u1/model.pt"):
        with pytest.raises(FileNotFoundError):
            storage.read_bytes("u1", name)
    assert storage.delete("u1") is True
    assert not directory.exists()
    assert (outside / "passwd").read_bytes() == b"root:x:0:0"


def test_writes_never_go_through_a_link(tmp_path: Path) -> None:
    """put_bytes into a checkpoint whose subdirectory is a link to a decoy fails, and a file
    that is a link is replaced, not written through."""
    root, outside = tmp_path / "root", decoy(tmp_path)
    storage = DirectoryStorage(root)
    directory = checkpoint(root, "u1", {})
    (directory / "sub").symlink_to(outside)
    with pytest.raises(StorageError):
        storage.put_bytes("u1", "sub/passwd", b"pwned")
    assert (outside / "passwd").read_bytes() == b"root:x:0:0"
    (directory / "f").symlink_to(outside / "passwd")
    storage.put_bytes("u1", "f", b"mine")
    assert (outside / "passwd").read_bytes() == b"root:x:0:0"
    assert (directory / "f").read_bytes() == b"mine" and not (directory / "f").is_symlink()


def test_a_root_that_is_not_a_directory_is_a_storage_error(tmp_path: Path) -> None:
    """A file where the root should be fails loudly (not "missing")."""
    root = tmp_path / "file"
    root.write_text("x")
    with pytest.raises(StorageError):
        DirectoryStorage(root).owned("u1")
    assert DirectoryStorage(tmp_path / "absent").owned("u1") is False
