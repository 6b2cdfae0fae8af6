"""The audit trail's pure rules: the rejection flood limiter and the event catalogue."""

from __future__ import annotations

from pathlib import Path

from events.log.catalogue import render
from events.log.envelope import Metadata
from events.log.origin import Origin, bound, set_service, stamp
from services.api.audit_trail import RejectionLimiter

DOCS = Path(__file__).resolve().parents[2] / "docs" / "events.md"


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_limiter_records_a_few_per_caller_and_carries_the_count_of_the_rest() -> None:
    """Past the per-caller cap rejections are only counted; the caller's first recorded one in
    the next window carries how many were suppressed, so the total is never lost."""
    clock = Clock()
    limiter = RejectionLimiter(per_caller=3, overall=100, window=60, clock=clock)
    admitted = [limiter.admit("mallory") for _ in range(10)]
    assert admitted == [0, 0, 0, None, None, None, None, None, None, None]
    assert limiter.admit("alice") == 0
    clock.now = 61
    assert limiter.admit("mallory") == 7
    assert limiter.admit("mallory") == 0


def test_limiter_caps_all_callers_together() -> None:
    """Many callers (e.g. many addresses) together are held to the overall cap per window."""
    clock = Clock()
    limiter = RejectionLimiter(per_caller=5, overall=4, window=60, clock=clock)
    results = [limiter.admit(f"remote:10.0.0.{n}") for n in range(10)]
    assert sum(r is not None for r in results) == 4
    clock.now = 60
    assert limiter.admit("remote:10.0.0.9") == 1


def test_stamp_fills_only_what_the_call_site_left_empty() -> None:
    """A request's actor, id and address fill empty metadata; an explicit actor is kept; outside a
    request the service's name is the actor."""
    set_service("scheduler")
    try:
        assert stamp(Metadata()).actor == "service:scheduler"
        with bound(Origin(request_id="r1", remote="10.1.2.3", actor="alice")):
            filled = stamp(Metadata(causation_id="k"))
            kept = stamp(Metadata(actor="agent:gpu01"))
        assert (filled.actor, filled.request_id, filled.remote) == ("alice", "r1", "10.1.2.3")
        assert filled.causation_id == "k"
        assert (kept.actor, kept.request_id) == ("agent:gpu01", "r1")
    finally:
        set_service(None)
    assert stamp(Metadata()).actor is None


def test_committed_event_catalogue_is_current() -> None:
    """docs/events.md is what `python -m events.log.catalogue` renders from the registry now."""
    assert DOCS.read_text() == render(), (
        "docs/events.md is stale: run `.venv/bin/python -m events.log.catalogue > docs/events.md`"
    )


def test_catalogue_lists_every_type_with_its_fields() -> None:
    """Each registered type has a section with its schema version and every field."""
    from events.log.registry import known_types

    text = render()
    for name, model in known_types().items():
        assert f"### {name}\n" in text
        assert f"Schema version: **{model.schema_version}**" in text
        for field in model.model_fields:
            assert f"| `{field}` |" in text
