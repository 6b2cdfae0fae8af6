"""``python3 -m cairn.launch.wrap_rank [--no-redirect-stdio] RANK [--] COMMAND...``.

Runs ``COMMAND`` and copies its output, each line prefixed with ``[rank=N] `` (stdout to stdout,
stderr to stderr), so the lines of a worker stay attributable once several ranks share one log.
This is what Determined's ``determined.launch.wrap_rank`` does, and custom launchers (the Core
API tutorial's stage 4) start each worker with it.

``RANK`` is an integer, or a comma-separated list of environment variable names tried in order
(``RANK,OMPI_COMM_WORLD_RANK``). A carriage return ends a line as a newline does (progress bars
stay readable), and a line is cut every :data:`MAX_LINE` bytes. ``--no-redirect-stdio`` is
accepted and changes nothing: a cairn trial's output is always its processes' own. SIGTERM and
SIGINT are passed on to the command; the exit status is the command's (``128 + N`` when signal N
ended it).
"""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import IO

MAX_LINE = io.DEFAULT_BUFFER_SIZE
_LINE_END = re.compile(rb"\r\n|\r|\n")
USAGE = "usage: python3 -m determined.launch.wrap_rank [--no-redirect-stdio] RANK [--] COMMAND..."


class WrapRankError(Exception):
    """The arguments do not name a rank and a command."""


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[int, list[str]]:
    """``(rank, command)`` from the arguments.

    Raises:
        WrapRankError: no rank, no command, or none of the named variables is set.
    """
    words = list(argv)
    while words and words[0] == "--no-redirect-stdio":
        words.pop(0)
    if not words:
        raise WrapRankError(USAGE)
    spec, command = words[0], words[1:]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise WrapRankError(f"no command to run\n{USAGE}")
    if spec.isdigit():
        return int(spec), command
    for name in spec.split(","):
        raw = environ.get(name.strip(), "").strip()
        if raw:
            try:
                return int(raw), command
            except ValueError:
                raise WrapRankError(f"{name}={raw!r} is not an integer rank") from None
    raise WrapRankError(f"RANK is {spec!r}, but none of those environment variables is set")


def lines(chunks: Iterator[bytes], limit: int = MAX_LINE) -> Iterator[bytes]:
    """Splits a byte stream into lines ending at ``\\n``, ``\\r`` or ``\\r\\n`` (each yielded
    without its ending), cutting any line longer than ``limit`` bytes."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        while True:
            match = _LINE_END.search(pending)
            if match is None or (match.group() == b"\r" and match.end() == len(pending)):
                break  # a lone "\r" at the end may be the first half of "\r\n"
            line, pending = pending[: match.start()], pending[match.end() :]
            while len(line) > limit:
                yield line[:limit]
                line = line[limit:]
            yield line
        while len(pending) > limit:
            yield pending[:limit]
            pending = pending[limit:]
    if pending:
        yield pending.rstrip(b"\r")


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    fd = stream.fileno()
    while True:
        data = os.read(fd, MAX_LINE)
        if not data:
            return
        yield data


def _forward(src: IO[bytes], dst: IO[str], rank: int) -> None:
    prefix = f"[rank={rank}] ".encode()
    out = dst.fileno()
    for line in lines(_chunks(src)):
        os.write(out, prefix + line + b"\n")


def run(rank: int, command: Sequence[str]) -> int:
    """Runs ``command`` with its output prefixed by ``rank``; returns its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        print(f"wrap_rank: cannot run {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    assert proc.stdout is not None and proc.stderr is not None

    def forward_signal(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward_signal)
    signal.signal(signal.SIGINT, forward_signal)
    pumps = [
        threading.Thread(target=_forward, args=(proc.stdout, sys.stdout, rank), daemon=True),
        threading.Thread(target=_forward, args=(proc.stderr, sys.stderr, rank), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    code = proc.wait()
    for pump in pumps:
        pump.join()
    return 128 - code if code < 0 else code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the command's exit status (2 for a usage error)."""
    words = sys.argv[1:] if argv is None else argv
    if list(words[:1]) in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        rank, command = parse(words, os.environ)
    except WrapRankError as exc:
        print(f"wrap_rank: {exc}", file=sys.stderr)
        return 2 if "usage" in str(exc) else 1
    return run(rank, command)


if __name__ == "__main__":
    sys.exit(main())
