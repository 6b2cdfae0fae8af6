"""Facts on a config template's stream (``template-<name>``).

A template is a partial experiment config that ``experiment create --template NAME`` merges
under the experiment's own config (the experiment's values win).
"""

from __future__ import annotations

from typing import Any

from events.log.envelope import Event
from events.log.registry import register


@register
class TemplateSet(Event):
    """The template ``name`` was created or replaced; ``owner`` created it first."""

    event_type = "TemplateSet"

    name: str
    config: dict[str, Any]
    owner: str
    actor: str = ""


@register
class TemplateRemoved(Event):
    """The template ``name`` was removed."""

    event_type = "TemplateRemoved"

    name: str
    actor: str = ""
