"""The SDK's plain records (metrics points, users, agents) and how the master's answers
become them."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cairn.errors import CairnError

if TYPE_CHECKING:
    from cairn.client import Client


def _enum(kind: type[enum.Enum], value: Any) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise CairnError(f"the master answered an unknown {kind.__name__}: {value!r}") from None


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


class _MasterObject:
    """An object the master keeps: built from the master's answer when one is at hand, read
    from the master (``reload``) when not."""

    def __init__(self, session: Client, data: Mapping[str, Any] | None) -> None:
        self._session = session
        if data is None:
            self.reload()
        else:
            self._hydrate(data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def reload(self) -> None:
        """Reads the object again from the master."""
        raise NotImplementedError


@dataclass(frozen=True)
class TrialMetrics:
    """One reported point of a trial's metrics.

    Attributes:
        trial_id: the trial.
        trial_run_id: the run (1, 2, ... one per restart) that reported it.
        steps_completed: the steps the point was reported at.
        end_time: when it was reported.
        metrics: the reported values.
        batch_metrics: per-batch values (cairn keeps none: always ``None``).
        group: ``"training"``, ``"validation"``, or a custom group.
    """

    trial_id: int
    trial_run_id: int
    steps_completed: int
    end_time: datetime | None
    metrics: dict[str, Any]
    batch_metrics: list[dict[str, Any]] | None
    group: str


@dataclass(frozen=True)
class CheckpointTrainingMetadata:
    """What trained a checkpoint.

    Attributes:
        experiment_config: the experiment's config.
        experiment_id: the experiment.
        trial_id: the trial.
        hparams: the trial's hyperparameters.
        validation_metrics: the trial's validation at the checkpoint's steps
            (``{"avgMetrics": {...}}`` as Determined shapes it; ``{}`` when none).
        searcher_metric: the searcher metric's value there, if any.
    """

    experiment_config: dict[str, Any]
    experiment_id: int
    trial_id: int
    hparams: dict[str, Any]
    validation_metrics: dict[str, Any]
    searcher_metric: float | None


@dataclass(frozen=True)
class User:
    """A user of the master."""

    username: str
    admin: bool
    active: bool = True


@dataclass(frozen=True)
class Agent:
    """An agent of the cluster.

    Attributes:
        agent_id: the agent's id.
        state: its state as the scheduler sees it.
        enabled: whether work may be placed on it.
        resource_pool: its pool.
        hostname: where it runs.
        slots: its slots' ids.
        busy_slots: how many of them hold an allocation.
    """

    agent_id: str
    state: str
    enabled: bool
    resource_pool: str | None
    hostname: str | None
    slots: list[str]
    busy_slots: int
