"""What the folds share."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    """An ISO 8601 timestamp, or ``None``."""
    return value.isoformat() if value is not None else None
