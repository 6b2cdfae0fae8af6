"""The small deciders: deleting checkpoints (:mod:`events.domain.deciders.checkpoint`), config
templates (:mod:`~events.domain.deciders.template`) and linking a user to a unix account
(:mod:`~events.domain.deciders.identity`); no HTTP, no database."""

from __future__ import annotations

from dataclasses import dataclass

from events.domain import lifecycle
from events.domain.aggregates import ExperimentView
from events.domain.deciders import Refusal
from events.domain.deciders.checkpoint import DeleteCheckpoints, decide_delete_checkpoints
from events.domain.deciders.identity import LinkAgentUser, decide_link
from events.domain.deciders.template import (
    RemoveTemplate,
    SetTemplate,
    decide_remove_template,
    decide_set_template,
)
from events.domain.identities import Identities
from events.domain.types import (
    AgentUserLinked,
    CheckpointsDeleteRequested,
    TemplateRemoved,
    TemplateSet,
)


@dataclass
class Template:
    """A template's folded stream, as the gateway folds it."""

    exists: bool = False
    owner: str = ""


def test_checkpoints_of_an_ended_experiment_are_requested_for_deletion() -> None:
    """A COMPLETED experiment's checkpoints get one CheckpointsDeleteRequested naming them."""
    view = ExperimentView(4, state=lifecycle.COMPLETED)
    command = DeleteCheckpoints(uuids=("c1", "c2"), actor="alice")
    assert decide_delete_checkpoints(view, command) == [
        CheckpointsDeleteRequested(experiment_id=4, uuids=["c1", "c2"], actor="alice")
    ]


def test_checkpoints_of_a_running_experiment_are_a_conflict() -> None:
    """A trial may restart from them, so a running experiment's checkpoints stay."""
    decision = decide_delete_checkpoints(
        ExperimentView(4, state=lifecycle.PAUSED), DeleteCheckpoints(("c1",), "alice")
    )
    assert isinstance(decision, Refusal) and decision.reason == "conflict"
    assert decision.message.startswith("checkpoint c1 belongs to experiment 4, which is PAUSED")


def test_a_new_template_is_its_creators_and_a_replacement_keeps_the_owner() -> None:
    """Setting a new template makes the actor its owner; replacing one keeps its owner."""
    command = SetTemplate(name="gpu", config={"a": 1}, actor="bob")
    assert decide_set_template(Template(), command) == [
        TemplateSet(name="gpu", config={"a": 1}, owner="bob", actor="bob")
    ]
    assert decide_set_template(Template(exists=True, owner="alice"), command) == [
        TemplateSet(name="gpu", config={"a": 1}, owner="alice", actor="bob")
    ]


def test_removing_a_template_requires_one() -> None:
    """An existing template is removed; a missing one is not found."""
    command = RemoveTemplate(name="gpu", actor="bob")
    assert decide_remove_template(Template(exists=True, owner="bob"), command) == [
        TemplateRemoved(name="gpu", actor="bob")
    ]
    assert decide_remove_template(Template(), command) == Refusal("not_found", "no template 'gpu'")


def test_a_link_is_recorded_as_given() -> None:
    """Linking a user records AgentUserLinked with the admin as actor."""
    command = LinkAgentUser(username="u", agent_uid=2001, agent_gid=2001, actor="root")
    assert decide_link(Identities(), command) == [
        AgentUserLinked(username="u", agent_uid=2001, agent_gid=2001, actor="root")
    ]
