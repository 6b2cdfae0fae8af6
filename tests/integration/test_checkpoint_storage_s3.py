"""S3-compatible checkpoint storage against a real local S3 server (moto's, in its own process):
the storage layer, the Core API's checkpoint context and the tracker's removal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import cairn.core
from events.domain.checkpoint_storage import (
    MARKER_FILE,
    DirectoryStorage,
    S3Storage,
    StorageError,
    marker_bytes,
    open_storage,
)
from services.tracker.gc import remove_checkpoints
from tests.conftest import S3Server


@pytest.fixture(autouse=True)
def off_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No ``CAIRN_*`` variables and a scratch working directory."""
    for name in list(os.environ):
        if name.startswith("CAIRN_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def s3_config(server: S3Server, prefix: str = "team/ckpts") -> dict[str, str]:
    """A ``checkpoint_storage`` config of the test's bucket, with credentials."""
    return {
        "type": "s3",
        "bucket": server.bucket,
        "prefix": prefix,
        "endpoint_url": server.url,
        "access_key": server.ACCESS_KEY,
        "secret_key": server.SECRET_KEY,
    }


def test_s3_storage_stores_lists_reads_and_deletes_objects(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """Files go to <prefix>/<uuid>/<name>; files/uuids/read/download/delete see exactly them."""
    storage = open_storage(s3_config(s3_server), tmp_path / "unused", policy=None)
    assert isinstance(storage, S3Storage) and storage.local_root() is None
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "w.bin").write_bytes(b"x" * 100)
    (source / "sub" / "a.txt").write_text("hi")
    storage.upload(source, "u1", ["w.bin", "sub/a.txt"])
    storage.put_bytes("u1", "metadata.json", b"{}")
    assert s3_server.object_keys() == [
        "team/ckpts/u1/metadata.json",
        "team/ckpts/u1/sub/a.txt",
        "team/ckpts/u1/w.bin",
    ]
    assert storage.files("u1") == {"metadata.json": 2, "sub/a.txt": 2, "w.bin": 100}
    assert storage.uuids() == ["u1"]
    assert storage.read_bytes("u1", "sub/a.txt") == b"hi"
    storage.download("u1", tmp_path / "out", ["sub/a.txt"])
    assert (tmp_path / "out" / "sub" / "a.txt").read_text() == "hi"
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("u1", "missing.txt")
    assert storage.delete("u1", ["w.bin"]) is True
    assert storage.files("u1") == {"metadata.json": 2, "sub/a.txt": 2}
    assert storage.delete("u1") is True
    assert storage.delete("u1") is False
    assert s3_server.object_keys() == []


def test_s3_credentials_come_from_the_environment_when_the_config_has_none(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without access_key/secret_key the client uses AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.SECRET_KEY)
    config = {"type": "s3", "bucket": s3_server.bucket, "endpoint_url": s3_server.url}
    storage = open_storage(config, tmp_path, policy=None)
    storage.put_bytes("u2", "metadata.json", b"{}")
    assert s3_server.object_keys() == ["u2/metadata.json"]
    credentials = storage._client._request_signer._credentials  # type: ignore[attr-defined]
    assert credentials.access_key == s3_server.ACCESS_KEY


def test_s3_errors_are_storage_errors_without_credentials(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """A missing bucket is a StorageError naming the bucket, never the secret key."""
    config = s3_config(s3_server) | {"bucket": "no-such-bucket"}
    storage = open_storage(config, tmp_path, policy=None)
    with pytest.raises(StorageError) as caught:
        storage.put_bytes("u3", "metadata.json", b"{}")
    assert "no-such-bucket" in str(caught.value)
    assert s3_server.SECRET_KEY not in str(caught.value)


def test_core_api_checkpoints_round_trip_through_s3(s3_server: S3Server, tmp_path: Path) -> None:
    """store_path uploads (metadata.json included) on exit; restore_path, download, get_metadata,
    a selector, delete with globs and a new init's latest checkpoint all read the bucket."""
    config = s3_config(s3_server)
    with cairn.core.init(checkpoint_storage=config) as ctx:
        with ctx.checkpoint.store_path({"steps_completed": 5}) as (path, uuid):
            (path / "model.pt").write_bytes(b"m" * 64)
            (path / "opt").mkdir()
            (path / "opt" / "state.pt").write_bytes(b"o" * 8)
        assert not path.exists()  # the scratch directory is gone; the bucket holds the files
        assert s3_server.object_keys() == [
            f"team/ckpts/{uuid}/.cairn-checkpoint",
            f"team/ckpts/{uuid}/metadata.json",
            f"team/ckpts/{uuid}/model.pt",
            f"team/ckpts/{uuid}/opt/state.pt",
        ]
        reported = ctx._reporter.items[-1]  # type: ignore[attr-defined]
        assert reported["uuid"] == uuid
        assert reported["resources"]["model.pt"] == 64
        assert set(reported["resources"]) == {"metadata.json", "model.pt", "opt/state.pt"}
        with ctx.checkpoint.restore_path(uuid) as restored:
            assert (restored / "model.pt").read_bytes() == b"m" * 64
            assert json.loads((restored / "metadata.json").read_text())["steps_completed"] == 5
        with ctx.checkpoint.restore_path(uuid, selector=lambda n: n.startswith("opt/")) as part:
            assert sorted(p.name for p in part.rglob("*") if p.is_file()) == ["state.pt"]
        ctx.checkpoint.download(uuid, tmp_path / "copy")
        assert (tmp_path / "copy" / "opt" / "state.pt").read_bytes() == b"o" * 8
        assert ctx.checkpoint.get_metadata(uuid) == {"steps_completed": 5}
        earlier = ctx.checkpoint.upload(tmp_path / "copy", {"steps_completed": 2})
        ctx.checkpoint.delete(earlier, ["opt/*"])
        assert sorted(S3Storage.from_config(config).files(earlier)) == [
            "metadata.json",
            "model.pt",
        ]
        with pytest.raises(FileNotFoundError):
            ctx.checkpoint.download("no-such-uuid", tmp_path / "none")
    with cairn.core.init(checkpoint_storage=config) as ctx:
        assert ctx.info.latest_checkpoint == uuid  # most steps wins, found in the bucket
        ctx.checkpoint.delete(earlier)
    assert all(earlier not in key for key in s3_server.object_keys())


def test_failed_store_path_uploads_nothing(s3_server: S3Server) -> None:
    """An exception inside store_path leaves no object in the bucket and reports nothing."""
    with cairn.core.init(checkpoint_storage=s3_config(s3_server)) as ctx:
        before = len(ctx._reporter.items)  # type: ignore[attr-defined]
        with (
            pytest.raises(RuntimeError),
            ctx.checkpoint.store_path({"steps_completed": 1}) as (
                path,
                _,
            ),
        ):
            (path / "half.pt").write_bytes(b"h")
            raise RuntimeError("crash while writing")
        assert len(ctx._reporter.items) == before  # type: ignore[attr-defined]
    assert s3_server.object_keys() == []


def test_tracker_removal_deletes_s3_checkpoints_and_counts_missing_ones(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """remove_checkpoints deletes every object of each marked uuid; an absent uuid, or a
    prefix cairn's marker does not name, is missing and left in place."""
    storage = open_storage(s3_config(s3_server), tmp_path, policy=None)
    storage.put_bytes("keep", "metadata.json", b"{}")
    storage.put_bytes("gone", MARKER_FILE, marker_bytes("gone"))
    storage.put_bytes("gone", "metadata.json", b"{}")
    storage.put_bytes("gone", "w.bin", b"w")
    storage.put_bytes("foreign", "data.bin", b"d")
    storage.put_bytes("forged", MARKER_FILE, marker_bytes("gone"))
    removal = remove_checkpoints(storage, ["gone", "foreign", "forged", "never-there", "../escape"])
    assert removal.removed == ["gone"]
    assert sorted(removal.missing) == ["../escape", "foreign", "forged", "never-there"]
    assert s3_server.object_keys() == [
        "team/ckpts/foreign/data.bin",
        "team/ckpts/forged/.cairn-checkpoint",
        "team/ckpts/keep/metadata.json",
    ]


def test_directory_storage_keeps_the_directory_layout(tmp_path: Path) -> None:
    """Without type s3 the storage is <root>/<uuid>/ (the cluster default without a type)."""
    storage = open_storage({"save_trial_best": 2}, tmp_path, policy=None)
    assert isinstance(storage, DirectoryStorage) and storage.local_root() == tmp_path
    storage.put_bytes("u", "a/b.txt", b"b")
    assert (tmp_path / "u" / "a" / "b.txt").read_bytes() == b"b"
    assert storage.files("u") == {"a/b.txt": 1}
    assert storage.delete("u") is True and not (tmp_path / "u").exists()
