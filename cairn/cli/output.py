"""How the CLI prints: aligned tables, ``--json`` documents, key/value blocks and progress.

Human output goes to stdout; a progress bar is drawn on stderr when stderr is a terminal, and
becomes one plain line per change otherwise (so logs and CI output stay readable). A verb that
takes Determined's ``--csv`` prints its tables as CSV (:func:`use_csv`, set once per command).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TextIO

from cairn.errors import UsageError

MISSING = "-"
_CSV = {"on": False}


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Lets ``--json`` also follow the verb (``cairn experiment list --json``)."""
    parser.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )


def add_at_flag(parser: argparse.ArgumentParser) -> None:
    """Adds ``--at WHEN``: show the state as it was at a log position or an ISO 8601 time."""
    parser.add_argument(
        "--at",
        metavar="WHEN",
        default=None,
        help="as it was at a log position (e.g. 1200) or an ISO 8601 time (2026-01-01T12:00Z)",
    )


def add_csv_flag(parser: argparse.ArgumentParser) -> None:
    """Adds Determined's ``--csv``: print the verb's tables as CSV."""
    parser.add_argument("--csv", action="store_true", help="print tables as CSV")


def use_csv(args: argparse.Namespace) -> None:
    """Makes :func:`table` print CSV for the rest of this command when ``--csv`` was given."""
    _CSV["on"] = bool(getattr(args, "csv", False))


def wants_json(args: argparse.Namespace) -> bool:
    """Whether machine output was asked for (``--json`` before or after the verb)."""
    return bool(getattr(args, "json", False))


def print_json(data: Any) -> None:
    """Prints one JSON document."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str))


def confirmed(args: argparse.Namespace, question: str) -> bool:
    """Whether a destructive verb goes ahead: ``--yes`` given, or the user answered yes to
    ``question`` (``not deleted`` printed otherwise).

    Raises:
        UsageError: no ``--yes`` and no terminal to ask on.
    """
    if getattr(args, "yes", False):
        return True
    if not sys.stdin.isatty():
        raise UsageError("deleting needs confirmation: pass --yes")
    if input(f"{question} [y/N] ").strip().lower() in ("y", "yes"):
        return True
    print("not deleted")
    return False


def print_result(args: argparse.Namespace, data: Any, line: str) -> int:
    """Prints a verb's result: ``data`` as JSON when asked for (``--json``), else ``line``.

    Returns:
        The verb's exit status, 0.
    """
    if wants_json(args):
        print_json(data)
    else:
        print(line)
    return 0


def cell(value: Any) -> str:
    """A value as shown in a table cell: ``-`` for nothing, short floats, compact JSON."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value).replace("\n", " ")


def when(value: Any) -> str:
    """An ISO 8601 timestamp shortened to ``YYYY-MM-DD HH:MM:SS`` (local time)."""
    if not value:
        return MISSING
    try:
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone()
    return stamp.strftime("%Y-%m-%d %H:%M:%S")


def table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, out: TextIO | None = None
) -> None:
    """Prints rows under a header, columns aligned; empty cells show ``-``."""
    stream = out or sys.stdout
    body = [[cell(v) for v in row] for row in rows]
    if _CSV["on"]:
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(list(headers))
        writer.writerows([["" if text == MISSING else text for text in row] for row in body])
        return
    widths = [len(h) for h in headers]
    for row in body:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    for row in [list(headers), *body]:
        line = "  ".join(text.ljust(widths[i]) for i, text in enumerate(row))
        print(line.rstrip(), file=stream)


def fields(pairs: Iterable[tuple[str, Any]], *, out: TextIO | None = None) -> None:
    """Prints ``key: value`` lines with the values aligned."""
    items = [(k, cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0) + 1
    for key, value in items:
        print(f"{(key + ':').ljust(width)} {value}", file=out or sys.stdout)


class Progress:
    """A progress bar on stderr (redrawn in place on a terminal, one line per change otherwise).

    Attributes:
        label: what is counted, e.g. ``trials``.
    """

    WIDTH = 30

    def __init__(self, label: str, *, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last: str | None = None
        self._drawn = False

    def update(self, done: int, total: int, note: str = "", fraction: float | None = None) -> None:
        """Shows ``done`` of ``total`` with a note (state, best metric).

        Args:
            done: items finished.
            total: items expected (0 when unknown).
            note: text after the counts.
            fraction: how full the bar is (0..1), when finer than ``done / total``.
        """
        total = max(total, done, 0)
        counts = f"{done}/{total} {self.label}" if total else f"{done} {self.label}"
        text = f"{counts}  {note}".rstrip()
        if self.tty:
            share = done / total if total else 0.0
            if fraction is not None and math.isfinite(fraction):
                share = max(share, min(fraction, 1.0))
            filled = int(self.WIDTH * share)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r\x1b[2K[{bar}] {text}")
            self.stream.flush()
            self._drawn = True
        elif text != self._last:
            print(text, file=self.stream, flush=True)
        self._last = text

    def close(self) -> None:
        """Ends the bar's line (on a terminal)."""
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
