"""The config template's deciders: set (create or replace) and remove a named template.

Each ``decide_*`` is pure over the template's folded stream (anything with ``exists`` and
``owner``, e.g. the gateway's ``TemplateView``) and a command. Who may replace or remove a
template (its creator or an admin) is the caller's check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from events.domain.deciders import Decision, not_found
from events.domain.types import TemplateRemoved, TemplateSet


class TemplateState(Protocol):
    """A template's stream folded, as far as deciding goes."""

    @property
    def exists(self) -> bool:
        """Whether the template is set (and not removed since)."""

    @property
    def owner(self) -> str:
        """Who created it."""


@dataclass(frozen=True)
class SetTemplate:
    """Create or replace template ``name`` with a validated partial ``config``."""

    name: str
    config: dict[str, Any]
    actor: str


def decide_set_template(state: TemplateState, command: SetTemplate) -> Decision:
    """``TemplateSet``, owned by its creator (a replacement keeps the template's owner)."""
    owner = state.owner if state.exists else command.actor
    return [TemplateSet(name=command.name, config=command.config, owner=owner, actor=command.actor)]


@dataclass(frozen=True)
class RemoveTemplate:
    """Remove template ``name``."""

    name: str
    actor: str


def decide_remove_template(state: TemplateState, command: RemoveTemplate) -> Decision:
    """``TemplateRemoved``; refused (not found) when there is no such template."""
    if not state.exists:
        return not_found(f"no template {command.name!r}")
    return [TemplateRemoved(name=command.name, actor=command.actor)]
