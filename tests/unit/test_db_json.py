"""The database's JSON decoder reads every document exactly as the standard library does."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from events.log.db import loads

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
_documents = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=30,
)


def _same(a: Any, b: Any) -> bool:
    """Equal, with the same types (an int must not come back as a float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(_documents)
def test_loads_matches_the_standard_parser(document: Any) -> None:
    """Any JSON document, big integers included, parses to the same values and types."""
    text = json.dumps(document)
    assert _same(loads(text), json.loads(text))


def test_edge_numbers_parse_as_the_standard_parser_does() -> None:
    """Integers past 64 bits stay exact integers and numbers past a double's range give inf."""
    assert loads('{"a": 123456789012345678901234567890}') == {"a": 123456789012345678901234567890}
    assert loads("[18446744073709551616]") == [2**64]
    assert math.isinf(loads('{"a": 1e400}')["a"])


def test_trusted_construction_equals_validation() -> None:
    """A recorded event built from a stored row without validation equals a validated one."""
    import datetime
    import uuid

    from events.log.envelope import Metadata, RecordedEvent
    from events.log.store import row_to_event

    row = {
        "position": 5,
        "stream_id": "trial-3",
        "stream_version": 2,
        "event_id": uuid.uuid4(),
        "type": "TrialKillRequested",
        "schema_version": 2,
        "payload": {"trial_id": 3, "actor": "ann"},
        "metadata": {"actor": "ann", "request_id": "r-1", "shard": 3},
        "recorded_at": datetime.datetime.now(datetime.UTC),
    }
    built = row_to_event(row)
    validated = RecordedEvent.model_validate({**row, "metadata": Metadata(**row["metadata"])})
    assert built == validated
    assert built.model_dump() == validated.model_dump()
    assert built.metadata.model_fields_set == validated.metadata.model_fields_set
    assert built.metadata.model_extra == {"shard": 3}
    assert row_to_event({**row, "metadata": {}}).metadata == Metadata()
