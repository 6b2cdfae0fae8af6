"""Unpacking code and checkpoint archives: the same safety with or without the ``data`` filter."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from cairn.cli.checkpoint import extract
from cairn.errors import CairnError
from events.archive import extract_tar


def archive(members: dict[str, bytes]) -> bytes:
    """A tar.gz holding ``members`` (name -> content)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("data_filter", [True, False], ids=["data-filter", "older-python"])
def test_extract_tar_unpacks_safe_members_and_refuses_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_filter: bool
) -> None:
    """Files land under the target; a member escaping it is refused, also on Pythons without
    ``tarfile.data_filter`` (Debian 12's 3.11.2, which the cairn images run)."""
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    path = tmp_path / "code.tgz"
    path.write_bytes(archive({"a/train.py": b"print(1)\n"}))
    assert extract_tar(path, tmp_path / "from-path") == ["a/train.py"]
    assert extract(archive({"ckpt/state.pt": b"x"}), tmp_path / "cli") == ["ckpt/state.pt"]
    assert (tmp_path / "cli" / "ckpt" / "state.pt").read_bytes() == b"x"
    with pytest.raises(tarfile.TarError):
        extract_tar(archive({"../evil.py": b"x"}), tmp_path / "escape")
    with pytest.raises(CairnError, match="cannot unpack"):
        extract(archive({"../evil.py": b"x"}), tmp_path / "cli-escape")
    assert not (tmp_path / "evil.py").exists()
