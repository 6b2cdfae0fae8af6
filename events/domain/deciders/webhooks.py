"""The webhooks' decider: create one, change its URL, delete it.

Decided over stream ``webhooks`` folded (:class:`~events.domain.aggregates.webhooks.Webhooks`)
and the teams (a workspace must exist). Whether the caller may act is the caller's check
(``EDIT_WEBHOOKS`` on the webhook's workspace, an admin for a global one), and so is whether
the URL's host resolves to an address deliveries may reach (I/O); the URL's shape and the
cluster's allow-list (``webhooks.allowed_urls``, passed in the command) are checked here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from events.domain import lifecycle
from events.domain.aggregates.task import ASSIGNED, QUEUED, RUNNING, TERMINATED
from events.domain.aggregates.teams import Teams
from events.domain.aggregates.webhooks import Webhooks
from events.domain.deciders import Decision, conflict, invalid, not_found
from events.domain.deciders.teams import name_problem
from events.domain.types.webhooks import (
    MAX_TRIGGERS,
    Trigger,
    WebhookCreated,
    WebhookDeleted,
    WebhookMode,
    WebhookType,
    WebhookUrlChanged,
)
from events.domain.webhooks.urls import url_problem

STATES: dict[str, frozenset[str]] = {
    "EXPERIMENT_STATE_CHANGE": lifecycle.STATES,
    "TRIAL_STATE_CHANGE": lifecycle.STATES - lifecycle.DELETION,
    "TASK_STATE_CHANGE": frozenset({QUEUED, ASSIGNED, RUNNING, TERMINATED}),
}
"""The states a state-change trigger's condition may name, per trigger type."""


@dataclass(frozen=True)
class CreateWebhook:
    """Create a webhook.

    Attributes:
        name: unique among the webhooks of its workspace (or among the global ones).
        url: where deliveries are posted.
        webhook_type: the payload shape.
        workspace_id: its workspace (``None``: global).
        mode: ``workspace`` or ``specific``.
        triggers: what fires it (at least one).
        actor: who creates it.
        allowed_urls: the cluster config's ``webhooks.allowed_urls``.
    """

    name: str
    url: str
    webhook_type: WebhookType
    workspace_id: int | None
    mode: WebhookMode
    triggers: tuple[Trigger, ...]
    actor: str
    allowed_urls: tuple[str, ...]


@dataclass(frozen=True)
class ChangeWebhookUrl:
    """Point webhook ``webhook_id`` at ``url`` (checked against ``allowed_urls``)."""

    webhook_id: int
    url: str
    allowed_urls: tuple[str, ...]


@dataclass(frozen=True)
class DeleteWebhook:
    """Delete webhook ``webhook_id``."""

    webhook_id: int


def trigger_problem(index: int, trigger: Trigger, mode: WebhookMode) -> str | None:
    """Why ``trigger`` (the ``index``-th) cannot be one of a ``mode`` webhook's triggers."""
    where = f"triggers[{index}]"
    if trigger.trigger_type == "CUSTOM":
        if trigger.condition:
            return f"{where}.condition: a CUSTOM trigger takes no condition ({{}})"
        if mode != "specific":
            return (
                f"{where}: a CUSTOM trigger needs mode 'specific' (alerts go only to webhooks "
                "an experiment names in integrations.webhooks)"
            )
        return None
    allowed = STATES[trigger.trigger_type]
    if set(trigger.condition) != {"state"}:
        return f'{where}.condition: a state change trigger takes exactly {{"state": "<STATE>"}}'
    state = trigger.condition["state"]
    if state not in allowed:
        return (
            f"{where}.condition.state: {state[:40]!r} is not a state of "
            f"{trigger.trigger_type} (one of {', '.join(sorted(allowed))})"
        )
    return None


def _triggers_problem(triggers: Sequence[Trigger], mode: WebhookMode) -> str | None:
    if not triggers:
        return "triggers: a webhook needs at least one trigger"
    if len(triggers) > MAX_TRIGGERS:
        return f"triggers: at most {MAX_TRIGGERS} (got {len(triggers)})"
    if len({(t.trigger_type, tuple(sorted(t.condition.items()))) for t in triggers}) != len(
        triggers
    ):
        return "triggers: the same trigger is given twice"
    for index, trigger in enumerate(triggers):
        if problem := trigger_problem(index, trigger, mode):
            return problem
    return None


def decide_webhook(
    state: Webhooks, teams: Teams, command: CreateWebhook | ChangeWebhookUrl | DeleteWebhook
) -> Decision:
    """The facts of a webhook command, or why not."""
    if isinstance(command, CreateWebhook):
        if problem := name_problem(command.name, "webhook"):
            return invalid(f"name: {problem}", "name")
        if problem := url_problem(command.url, command.allowed_urls):
            return invalid(problem if problem.startswith("url") else f"url: {problem}", "url")
        if problem := _triggers_problem(command.triggers, command.mode):
            return invalid(problem, "triggers")
        if command.workspace_id is not None and command.workspace_id not in teams.workspaces:
            return not_found(f"no workspace {command.workspace_id}")
        if state.named(command.workspace_id, command.name) is not None:
            scope = "global" if command.workspace_id is None else "this workspace's"
            return conflict(f"name: a {scope} webhook named {command.name!r} exists", "name")
        return [
            WebhookCreated(
                webhook_id=state.last_webhook_id + 1,
                name=command.name,
                url=command.url,
                webhook_type=command.webhook_type,
                workspace_id=command.workspace_id,
                mode=command.mode,
                triggers=list(command.triggers),
                owner=command.actor,
            )
        ]
    hook = state.webhooks.get(command.webhook_id)
    if hook is None:
        return not_found(f"no webhook {command.webhook_id}")
    if isinstance(command, ChangeWebhookUrl):
        if problem := url_problem(command.url, command.allowed_urls):
            return invalid(problem if problem.startswith("url") else f"url: {problem}", "url")
        if command.url == hook.url:
            return []
        return [WebhookUrlChanged(webhook_id=hook.webhook_id, url=command.url)]
    return [WebhookDeleted(webhook_id=hook.webhook_id)]


__all__ = [
    "STATES",
    "ChangeWebhookUrl",
    "CreateWebhook",
    "DeleteWebhook",
    "decide_webhook",
    "trigger_problem",
]
