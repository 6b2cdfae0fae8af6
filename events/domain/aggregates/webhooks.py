"""The webhooks fold (stream ``webhooks``): every webhook that exists, with its triggers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from events.domain.types.webhooks import (
    WEBHOOK_FACTS,
    Trigger,
    WebhookCreated,
    WebhookDeleted,
    WebhookMode,
    WebhookType,
    WebhookUrlChanged,
)
from events.log.envelope import Event, RecordedEvent


@dataclass
class Webhook:
    """A webhook as folded (``workspace_id`` ``None``: global)."""

    webhook_id: int
    name: str
    url: str
    webhook_type: WebhookType
    workspace_id: int | None
    mode: WebhookMode
    triggers: tuple[Trigger, ...]
    owner: str
    created_at: datetime | None = None


@dataclass
class Webhooks:
    """Stream ``webhooks`` folded, at stream version ``version``."""

    version: int = 0
    webhooks: dict[int, Webhook] = field(default_factory=dict)
    last_webhook_id: int = 0

    def named(self, workspace_id: int | None, name: str) -> Webhook | None:
        """The webhook called ``name`` in workspace ``workspace_id`` (``None``: among the
        global ones), if any."""
        return next(
            (
                w
                for w in self.webhooks.values()
                if w.workspace_id == workspace_id and w.name == name
            ),
            None,
        )

    def in_order(self) -> list[Webhook]:
        """Every webhook, by id."""
        return [self.webhooks[k] for k in sorted(self.webhooks)]


def apply_webhooks(state: Webhooks, recorded: RecordedEvent, event: Event | None = None) -> None:
    """Folds one event of stream ``webhooks`` (``event``: ``recorded`` already decoded)."""
    state.version = max(state.version, recorded.stream_version)
    if recorded.type not in WEBHOOK_FACTS:
        return
    fact = recorded.decode() if event is None else event
    if isinstance(fact, WebhookCreated):
        state.webhooks[fact.webhook_id] = Webhook(
            webhook_id=fact.webhook_id,
            name=fact.name,
            url=fact.url,
            webhook_type=fact.webhook_type,
            workspace_id=fact.workspace_id,
            mode=fact.mode,
            triggers=tuple(fact.triggers),
            owner=fact.owner,
            created_at=recorded.recorded_at,
        )
        state.last_webhook_id = max(state.last_webhook_id, fact.webhook_id)
    elif isinstance(fact, WebhookUrlChanged):
        if hook := state.webhooks.get(fact.webhook_id):
            hook.url = fact.url
    elif isinstance(fact, WebhookDeleted):
        state.webhooks.pop(fact.webhook_id, None)


def fold_webhooks(events: Iterable[RecordedEvent]) -> Webhooks:
    """Folds stream ``webhooks`` (other types only move ``version``)."""
    state = Webhooks()
    for recorded in events:
        apply_webhooks(state, recorded)
    return state


__all__ = ["Webhook", "Webhooks", "apply_webhooks", "fold_webhooks"]
