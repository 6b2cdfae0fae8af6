"""Determined's Python names, mapped onto cairn, for code that says ``import determined``.

``determined`` here is a small directory of modules (:func:`install_path`), never a package
installed into site-packages: each of its modules is cairn's own (``determined.core`` *is*
``cairn.core``, ``determined.experimental.core_v2`` *is* ``cairn.experimental.core_v2``) or a
thin entry point onto it (``python3 -m determined.launch.torch_distributed`` runs
``cairn.launch.torch_distributed``).

The invariant: **a real ``determined`` always wins.** Two guards keep it:

1. Whoever puts the directory on a path first checks that no ``determined`` is importable
   without it (:func:`determined_importable`), and then puts it *last* on ``PYTHONPATH``: the
   agent does so for every trial process, :func:`enable` for the running interpreter.
2. Should the directory still come first (another interpreter, a container image), the shim's
   ``determined/__init__.py`` looks for another ``determined`` further along ``sys.path`` and,
   if there is one, loads that one in its place (:func:`real_determined_spec`).

Inside a cluster's trials the directory is on the path by itself; outside, it is an explicit
opt-in: ``export PYTHONPATH="$(python -m cairn.compat.determined --install-path)"`` for a shell,
or ``cairn.compat.enable()`` in a program.

This module imports only the standard library: the agent calls it for every run it starts.
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

PACKAGE = "determined"
_SHIM_DIR = Path(__file__).resolve().parent / "pythonpath"


def install_path() -> Path:
    """The directory that holds cairn's ``determined`` package (put it on ``PYTHONPATH``)."""
    return _SHIM_DIR


def _same_dir(entry: str, directory: Path) -> bool:
    try:
        return Path(entry or os.getcwd()).resolve() == directory
    except OSError:
        return False


def real_determined_spec(
    search_path: Sequence[str] | None = None,
) -> importlib.machinery.ModuleSpec | None:
    """The spec of a ``determined`` that is not cairn's, found along ``search_path``.

    Args:
        search_path: the path entries to search (default: ``sys.path``); cairn's directory is
            skipped wherever it appears.

    Returns:
        The spec Python would import, or ``None`` when only cairn's ``determined`` is there.
    """
    entries = [
        entry
        for entry in (sys.path if search_path is None else search_path)
        if not _same_dir(entry, _SHIM_DIR)
    ]
    return importlib.machinery.PathFinder.find_spec(PACKAGE, entries)


@functools.cache
def _importable_from_site() -> bool:
    """Whether this interpreter finds a ``determined`` outside ``PYTHONPATH`` (its site-packages,
    the standard library's directories); computed once per process."""
    from_env = {
        str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    }
    site = [p for p in sys.path if p and str(Path(p).resolve()) not in from_env]
    return real_determined_spec(site) is not None


def determined_importable(python_path: Iterable[str] = ()) -> bool:
    """Whether a real ``determined`` is importable by this interpreter given ``PYTHONPATH``
    entries ``python_path`` (the entries are searched, then this interpreter's site directories).

    This is the cheap check behind "cairn never shadows Determined": a stat or two per entry,
    no subprocess. It speaks for the interpreter it runs in, which is the one the agent puts
    first on its trials' ``PATH``; the shim's own check covers any other.
    """
    entries = [p for p in python_path if p]
    if entries and real_determined_spec(entries) is not None:
        return True
    return _importable_from_site()


def python_path_with_shim(python_path: Sequence[str]) -> list[str]:
    """``python_path`` (``PYTHONPATH`` entries) with cairn's directory appended, unless a real
    ``determined`` is importable without it; then ``python_path`` unchanged."""
    entries = [p for p in python_path if p]
    if determined_importable(entries):
        return entries
    shim = str(_SHIM_DIR)
    return [p for p in entries if p != shim] + [shim]


def enable() -> bool:
    """Makes ``import determined`` work in this interpreter, unless a real one is importable.

    Appends cairn's directory to the end of ``sys.path`` (so anything already there wins) and
    to ``PYTHONPATH`` (so child processes, such as ``python3 -m determined.launch.wrap_rank``,
    see it too).

    Returns:
        True when cairn's ``determined`` is now importable; False when a real ``determined``
        was found and left alone.
    """
    if real_determined_spec() is not None:
        return False
    shim = str(_SHIM_DIR)
    if shim not in sys.path:
        sys.path.append(shim)
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if shim not in current:
        os.environ["PYTHONPATH"] = os.pathsep.join([*current, shim])
    return True


__all__ = [
    "determined_importable",
    "enable",
    "install_path",
    "python_path_with_shim",
    "real_determined_spec",
]
