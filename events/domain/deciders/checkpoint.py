"""The checkpoint's decider: a user asks to delete checkpoints of an ended experiment.

Checkpoints are facts of their experiment's stream, so deleting them is decided over the
experiment's folded stream (:class:`~events.domain.aggregates.ExperimentView`); the tracker
carries out the ``CheckpointsDeleteRequested`` it appends.
"""

from __future__ import annotations

from dataclasses import dataclass

from events.domain import lifecycle
from events.domain.aggregates import ExperimentView
from events.domain.deciders import Decision, conflict
from events.domain.types import CheckpointsDeleteRequested


@dataclass(frozen=True)
class DeleteCheckpoints:
    """Delete ``uuids`` (not yet deleted, all of one experiment)."""

    uuids: tuple[str, ...]
    actor: str


def decide_delete_checkpoints(view: ExperimentView, command: DeleteCheckpoints) -> Decision:
    """``CheckpointsDeleteRequested``; refused (conflict) while the experiment has not ended (a
    trial restarts from its checkpoints)."""
    if view.state not in lifecycle.TERMINAL:
        return conflict(
            f"checkpoint {command.uuids[0]} belongs to experiment {view.experiment_id}, which is "
            f"{view.state}; only an ended experiment's checkpoints can be deleted"
        )
    return [
        CheckpointsDeleteRequested(
            experiment_id=view.experiment_id, uuids=list(command.uuids), actor=command.actor
        )
    ]
