"""Trial and allocation ids: integers, legacy "E.N" ids mapped once, names that round-trip."""

from __future__ import annotations

import pytest

from events.domain.names import (
    TrialIdError,
    allocation_id,
    coerce_trial_id,
    legacy_parts,
    legacy_trial_id,
    parse_allocation_id,
    parse_trial_id,
    trial_label,
    trial_of_stream,
    trial_stream,
)
from events.log.registry import decode
from tests.unit.test_registry import all_versions, fixture


def test_new_trials_are_named_by_their_integer() -> None:
    """Trial 17's stream is trial-17, its first run allocation 17.1, and both parse back."""
    assert (trial_stream(17), allocation_id(17, 1), trial_label(17)) == ("trial-17", "17.1", "17")
    assert trial_of_stream("trial-17") == 17 and trial_of_stream("experiment-17") is None
    assert parse_allocation_id("17.1") == (17, 1) and parse_trial_id("17") == 17


def test_legacy_ids_map_to_negative_integers_that_keep_their_old_names() -> None:
    """ "9.1" is -9000001, whose stream and allocations keep the names the old log used."""
    assert legacy_trial_id(9, 1) == coerce_trial_id("9.1") == parse_trial_id("9.1") == -9_000_001
    assert legacy_parts(-9_000_001) == (9, 1) and legacy_parts(9) is None
    assert trial_stream(-9_000_001) == "trial-9.1" and allocation_id(-9_000_001, 2) == "9.1.2"
    assert parse_allocation_id("9.1.2") == (-9_000_001, 2)
    assert trial_of_stream("trial-9.1") == -9_000_001
    assert coerce_trial_id(17) == 17 and parse_trial_id("-9000001") == -9_000_001


@pytest.mark.parametrize("text", ["", "x", "1.2.3", "0", "1.0", "99999999999999999999", "17.a"])
def test_malformed_trial_ids_are_refused(text: str) -> None:
    """Anything but an integer or a legacy "E.N" is not a trial id."""
    with pytest.raises(TrialIdError):
        parse_trial_id(text)


@pytest.mark.parametrize("text", ["17", "17.", "7.1.a1", "x.1", "17.1.2.3"])
def test_malformed_allocation_ids_are_refused(text: str) -> None:
    """An allocation id is a trial label, a dot and a run number."""
    with pytest.raises(TrialIdError):
        parse_allocation_id(text)


@pytest.mark.parametrize(("event_type", "version"), all_versions())
def test_every_stored_trial_id_decodes_to_an_integer(event_type: str, version: int) -> None:
    """Each fixture, old ("7.1") or current (17), decodes with an integer trial id."""
    event = decode(event_type, version, fixture(event_type, version))
    trial_id = getattr(event, "trial_id", None)
    if trial_id is not None:
        assert type(trial_id) is int
        assert trial_id in (17, -7_000_001)
