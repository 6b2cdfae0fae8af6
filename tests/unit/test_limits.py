"""Event size limits: the parts named as too large, and the bus sized to carry every event."""

from __future__ import annotations

from events.log.bus import headers_size
from events.log.limits import BUS_MAX_PAYLOAD, ENVELOPE_ALLOWANCE, MAX_EVENT_BYTES, largest_part


def test_largest_part_names_the_one_huge_field() -> None:
    """A single huge field deep in the payload is named by its full path."""
    payload = {"experiment_id": 1, "config": {"name": "n", "labels": ["a", "b" * 1000]}}
    path, size = largest_part(payload)
    assert path == "config.labels[1]"
    assert size == 1002


def test_largest_part_stops_at_a_mass_of_small_members() -> None:
    """Many small members are named by what holds them, not by one of them."""
    payload = {"trial_id": 11, "metrics": {f"m{i}": float(i) for i in range(1000)}}
    assert largest_part(payload)[0] == "metrics"
    assert largest_part({"a": 1, "b": 2}) == ("", len('{"a":1,"b":2}'))


def test_the_bus_carries_an_event_at_the_limit() -> None:
    """The configured max_payload leaves room for an event at the limit, its envelope and
    headers."""
    headers = {"Nats-Msg-Id": "0" * 36, "Cairn-Position": str(2**62), "Cairn-Stub": "too-large"}
    assert headers_size(headers) < ENVELOPE_ALLOWANCE // 4
    assert MAX_EVENT_BYTES + ENVELOPE_ALLOWANCE <= BUS_MAX_PAYLOAD
