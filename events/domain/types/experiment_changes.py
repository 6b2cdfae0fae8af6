"""Facts a user records on an experiment's stream after submitting it: its name, description,
labels and scheduling resources, a request to delete some of its checkpoints, and continuing it
after it ended.

Each is folded over the submitted config by every reader that shows or uses the changed value
(the gateway's experiment view, the scheduler, the tracker's projections), so the effective
config is always the submitted one with these changes applied in log order.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from events.domain.config.experiment_settings import ExperimentSettings
from events.domain.types.legacy import integer_trial_id
from events.log.envelope import Event
from events.log.registry import register, upcaster

ResourceField = Literal["priority", "weight", "max_slots"]


@register
class ExperimentRenamed(Event):
    """A user gave the experiment a new name."""

    event_type = "ExperimentRenamed"

    experiment_id: int
    name: str
    actor: str = ""


@register
class ExperimentMoved(Event):
    """A user moved the experiment from project ``from_project_id`` to ``project_id``."""

    event_type = "ExperimentMoved"

    experiment_id: int
    project_id: int
    from_project_id: int
    actor: str = ""


@register
class ExperimentDescribed(Event):
    """A user gave the experiment a new description."""

    event_type = "ExperimentDescribed"

    experiment_id: int
    description: str
    actor: str = ""


@register
class ExperimentLabelsChanged(Event):
    """The experiment's labels are now ``labels`` (``added`` / ``removed``: what this change did)."""

    event_type = "ExperimentLabelsChanged"

    experiment_id: int
    labels: list[str]
    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    actor: str = ""


@register
class ExperimentResourcesChanged(Event):
    """A user changed how the experiment competes for slots.

    ``resources`` names only the fields that changed, with their new value under the config's
    ``resources`` section; ``max_slots: null`` lifts the cap.
    """

    event_type = "ExperimentResourcesChanged"

    experiment_id: int
    resources: dict[ResourceField, int | float | None]
    actor: str = ""


@register
class CheckpointsDeleteRequested(Event):
    """A user asked for these checkpoints of the experiment to be deleted; the tracker's GC
    removes their files and records ``CheckpointsDeleted``."""

    event_type = "CheckpointsDeleteRequested"

    experiment_id: int
    uuids: list[str]
    actor: str = ""


class ContinuedTrial(BaseModel):
    """One trial a continue reopens: it trains on from its latest checkpoint with ``hparams``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trial_id: int
    hparams: dict[str, Any]


@register
class ExperimentContinued(Event):
    """A user continued an ended experiment: it is ACTIVE again, with ``config`` as its config
    from now on, and each of ``trials`` trains on from its latest checkpoint (a single-trial
    experiment's one trial; of a search, the trials that did not complete). v1 stored one
    ``trial_id`` as ``"<experiment>.<n>"``; v2 stored one integer ``trial_id`` and its
    ``hparams``."""

    event_type = "ExperimentContinued"
    schema_version = 3

    experiment_id: int
    trials: list[ContinuedTrial] = Field(min_length=1)
    config: dict[str, Any]
    actor: str = ""

    @cached_property
    def settings(self) -> ExperimentSettings:
        """The config's typed settings (read once, defaults applied)."""
        return ExperimentSettings.of(self.config)

    @property
    def trial_ids(self) -> list[int]:
        """The reopened trials' ids, in the order the gateway chose them."""
        return [t.trial_id for t in self.trials]


upcaster("ExperimentContinued", 1)(integer_trial_id)


@upcaster("ExperimentContinued", 2)
def _one_continued_trial(payload: dict[str, Any]) -> dict[str, Any]:
    """v2's ``trial_id`` and ``hparams`` become the one entry of ``trials``."""
    rest = {k: v for k, v in payload.items() if k not in ("trial_id", "hparams")}
    return {
        **rest,
        "trials": [{"trial_id": payload["trial_id"], "hparams": payload.get("hparams", {})}],
    }
