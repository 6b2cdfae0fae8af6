"""Facts a user records on an experiment's stream after submitting it: its name, description,
labels and scheduling resources, a request to delete some of its checkpoints, and continuing it
after it ended.

Each is folded over the submitted config by every reader that shows or uses the changed value
(the gateway's experiment view, the scheduler, the tracker's projections), so the effective
config is always the submitted one with these changes applied in log order.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from events.envelope import Event
from events.registry import register, upcaster
from events.types.legacy import integer_trial_id

ResourceField = Literal["priority", "weight", "max_slots"]


@register
class ExperimentRenamed(Event):
    """A user gave the experiment a new name."""

    event_type = "ExperimentRenamed"

    experiment_id: int
    name: str
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


@register
class ExperimentContinued(Event):
    """A user continued an ended single-trial experiment: it is ACTIVE again, with ``config`` as
    its config from now on, and its trial ``trial_id`` trains on from its latest checkpoint with
    ``hparams``. v1 stored ``trial_id`` as ``"<experiment>.<n>"``."""

    event_type = "ExperimentContinued"
    schema_version = 2

    experiment_id: int
    trial_id: int
    config: dict[str, Any]
    hparams: dict[str, Any]
    actor: str = ""


upcaster("ExperimentContinued", 1)(integer_trial_id)
