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
    """Delete ``uuids`` (not yet deleted, all of one experiment).

    ``registered`` names each of them that a model version keeps (e.g. ``model 'mnist' version
    2 (checkpoint <uuid>)``), as the caller read them under the registry lock.
    """

    uuids: tuple[str, ...]
    actor: str
    registered: tuple[str, ...] = ()


def decide_delete_checkpoints(view: ExperimentView, command: DeleteCheckpoints) -> Decision:
    """``CheckpointsDeleteRequested``; refused (conflict) while the experiment has not ended (a
    trial restarts from its checkpoints) and while one of them is registered as a model
    version."""
    if view.state not in lifecycle.TERMINAL:
        return conflict(
            f"checkpoint {command.uuids[0]} belongs to experiment {view.experiment_id}, which is "
            f"{view.state}; only an ended experiment's checkpoints can be deleted"
        )
    if command.registered:
        return conflict(
            f"checkpoints registered as model versions cannot be deleted: "
            f"{', '.join(command.registered)}; delete those versions first",
            code="checkpoints_registered",
        )
    return [
        CheckpointsDeleteRequested(
            experiment_id=view.experiment_id, uuids=list(command.uuids), actor=command.actor
        )
    ]
