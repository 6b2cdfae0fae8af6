"""Unpacking code and checkpoint archives: nothing lands outside the target on any Python
(with or without tarfile's ``data`` filter), whatever chain of links, hard links, special files
or sizes an archive holds."""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cairn.cli.checkpoint import extract
from cairn.errors import CairnError
from events.domain.archive import ArchiveError, ArchiveLimits, ArchiveTooLargeError, extract_tar


@dataclass(frozen=True)
class Member:
    """One crafted member: a ``file`` (``data``), ``dir``, ``sym`` or ``hard`` link (``link``),
    or a ``fifo``/``chr``/``blk`` special file; ``mode`` as stored."""

    name: str
    kind: str = "file"
    link: str = ""
    data: bytes = b"x"
    mode: int = 0o644


def archive(*members: Member, compression: str = "gz") -> bytes:
    """A tar holding ``members`` in order, written by hand (tarfile's writer checks nothing)."""
    buf = io.BytesIO()
    kinds = {
        "dir": tarfile.DIRTYPE,
        "sym": tarfile.SYMTYPE,
        "hard": tarfile.LNKTYPE,
        "fifo": tarfile.FIFOTYPE,
        "chr": tarfile.CHRTYPE,
        "blk": tarfile.BLKTYPE,
    }
    with tarfile.open(fileobj=buf, mode=f"w:{compression}") as tar:
        for member in members:
            info = tarfile.TarInfo(member.name)
            info.mode = member.mode
            if member.kind == "file":
                info.size = len(member.data)
                tar.addfile(info, io.BytesIO(member.data))
                continue
            info.type = kinds[member.kind]
            info.linkname = member.link
            tar.addfile(info)
    return buf.getvalue()


def files(*names: str) -> list[Member]:
    return [Member(name, data=name.encode()) for name in names]


@pytest.fixture
def sandbox(tmp_path: Path) -> tuple[Path, Path]:
    """``(target, outside)``: the target directory and a sibling holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    return tmp_path / "dest", outside


def snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every entry under ``directory``: file contents, link targets, ``dir`` for directories."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, names in os.walk(directory):
        for name in dirnames + names:
            path = Path(dirpath) / name
            key = str(path.relative_to(directory))
            if path.is_symlink():
                out[key] = "-> " + os.readlink(path)
            elif path.is_dir():
                out[key] = "dir"
            else:
                out[key] = path.read_bytes()
    return out


def assert_contained(dest: Path, outside: Path) -> None:
    """Nothing outside changed, no link under ``dest`` leads out of it, no special file or
    set-id bit is there, and nothing was made beside the two directories."""
    assert snapshot(outside) == {"secret": b"secret"}
    assert sorted(p.name for p in dest.parent.iterdir()) == ["dest", "outside"]
    top = os.path.realpath(dest)
    for dirpath, dirnames, names in os.walk(dest):
        for name in dirnames + names:
            path = Path(dirpath) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                real = os.path.realpath(path)
                assert real == top or real.startswith(top + "/"), (path, real)
            else:
                assert stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode), path
                assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX), path


@pytest.mark.parametrize("data_filter", [True, False], ids=["data-filter", "no-data-filter"])
def test_safe_members_unpack_the_same_on_every_python(
    sandbox: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, data_filter: bool
) -> None:
    """Files, directories, links inside the target and a hard link (as a copy) unpack, from a
    path or from bytes, with set-id and group/other write bits dropped, whether or not tarfile
    has its ``data`` filter."""
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    dest, outside = sandbox
    data = archive(
        Member("pkg", "dir", mode=0o777),
        Member("pkg/mod.py", data=b"print(1)\n", mode=0o6777),
        Member("pkg/alias.py", "sym", link="mod.py"),
        Member("up", "sym", link="pkg/../pkg"),
        Member("copy.py", "hard", link="pkg/mod.py"),
        Member("./top.txt", data=b"t"),
    )
    path = dest.parent / "code.tar.gz"
    path.write_bytes(data)
    assert extract_tar(path, dest) == ["copy.py", "pkg/mod.py", "top.txt"]
    path.unlink()
    assert (dest / "pkg" / "alias.py").read_bytes() == b"print(1)\n"
    assert (dest / "copy.py").read_bytes() == b"print(1)\n"
    assert (dest / "copy.py").stat().st_ino != (dest / "pkg" / "mod.py").stat().st_ino
    assert stat.S_IMODE((dest / "pkg" / "mod.py").stat().st_mode) == 0o755
    assert extract(data, dest / "cli") == ["copy.py", "pkg/mod.py", "top.txt"]
    assert_contained(dest, outside)


ATTACKS = {
    "dot-dot": [Member("../secret2")],
    "dot-dot inside": [Member("a/../../secret2")],
    "absolute": [Member("/tmp/cairn-absolute-member")],
    "absolute link": [Member("etc", "sym", link="/etc")],
    "link up": [Member("a/l", "sym", link="../../outside")],
    "the chain d/l -> .., d/l/m -> .., d/l/m/x": [
        Member("d", "dir"),
        Member("d/l", "sym", link=".."),
        Member("d/l/m", "sym", link=".."),
        Member("d/l/m/outside/secret", data=b"pwned"),
    ],
    "a file through an inner link": [
        Member("sub", "dir"),
        Member("s", "sym", link="sub"),
        Member("s/x", data=b"x"),
    ],
    "links that escape only together": [
        Member("d", "dir"),
        Member("d/l", "sym", link=".."),
        Member("d/x", "sym", link="l/../outside"),
    ],
    "hard link to an absolute path": [Member("h", "hard", link="/etc/passwd")],
    "hard link up": [Member("h", "hard", link="../outside/secret")],
    "hard link to a link": [Member("l", "sym", link="x"), Member("h", "hard", link="l")],
    "hard link to nothing unpacked": [Member("h", "hard", link="never")],
    "fifo": [Member("pipe", "fifo")],
    "character device": [Member("null", "chr")],
    "block device": [Member("disk", "blk")],
    "a file over a directory": [Member("a", "dir"), Member("a/b"), Member("a")],
}


@pytest.mark.parametrize("data_filter", [True, False], ids=["data-filter", "no-data-filter"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_escape_and_special_file_is_refused(
    sandbox: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, attack: str, data_filter: bool
) -> None:
    """Each crafted archive is refused with an error naming the member, and nothing outside
    the target changed, with or without tarfile's ``data`` filter (3.11.2 has none)."""
    if not data_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    dest, outside = sandbox
    with pytest.raises(tarfile.TarError) as caught:
        extract_tar(archive(*ATTACKS[attack]), dest)
    assert isinstance(caught.value, ArchiveError)
    assert_contained(dest, outside)
    assert not Path("/tmp/cairn-absolute-member").exists()
    with pytest.raises(CairnError, match="cannot unpack the checkpoint"):
        extract(archive(*ATTACKS[attack]), dest.parent / "dest" / "cli")


