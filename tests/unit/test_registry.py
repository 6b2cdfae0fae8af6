"""Event registry: every (type, version) has a fixture that decodes; upcasters run before validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from events.domain.authorization import DEFAULT_WORKSPACE_ID
from events.domain.types import AgentRegistered, TaskRequested, TrialExited
from events.log.errors import UnknownEventError
from events.log.registry import decode, known_types, upcast

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "events"


def fixture(event_type: str, version: int) -> dict[str, object]:
    return json.loads((FIXTURES / f"{event_type}.v{version}.json").read_text())


def all_versions() -> list[tuple[str, int]]:
    return [
        (name, v)
        for name, model in known_types().items()
        for v in range(1, model.schema_version + 1)
    ]


def test_every_type_and_version_has_a_fixture() -> None:
    """Each registered event type keeps a fixture payload for every schema version it ever had."""
    missing = [f"{t}.v{v}" for t, v in all_versions() if not (FIXTURES / f"{t}.v{v}.json").exists()]
    assert missing == []


@pytest.mark.parametrize(("event_type", "version"), all_versions())
def test_fixture_decodes_to_current_model(event_type: str, version: int) -> None:
    """Every stored fixture, old or current, decodes into the current model of its type."""
    event = decode(event_type, version, fixture(event_type, version))
    assert type(event).event_type == event_type


def test_v1_trial_exited_is_upcast_to_current() -> None:
    """A v1 TrialExited ({failed: true}) becomes a current one with outcome 'failed'."""
    event = decode("TrialExited", 1, fixture("TrialExited", 1))
    assert isinstance(event, TrialExited)
    assert event.outcome == "failed"
    assert event.exit_code == 3
    assert upcast("TrialExited", 1, {"failed": False, "x": 1, "trial_id": "1.2"}) == {
        "outcome": "completed",
        "x": 1,
        "trial_id": -1_000_002,
    }


def test_old_task_requested_is_upcast_into_the_default_workspace() -> None:
    """A TaskRequested of version 1 (a command) or 2 (a TensorBoard) reads as a task of the
    default workspace, its other fields unchanged."""
    for version in (1, 2):
        event = decode("TaskRequested", version, fixture("TaskRequested", version))
        assert isinstance(event, TaskRequested)
        assert event.workspace_id == DEFAULT_WORKSPACE_ID
        assert event.owner == fixture("TaskRequested", version)["owner"]
    assert upcast("TaskRequested", 2, {"task_id": "ab"}) == {"task_id": "ab", "workspace_id": 1}


def test_v1_model_created_is_upcast_to_the_default_workspace_id() -> None:
    """A version 1 ModelCreated named its workspace "Uncategorized"; it decodes in workspace 1."""
    payload = fixture("ModelCreated", 1)
    assert payload["workspace"] == "Uncategorized"
    event = decode("ModelCreated", 1, payload)
    assert event.schema_version == 2
    assert event.model_dump()["workspace_id"] == 1
    assert "workspace" not in event.model_dump()


def test_v2_agent_registered_is_upcast_to_an_unreserved_agent() -> None:
    """A version 2 AgentRegistered (before ephemeral agents) decodes with ``reserved_for`` None,
    its other fields unchanged; a v3 keeps the allocation it names."""
    payload = fixture("AgentRegistered", 2)
    assert upcast("AgentRegistered", 2, payload) == {**payload, "reserved_for": None}
    event = decode("AgentRegistered", 2, payload)
    assert isinstance(event, AgentRegistered)
    assert event.reserved_for is None
    assert event.incarnation == payload["incarnation"]
    v3 = decode("AgentRegistered", 3, fixture("AgentRegistered", 3))
    assert isinstance(v3, AgentRegistered)
    assert v3.reserved_for == "7.3.0"


def test_future_version_is_refused() -> None:
    """A payload from a newer schema version than this code knows is refused, not guessed at."""
    with pytest.raises(UnknownEventError, match="newer"):
        decode("TrialExited", 99, fixture("TrialExited", 2))


def test_unknown_type_is_refused() -> None:
    """An event type nobody registered cannot be decoded."""
    with pytest.raises(UnknownEventError):
        decode("NoSuchThing", 1, {})


def test_events_are_frozen() -> None:
    """Event payloads are immutable facts."""
    event = decode("TrialExited", 2, fixture("TrialExited", 2))
    with pytest.raises(ValidationError, match="frozen_instance"):
        event.message = "changed"  # type: ignore[misc]
