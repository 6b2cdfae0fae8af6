"""Size limits of the log and the bus, and the arithmetic that keeps them consistent.

An event's size is the length in bytes of its payload and its metadata as the store encodes them
(compact JSON, ASCII-escaped, so every character counts at least as much as it does in UTF-8).
The store refuses anything larger than :data:`MAX_EVENT_BYTES`, and the bus is configured with a
``max_payload`` that holds an event at that limit together with its envelope (position, ids,
type, timestamps) and headers. The relay still checks each message against the connected
server's actual ``max_payload``, so a log written under another limit cannot wedge it.
"""

from __future__ import annotations

import json
from typing import Any

MAX_EVENT_BYTES = 512 * 1024
"""Largest event the store accepts: its encoded payload plus its encoded metadata, in bytes."""

BUS_MAX_PAYLOAD = 1024 * 1024
"""The ``max_payload`` the NATS server is configured with (and NATS's own default), in bytes."""

ENVELOPE_ALLOWANCE = 16 * 1024
"""Room for what a relayed message adds to an event's payload and metadata: the envelope's other
fields (stream id, ids, type, timestamps) and the headers."""

assert MAX_EVENT_BYTES + ENVELOPE_ALLOWANCE <= BUS_MAX_PAYLOAD, "the bus must carry every event"


def encoded(value: Any) -> str:
    """``value`` as the store writes it: compact, ASCII-escaped JSON."""
    return json.dumps(value, separators=(",", ":"))


def largest_part(payload: Any) -> tuple[str, int]:
    """The dotted path of the part of ``payload`` that makes it large, and that part's size.

    Walks down from the top, into the biggest member at each level, for as long as that member
    holds at least half of its parent; so a single huge field is named exactly (``config.
    description``) while a mass of small ones is named by what contains them (``config.labels``).

    Args:
        payload: a JSON-compatible value (an event payload).

    Returns:
        ``(path, bytes)``; the path is ``""`` when the payload as a whole is the answer.
    """
    path = ""
    value = payload
    size = len(encoded(value))
    while isinstance(value, dict | list) and value:
        members = value.items() if isinstance(value, dict) else enumerate(value)
        sizes = [(len(encoded(v)), k, v) for k, v in members]
        best_size, key, best = max(sizes, key=lambda item: item[0])
        if best_size * 2 < size:
            break
        path = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)
        value, size = best, best_size
    return path, size
