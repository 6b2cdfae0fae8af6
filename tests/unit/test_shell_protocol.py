"""The shell's control messages: what a client may send and what the server answers, bounded
and checked field by field, so a malformed one is a ControlError naming what was wrong."""

from __future__ import annotations

import json

import pytest

from cairn.tasks.shell_protocol import (
    MAX_CONTROL_CHARS,
    MAX_DIMENSION,
    ControlError,
    Resize,
    exit_message,
    parse_control,
    parse_exit,
    resize_message,
)
from cairn.tasks.shell_server import exit_code_of


def test_a_resize_round_trips_and_an_exit_round_trips() -> None:
    """What the client sends for a resize and the server for an exit parse back to themselves."""
    assert parse_control(resize_message(33, 101)) == Resize(rows=33, cols=101)
    assert parse_control('{"resize": [1, 4096]}') == Resize(rows=1, cols=MAX_DIMENSION)
    assert parse_exit(exit_message(3)) == 3
    assert parse_exit(exit_message(0)) == 0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not JSON"),
        ("{", "not JSON"),
        ("resize 24 80", "not JSON"),
        ("[24, 80]", "not an object with one field"),
        ("null", "not an object with one field"),
        ('{"resize": [24, 80], "exit": 0}', "not an object with one field"),
        ('{"paste": "rm -rf /"}', "unknown control message 'paste'"),
        ('{"resize": "24x80"}', "resize is not a list"),
        ('{"resize": [24]}', "resize is not a list"),
        ('{"resize": [24, 80, 1]}', "resize is not a list"),
        ('{"resize": {"rows": 24, "cols": 80}}', "resize is not a list"),
        ('{"resize": ["24", 80]}', "resize rows is not an integer"),
        ('{"resize": [24, 80.5]}', "resize cols is not an integer"),
        ('{"resize": [true, 80]}', "resize rows is not an integer"),
        ('{"resize": [null, 80]}', "resize rows is not an integer"),
        ('{"resize": [0, 80]}', "resize rows 0 is not between 1 and 4096"),
        ('{"resize": [24, -1]}', "resize cols -1 is not between 1 and 4096"),
        ('{"resize": [24, 65536]}', "resize cols 65536 is not between 1 and 4096"),
        ('{"resize": [24, 1e400]}', "resize cols is not an integer"),
        ('{"resize": [24, ' + "9" * 200 + "]}", "is not between 1 and 4096"),
    ],
)
def test_a_malformed_control_message_is_refused_naming_what_was_wrong(
    text: str, reason: str
) -> None:
    """Not JSON, not one object, an unknown field, a wrong type or an out-of-range size: each
    raises ControlError saying so (never another exception)."""
    with pytest.raises(ControlError) as refused:
        parse_control(text)
    assert reason in str(refused.value)


def test_an_oversized_control_message_is_refused_before_it_is_parsed() -> None:
    """A text frame over MAX_CONTROL_CHARS is refused by its length, even a valid-looking one."""
    padded = '{"resize": [24, 80]' + " " * MAX_CONTROL_CHARS + "}"
    with pytest.raises(ControlError, match="at most 256"):
        parse_control(padded)
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ControlError, match="characters"):
        parse_control(deep)


@pytest.mark.parametrize(
    "text",
    [
        '{"exit": "3"}',
        '{"exit": -1}',
        '{"exit": 256}',
        '{"exit": false}',
        '{"resize": [1, 1]}',
        "{",
    ],
)
def test_a_malformed_exit_message_is_refused(text: str) -> None:
    """The client accepts only {"exit": 0..255} as the server's exit message."""
    with pytest.raises(ControlError):
        parse_exit(text)


def test_an_exit_status_is_reported_as_a_shell_reports_it() -> None:
    """A shell that exited with 7 reports 7; one ended by signal 9 reports 137 (128 + 9)."""
    assert exit_code_of(7) == 7
    assert exit_code_of(-9) == 137
    assert json.loads(exit_message(exit_code_of(-1))) == {"exit": 129}
