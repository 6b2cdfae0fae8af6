"""The bodies webhooks are sent: Determined's default JSON, and Slack's Block Kit.

Default (``webhook_type: default``)::

    {"event_id": "<delivery id>", "delivery_id": "<delivery id>",
     "event_type": "EXPERIMENT_STATE_CHANGE", "timestamp": 1700000000,
     "condition": {"state": "COMPLETED"},
     "event_data": {"experiment": {"id": 7, "state": "COMPLETED", "name": "mnist",
                                   "duration": 312, "resource_pool": "", "slots_per_trial": 1,
                                   "workspace": "vision", "project": "detection"}}}

``event_id`` is the delivery id (Determined's field, kept for receivers written for it), equal
to ``delivery_id`` and to the ``X-Cairn-Delivery`` header; ``timestamp`` is when the event was
recorded, in unix seconds. ``event_data`` holds ``experiment`` (with ``trial_id`` for a trial's
happening or an alert), ``trial`` (``{id, state}``) for a trial state change, ``task``
(``{task_id, kind, owner, state, outcome, workspace_id}``) for a task, and ``custom_data``
(``{title, description, level}``) for an alert. A test delivery carries
``event_data.data: "test"``.

A body is built once, when the delivery is queued, and sent byte for byte on every attempt.
"""

from __future__ import annotations

from typing import Any

from events.domain.webhooks.matching import ExperimentFacts, Happening

LEVELS = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR"}
"""``ctx.alert`` levels as payloads name them."""

COLORS = {"COMPLETED": "#13B670", "ERROR": "#DD5040"}
"""Slack attachment colours by state (others: :data:`OTHER_COLOR`)."""
OTHER_COLOR = "#009BDE"


def _experiment(facts: ExperimentFacts, trial_id: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": facts.experiment_id,
        "state": facts.state,
        "name": facts.name,
        "duration": facts.duration,
        "resource_pool": facts.resource_pool,
        "slots_per_trial": facts.slots_per_trial,
        "workspace": facts.workspace,
        "project": facts.project,
    }
    if trial_id is not None:
        out["trial_id"] = trial_id
    return out


def event_data(happening: Happening) -> dict[str, Any]:
    """The ``event_data`` of a default payload."""
    data: dict[str, Any] = {}
    if happening.experiment is not None:
        data["experiment"] = _experiment(happening.experiment, happening.trial_id)
    if happening.trigger_type == "TRIAL_STATE_CHANGE":
        data["trial"] = {"id": happening.trial_id, "state": happening.state}
    if happening.task is not None:
        task = happening.task
        data["task"] = {
            "task_id": task.task_id,
            "kind": task.kind,
            "owner": task.owner,
            "state": task.state,
            "outcome": task.outcome,
            "workspace_id": task.workspace_id,
        }
    if happening.alert is not None:
        alert = happening.alert
        data["custom_data"] = {
            "title": alert.title,
            "description": alert.description,
            "level": LEVELS.get(alert.level, alert.level.upper()),
        }
    return data


def default_body(delivery_id: str, happening: Happening) -> dict[str, Any]:
    """The default JSON body of ``happening``'s delivery ``delivery_id``."""
    return {
        "event_id": delivery_id,
        "delivery_id": delivery_id,
        "event_type": happening.trigger_type,
        "timestamp": int(happening.at.timestamp()),
        "condition": {} if happening.state is None else {"state": happening.state},
        "event_data": event_data(happening),
    }


def _status_line(happening: Happening) -> str:
    experiment = happening.experiment
    name = f"{experiment.name} (#{experiment.experiment_id})" if experiment else ""
    if happening.trigger_type == "CUSTOM":
        return f"Alert from trial {happening.trial_id} of experiment {name}"
    if happening.trigger_type == "TRIAL_STATE_CHANGE":
        return f"Trial {happening.trial_id} of experiment {name} is now {happening.state}"
    if happening.task is not None:
        task = happening.task
        return f"{task.kind.capitalize()} {task.task_id} of {task.owner} is now {task.state}"
    if happening.state == "COMPLETED":
        return f"Experiment {name} completed"
    if happening.state == "ERROR":
        return f"Experiment {name} stopped with an error"
    return f"Experiment {name} is now {happening.state}"


def _mrkdwn(text: str) -> str:
    """``text`` safe in Slack's mrkdwn: ``&``, ``<`` and ``>`` escaped, so a name cannot make a
    link or a mention."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _hours(seconds: int) -> str:
    return f"{seconds // 3600}h {seconds % 3600 // 60}min"


def slack_body(happening: Happening, base_url: str | None = None) -> dict[str, Any]:
    """The Slack Block Kit body of ``happening`` (``base_url``: the web UI, for links)."""
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "plain_text", "text": _status_line(happening)}}
    ]
    if happening.alert is not None:
        alert = happening.alert
        blocks[0]["fields"] = [
            {"type": "mrkdwn", "text": f"*Level*: {LEVELS.get(alert.level, alert.level)}"},
            {"type": "mrkdwn", "text": f"*Title*: {_mrkdwn(alert.title)}"},
            {"type": "mrkdwn", "text": f"*Description*: {_mrkdwn(alert.description)}"},
        ]
    experiment = happening.experiment
    if experiment is None:
        return {"blocks": blocks}
    state = experiment.state if happening.trigger_type != "TRIAL_STATE_CHANGE" else happening.state
    mark = {"COMPLETED": "✅ ", "ERROR": "❌ "}.get(state or "", "")
    title = f"{_mrkdwn(experiment.name)} (#{experiment.experiment_id})"
    if base_url:
        link = f"{base_url.rstrip('/')}/#/experiments/{experiment.experiment_id}"
        title = f"<{link}|{title}>"
    fields = [
        {"type": "mrkdwn", "text": f"*Status*: {state}"},
        {"type": "mrkdwn", "text": f"*Duration*: {_hours(experiment.duration)}"},
        {"type": "mrkdwn", "text": f"*Workspace*: {_mrkdwn(experiment.workspace)}"},
        {"type": "mrkdwn", "text": f"*Project*: {_mrkdwn(experiment.project)}"},
    ]
    if happening.trial_id is not None:
        fields.append({"type": "mrkdwn", "text": f"*Trial ID*: {happening.trial_id}"})
    attachment = {
        "color": COLORS.get(state or "", OTHER_COLOR),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": mark + title}, "fields": fields}
        ],
    }
    return {"blocks": blocks, "attachments": [attachment]}


def body_for(
    webhook_type: str, delivery_id: str, happening: Happening, base_url: str | None = None
) -> dict[str, Any]:
    """The body a ``webhook_type`` webhook is sent for ``happening``."""
    if webhook_type == "slack":
        return slack_body(happening, base_url)
    return default_body(delivery_id, happening)


def ping_body(webhook_type: str, delivery_id: str, timestamp: int) -> dict[str, Any]:
    """The body of a test delivery (``POST /api/v1/webhooks/{id}/test``)."""
    if webhook_type == "slack":
        return {
            "blocks": [
                {"type": "section", "text": {"type": "plain_text", "text": "Test from cairn"}}
            ]
        }
    return {
        "event_id": delivery_id,
        "delivery_id": delivery_id,
        "event_type": "EXPERIMENT_STATE_CHANGE",
        "timestamp": timestamp,
        "condition": {"state": "COMPLETED"},
        "event_data": {"data": "test"},
    }


__all__ = ["body_for", "default_body", "event_data", "ping_body", "slack_body"]
