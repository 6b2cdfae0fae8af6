"""TensorBoard files in S3-compatible storage against a real local S3 server (moto's, in its own
process): the Core API's uploader puts a trial's files in the bucket, and a TensorBoard task's
sync copies them from there, then only what grew."""

from __future__ import annotations

import time
from pathlib import Path

from cairn.core._tensorboard import EventFileWriter, TensorboardManager, encode_event, tfrecord
from cairn.tasks.tensorboard_sources import source_of
from cairn.tasks.tensorboard_sync import TensorboardSync
from events.domain.checkpoint_storage import S3Storage
from events.domain.config.storage import tensorboard_dir
from tests.conftest import S3Server

PREFIX = "team/runs"


def storage_config(server: S3Server) -> dict[str, str]:
    """The experiment's ``checkpoint_storage``: the test's bucket, with its credentials."""
    return {
        "type": "s3",
        "bucket": server.bucket,
        "prefix": PREFIX,
        "endpoint_url": server.url,
        "access_key": server.ACCESS_KEY,
        "secret_key": server.SECRET_KEY,
    }


def test_trial_files_uploaded_to_s3_are_synced_then_only_their_growth(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """Two trials' event files go to ``<prefix>/tensorboard/experiment/<e>/trial/<t>/`` in the
    bucket; a sync over one named trial copies its file into ``trial_<t>``, byte for byte;
    after the trial writes more and uploads again, the next sync appends just the new bytes
    (a ranged read) to the same local file."""
    config = storage_config(s3_server)
    bucket = S3Storage.from_config(config)

    def put(source: Path, target: Path) -> None:
        bucket.put_file(target.as_posix(), source)

    local = {7: tmp_path / "tb7", 8: tmp_path / "tb8"}
    managers = {t: TensorboardManager(local[t], tensorboard_dir(3, t), 0, put=put) for t in (7, 8)}
    writers = {t: EventFileWriter(local[t]) for t in (7, 8)}
    for t in (7, 8):
        writers[t].add_scalars(1, {"training/loss": 1.0})
        assert managers[t].sync()
    keys = s3_server.object_keys()
    assert all(k.startswith(f"{PREFIX}/tensorboard/experiment/3/trial/") for k in keys), keys
    assert len(keys) == 2

    logdir = tmp_path / "work" / "logdir"
    sync = TensorboardSync([source_of(3, [7], config, tmp_path / "default")], logdir)
    first = sync.sync()
    assert not first.failed and len(first.created) == 1
    copied = first.created[0]
    assert copied.parent == logdir / "trial_7"
    assert copied.read_bytes() == writers[7].path.read_bytes()
    assert not (logdir / "trial_8").exists()

    with writers[7].path.open("ab") as out:  # the same file grows, as a trial's does
        out.write(tfrecord(encode_event(time.time(), 2, scalars={"training/loss": 0.5})))
    managers[7].sync()
    second = sync.sync()
    assert second.appended == [copied] and not second.created and not second.replaced
    assert copied.read_bytes() == writers[7].path.read_bytes()
    assert sync.sync().appended == []
    for writer in writers.values():
        writer.close()
