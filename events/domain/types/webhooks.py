"""Facts on the stream of webhooks (``webhooks``): a webhook created, its URL changed, deleted.

A webhook is an HTTP endpoint told about what happens to experiments, trials and tasks (see
``docs/webhooks.md``). All of them live on one stream because a name is unique within its
workspace and ids are the next free one; webhooks change rarely, so one stream costs nothing.
Only a webhook's URL changes after creation (Determined's rule): anything else is a delete and
a create.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from events.log.envelope import Event
from events.log.registry import register

WEBHOOKS_STREAM = "webhooks"
"""The one stream the types of this module are appended to."""

MAX_URL = 2048
"""The longest webhook URL (characters)."""
MAX_TRIGGERS = 16
"""The most triggers one webhook has."""

WebhookType = Literal["default", "slack"]
"""The payload shape: Determined's default JSON, or Slack's Block Kit."""
WebhookMode = Literal["workspace", "specific"]
"""``workspace``: every experiment and task in scope; ``specific``: only the experiments whose
config names the webhook (``integrations.webhooks``)."""
TriggerType = Literal[
    "EXPERIMENT_STATE_CHANGE", "TRIAL_STATE_CHANGE", "TASK_STATE_CHANGE", "CUSTOM"
]
"""What fires a webhook: an experiment, trial or task entering a state, or an alert the
training code raised (``ctx.alert``)."""


class Trigger(BaseModel):
    """One thing a webhook is told about.

    Attributes:
        trigger_type: what kind of happening.
        condition: ``{"state": "COMPLETED"}`` for a state change; ``{}`` for ``CUSTOM``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    trigger_type: TriggerType
    condition: dict[str, str] = Field(default_factory=dict, max_length=4)


@register
class WebhookCreated(Event):
    """``owner`` created webhook ``webhook_id`` in workspace ``workspace_id`` (``None``: a
    global webhook, for every workspace)."""

    event_type = "WebhookCreated"

    webhook_id: int
    name: str = Field(max_length=80)
    url: str = Field(max_length=MAX_URL)
    webhook_type: WebhookType = "default"
    workspace_id: int | None = None
    mode: WebhookMode = "workspace"
    triggers: list[Trigger] = Field(min_length=1, max_length=MAX_TRIGGERS)
    owner: str


@register
class WebhookUrlChanged(Event):
    """Webhook ``webhook_id`` posts to ``url`` from now on (deliveries not yet made too)."""

    event_type = "WebhookUrlChanged"

    webhook_id: int
    url: str = Field(max_length=MAX_URL)


@register
class WebhookDeleted(Event):
    """Webhook ``webhook_id`` was deleted: nothing more is delivered to it."""

    event_type = "WebhookDeleted"

    webhook_id: int


WEBHOOK_FACTS = ("WebhookCreated", "WebhookUrlChanged", "WebhookDeleted")
"""Every type of this module (what the webhooks fold reads)."""
