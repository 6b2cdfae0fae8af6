"""What a shell's server (:mod:`cairn.tasks.shell_server`) and its clients
(:mod:`cairn.cli.shell_attach`) agree on: the paths, the frames, the control messages.

A session is one WebSocket on ``<prefix>terminal`` (the prefix is ``/proxy/<task_id>/``, which the
API's proxy forwards unchanged). Binary frames carry bytes both ways: the client's are written to
the pty (keystrokes, ``\\x03`` for Ctrl-C), the server's are what the pty printed. Text frames
carry small JSON objects: the client sends ``{"resize": [rows, cols]}``, the server sends
``{"exit": code}`` once the shell exited and then closes the socket. Every text frame is parsed
here, bounded in size and checked field by field, so a malformed one is refused by a
:class:`ControlError` naming what was wrong, never by a crash of whoever reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

TERMINAL_PATH = "terminal"
"""A session's WebSocket, below the task's prefix."""

STATUS_PATH = "api/status"
"""The server's activity (``connections``, ``last_activity``), below the task's prefix: what the
agent's idle watch reads."""

MAX_CONTROL_CHARS = 256
"""The longest text frame either end accepts as a control message."""

MAX_INPUT_FRAME = 1024 * 1024
"""The largest frame the server accepts (a larger one closes the socket with 1009)."""

MAX_DIMENSION = 4096
"""The most rows or columns a resize may ask for."""


class ControlError(ValueError):
    """A text frame that is no valid control message; the message says what was wrong."""


@dataclass(frozen=True)
class Resize:
    """The client's terminal has ``rows`` rows and ``cols`` columns."""

    rows: int
    cols: int


def resize_message(rows: int, cols: int) -> str:
    """The control message announcing a terminal of ``rows`` x ``cols``."""
    return json.dumps({"resize": [rows, cols]})


def exit_message(code: int) -> str:
    """The control message announcing that the shell exited with ``code``."""
    return json.dumps({"exit": code})


def _object(text: str) -> dict[str, object]:
    if len(text) > MAX_CONTROL_CHARS:
        raise ControlError(
            f"control message of {len(text)} characters (at most {MAX_CONTROL_CHARS})"
        )
    try:
        doc = json.loads(text)
    except ValueError:
        raise ControlError("control message is not JSON") from None
    if not isinstance(doc, dict) or len(doc) != 1:
        raise ControlError("control message is not an object with one field")
    return doc


def _integer(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ControlError(f"{what} is not an integer")
    if not low <= value <= high:
        raise ControlError(f"{what} {value} is not between {low} and {high}")
    return value


def parse_control(text: str) -> Resize:
    """The client's control message in ``text`` (today only ``{"resize": [rows, cols]}``).

    Raises:
        ControlError: ``text`` is too long, no JSON object, names another field, or its rows
            and columns are not two integers between 1 and :data:`MAX_DIMENSION`.
    """
    doc = _object(text)
    size = doc.get("resize")
    if "resize" not in doc:
        raise ControlError(f"unknown control message {next(iter(doc))[:40]!r}")
    if not isinstance(size, list) or len(size) != 2:
        raise ControlError("resize is not a list [rows, cols]")
    return Resize(
        rows=_integer(size[0], "resize rows", 1, MAX_DIMENSION),
        cols=_integer(size[1], "resize cols", 1, MAX_DIMENSION),
    )


def parse_exit(text: str) -> int:
    """The exit code in the server's control message ``text`` (``{"exit": code}``).

    Raises:
        ControlError: ``text`` is no such message.
    """
    doc = _object(text)
    if "exit" not in doc:
        raise ControlError(f"unknown control message {next(iter(doc))[:40]!r}")
    return _integer(doc["exit"], "exit code", 0, 255)
