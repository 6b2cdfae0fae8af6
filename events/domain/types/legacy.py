"""Upcasting helpers shared by the event modules: the legacy ``"E.N"`` trial id to an integer."""

from __future__ import annotations

from typing import Any

from events.domain.names import TrialIdError, coerce_trial_id, legacy_parts, parse_trial_id
from events.log.errors import UnknownEventError


def integer_trial_id(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` with its ``trial_id`` as an integer (see :mod:`events.domain.names` for the mapping).

    Raises:
        UnknownEventError: the stored ``trial_id`` is not a trial id at all.
    """
    try:
        return {**payload, "trial_id": coerce_trial_id(payload["trial_id"])}
    except (KeyError, TrialIdError) as exc:
        raise UnknownEventError(f"stored trial_id is unreadable: {exc}") from exc


def legacy_ordinal(trial_id: object) -> int:
    """The per-experiment ordinal ``N`` of a legacy ``"E.N"`` id (0 for anything else)."""
    if not isinstance(trial_id, str):
        return 0
    parts = legacy_parts(parse_trial_id(trial_id))
    return 0 if parts is None else parts[1]
