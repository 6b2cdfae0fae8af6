"""How a route turns a decider's refusal into its HTTP error (:mod:`services.api.decided`)."""

from __future__ import annotations

import pytest

from events.domain.deciders import Refusal, conflict, invalid, not_found
from services.api.decided import accepted, refusal_error
from services.api.errors import ApiError


@pytest.mark.parametrize(
    ("refusal", "status", "body"),
    [
        (not_found("no trial 3"), 404, {"message": "no trial 3"}),
        (conflict("ended"), 409, {"message": "ended"}),
        (
            invalid("labels: too many", "labels"),
            400,
            {"message": "labels: too many", "path": "labels"},
        ),
        (
            conflict("run 1 exited", "items[0].run_id", code="run_not_current"),
            409,
            {"message": "run 1 exited", "path": "items[0].run_id", "reason": "run_not_current"},
        ),
    ],
)
def test_a_refusal_is_its_status_with_message_path_and_reason(
    refusal: Refusal, status: int, body: dict[str, str]
) -> None:
    """not found -> 404, conflict -> 409, invalid -> 400; the field is the error's path and the
    code its reason."""
    error = refusal_error(refusal)
    assert (error.status, error.body()) == (status, {"error": body})


def test_accepted_passes_events_through_and_raises_a_refusal() -> None:
    """What a decider decided comes back as is; a refusal is raised as its error."""
    assert accepted([]) == []
    with pytest.raises(ApiError) as raised:
        accepted(conflict("no"))
    assert raised.value.status == 409
