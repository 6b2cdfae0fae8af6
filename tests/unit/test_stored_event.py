"""The replay's unvalidated constructors build exactly what pydantic's ``model_construct`` does."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from events.log.envelope import Metadata, RecordedEvent, stored_event, stored_metadata
from events.log.store import row_to_event


@pytest.mark.parametrize(
    "meta",
    [
        None,
        {},
        {"actor": "searcher", "epoch": 3},
        {"actor": "api", "correlation_id": "trial-4", "request_ip": "10.0.0.1"},
    ],
)
def test_stored_metadata_equals_validated(meta: dict[str, Any] | None) -> None:
    """Known keys, defaults, extras and the set fields match; so do dumps and equality."""
    fast = stored_metadata(meta)
    slow = Metadata(**meta) if meta else Metadata()  # as validated when it was appended
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_extra == slow.model_extra
    assert fast.model_dump() == slow.model_dump()
    assert fast.model_dump_json(exclude_none=True) == slow.model_dump_json(exclude_none=True)


def test_row_to_event_equals_model_construct() -> None:
    """A row read from the log becomes the same RecordedEvent either way (upcast payload)."""
    row = {
        "position": 7,
        "stream_id": "trial-3",
        "stream_version": 2,
        "event_id": uuid.uuid4(),
        "type": "ValidationReported",
        "schema_version": 1,
        "payload": {"trial_id": 3, "run_id": 1, "steps_completed": 10, "metrics": {"loss": 1.0}},
        "metadata": {"actor": "agent", "epoch": 2},
        "recorded_at": datetime.now(UTC),
    }
    fast = row_to_event(row)
    slow = RecordedEvent.model_construct(
        **{
            **row,
            "schema_version": fast.schema_version,
            "payload": fast.payload,
            "metadata": Metadata.model_construct(**row["metadata"]),
        }
    )
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set
    assert fast.model_dump() == slow.model_dump()
    assert fast.decode() == slow.decode()
    with pytest.raises(Exception, match="frozen"):
        fast.position = 8  # type: ignore[misc]
    assert stored_event(dict(fast.__dict__)) == fast