def test_members_and_bytes_are_bounded(sandbox: tuple[Path, Path]) -> None:
    """More members, or more unpacked bytes (hard link copies counted), than the limits is
    refused saying which; a highly compressed file is measured unpacked."""
    dest, outside = sandbox
    limits = ArchiveLimits(max_members=3, max_bytes=1 << 20)
    with pytest.raises(ArchiveTooLargeError, match="more than 3 members"):
        extract_tar(archive(*files("a", "b", "c", "d")), dest, limits=limits)
    zeros = Member("zeros", data=bytes(2 << 20))
    assert len(archive(zeros)) < 10_000
    with pytest.raises(ArchiveTooLargeError, match=f"more than {1 << 20} bytes"):
        extract_tar(archive(zeros), dest / "z", limits=limits)
    half = Member("half", data=bytes(600_000))
    with pytest.raises(ArchiveTooLargeError):
        extract_tar(archive(half, Member("h2", "hard", link="half")), dest / "h", limits=limits)
    assert_contained(dest, outside)


def test_a_corrupt_archive_is_an_archive_error(sandbox: tuple[Path, Path]) -> None:
    """Garbage, a truncated gzip and a truncated tar are refused as archive errors."""
    dest, _ = sandbox
    whole = archive(*files("a", "b"))
    for data in (b"not an archive at all", whole[: len(whole) // 2], whole[:10]):
        with pytest.raises(ArchiveError):
            extract_tar(data, dest)


COMPONENTS = st.sampled_from(["a", "b", "..", ".", "outside", "secret", ""])
NAMES = st.builds(
    lambda absolute, parts: ("/" if absolute else "") + "/".join(parts),
    st.booleans(),
    st.lists(COMPONENTS, min_size=1, max_size=4),
)
MEMBERS = st.builds(
    Member,
    name=NAMES,
    kind=st.sampled_from(["file", "file", "dir", "sym", "sym", "hard", "fifo"]),
    link=NAMES,
    data=st.just(b"pwned"),
    mode=st.sampled_from([0o644, 0o755, 0o4755, 0o2777, 0o1777]),
)


@settings(
    max_examples=int(os.environ.get("CAIRN_PROPERTY_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(members=st.lists(MEMBERS, min_size=1, max_size=8))
def test_no_archive_reaches_outside_the_target(tmp_path: Path, members: list[Member]) -> None:
    """Any sequence of files, directories, links, hard links and FIFOs named with ``..``,
    ``.``, absolute paths and the outside directory's names either unpacks or is refused with
    an ArchiveError, and either way nothing outside changed and nothing unpacked leads out."""
    case = Path(os.path.realpath(tmp_path)) / f"case-{os.urandom(6).hex()}"
    outside = case / "outside"
    outside.mkdir(parents=True)
    (outside / "secret").write_bytes(b"secret")
    dest = case / "dest"
    with contextlib.suppress(ArchiveError):
        extract_tar(archive(*members), dest)
    assert_contained(dest, outside)
