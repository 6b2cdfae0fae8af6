"""What happened, as webhooks see it, and which webhooks it fires.

A :class:`Happening` is built by the tracker's webhook consumer from one event of the log and
the folds around it (the experiment or task it concerns, the teams); :func:`firing` then picks
the webhooks and the trigger of each that match, by Determined's rules:

- an experiment whose config sets ``integrations.webhooks.exclude: true`` fires nothing;
- a workspace webhook fires only for what is in its workspace, a global one for everything;
- a ``specific`` webhook fires only for experiments whose ``integrations.webhooks`` names its
  id (``webhook_id``) or its name (``webhook_name``); tasks name none, so only ``workspace``
  webhooks hear of tasks;
- a trigger matches when its type is the happening's and its condition's ``state`` is the
  state entered (``CUSTOM``: any alert).

One happening makes at most one delivery per webhook, for its first matching trigger.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.domain.aggregates.webhooks import Webhook
from events.domain.types.webhooks import Trigger, TriggerType

DELIVERY_NAMESPACE = uuid.UUID("5f0c1b9e-6f1e-4d2a-9a51-2f7c2b8e4c11")
"""The namespace of delivery ids (:func:`delivery_id`)."""


@dataclass(frozen=True)
class OptIn:
    """An experiment's ``integrations.webhooks``: the webhooks it names, and ``exclude``."""

    webhook_ids: frozenset[int] = frozenset()
    webhook_names: frozenset[str] = frozenset()
    exclude: bool = False

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> OptIn:
        """The opt-in of a stored experiment config (none when it sets nothing usable)."""
        integrations = config.get("integrations")
        hooks = integrations.get("webhooks") if isinstance(integrations, Mapping) else None
        if not isinstance(hooks, Mapping):
            return cls()
        ids = hooks.get("webhook_id") or []
        names = hooks.get("webhook_name") or []
        return cls(
            webhook_ids=frozenset(i for i in ids if isinstance(i, int) and not isinstance(i, bool)),
            webhook_names=frozenset(n for n in names if isinstance(n, str)),
            exclude=hooks.get("exclude") is True,
        )

    def names(self, hook: Webhook) -> bool:
        """Whether the experiment opted in to ``hook``."""
        return hook.webhook_id in self.webhook_ids or hook.name in self.webhook_names


@dataclass(frozen=True)
class ExperimentFacts:
    """An experiment as a webhook payload describes it.

    Attributes:
        experiment_id: its id.
        name: its name.
        state: its state after the happening.
        owner: who submitted it.
        workspace_id: its workspace (through its project).
        workspace: that workspace's name.
        project: its project's name.
        resource_pool: its resource pool ('' for the default one).
        slots_per_trial: its trials' slots.
        duration: seconds from submission to its end (0 until it ended).
        opt_in: its config's ``integrations.webhooks``.
    """

    experiment_id: int
    name: str
    state: str
    owner: str
    workspace_id: int
    workspace: str
    project: str
    resource_pool: str = ""
    slots_per_trial: int = 1
    duration: int = 0
    opt_in: OptIn = field(default_factory=OptIn)


@dataclass(frozen=True)
class TaskFacts:
    """A task (a notebook, shell, command or TensorBoard) as a payload describes it."""

    task_id: str
    kind: str
    owner: str
    state: str
    outcome: str | None = None
    workspace_id: int = 1


@dataclass(frozen=True)
class Alert:
    """What the training code said with ``ctx.alert``."""

    title: str
    description: str
    level: str


@dataclass(frozen=True)
class Happening:
    """One event of the log as webhooks see it.

    Attributes:
        event_id: the id of the event it comes from (with a webhook's id, the delivery id).
        position: that event's position in the log.
        at: when the event was recorded.
        trigger_type: what kind of happening.
        state: the state entered (state changes; ``None`` for an alert).
        experiment: the experiment (experiment and trial happenings, alerts).
        trial_id: the trial (trial happenings, alerts).
        task: the task (task happenings).
        alert: the alert (``CUSTOM``).
    """

    event_id: str
    position: int
    at: datetime
    trigger_type: TriggerType
    state: str | None = None
    experiment: ExperimentFacts | None = None
    trial_id: int | None = None
    task: TaskFacts | None = None
    alert: Alert | None = None

    @property
    def workspace_id(self) -> int:
        """The workspace of what it concerns."""
        if self.experiment is not None:
            return self.experiment.workspace_id
        return self.task.workspace_id if self.task is not None else 1


def delivery_id(event_id: str, webhook_id: int) -> str:
    """The id of the delivery of event ``event_id`` to webhook ``webhook_id``: the same on every
    attempt, after a restart, and when the log is consumed again."""
    return str(uuid.uuid5(DELIVERY_NAMESPACE, f"{event_id}:{webhook_id}"))


def _matches(trigger: Trigger, happening: Happening) -> bool:
    if trigger.trigger_type != happening.trigger_type:
        return False
    if trigger.trigger_type == "CUSTOM":
        return True
    return trigger.condition.get("state") == happening.state


def firing(webhooks: Iterable[Webhook], happening: Happening) -> list[tuple[Webhook, Trigger]]:
    """The webhooks ``happening`` fires, by id, each with its first matching trigger."""
    experiment = happening.experiment
    if experiment is not None and experiment.opt_in.exclude:
        return []
    out: list[tuple[Webhook, Trigger]] = []
    for hook in sorted(webhooks, key=lambda w: w.webhook_id):
        if hook.workspace_id is not None and hook.workspace_id != happening.workspace_id:
            continue
        if hook.mode == "specific" and (experiment is None or not experiment.opt_in.names(hook)):
            continue
        trigger = next((t for t in hook.triggers if _matches(t, happening)), None)
        if trigger is not None:
            out.append((hook, trigger))
    return out


__all__ = [
    "Alert",
    "ExperimentFacts",
    "Happening",
    "OptIn",
    "TaskFacts",
    "delivery_id",
    "firing",
]
