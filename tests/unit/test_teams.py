"""The teams' fold, deciders and authorization rule, and usage by project and workspace: pure
functions checked on hand-made states."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from events.domain.aggregates.teams import Teams, apply_teams
from events.domain.authorization import (
    CLUSTER_ONLY,
    DEFAULT_PROJECT_ID,
    ROLES,
    Permission,
    cluster_wide,
    permitted,
)
from events.domain.deciders import Refusal
from events.domain.deciders.teams import (
    ArchiveProject,
    ArchiveWorkspace,
    BindPool,
    ChangeGroup,
    ChangeRole,
    CreateGroup,
    CreateProject,
    CreateWorkspace,
    DeleteGroup,
    DeleteProject,
    DeleteWorkspace,
    EditProject,
    RenameWorkspace,
    decide_bindings,
    decide_group,
    decide_project,
    decide_role,
    decide_workspace,
    name_problem,
)
from events.domain.types.teams import TEAMS_STREAM
from events.log.envelope import Event, RecordedEvent
from services.api.routes_usage import placed, project_workspaces
from services.tracker.usage import Span, aggregate

P = Permission


def applied(state: Teams, decision: list[Event] | Refusal) -> Teams:
    """``state`` with a decision's events folded in (a refusal fails the test)."""
    assert not isinstance(decision, Refusal), decision
    for event in decision:
        version = state.version + 1
        apply_teams(
            state,
            RecordedEvent(
                position=version,
                stream_id=TEAMS_STREAM,
                stream_version=version,
                event_id=uuid.uuid4(),
                type=event.event_type,
                schema_version=event.schema_version,
                payload=event.model_dump(mode="json"),
                metadata={},
                recorded_at=datetime(2026, 11, 27, tzinfo=UTC),
            ),
        )
    return state


def lab() -> Teams:
    """Workspace 2 'vision' (ana administers it) with project 2 'detection'; group 1 'seers'
    holding ben, who is an Editor there."""
    state = applied(Teams(), decide_workspace(Teams(), CreateWorkspace("vision", "ana")))
    applied(state, decide_project(state, CreateProject(2, "detection", "ana")))
    applied(state, decide_group(state, CreateGroup("seers", ("ben",))))
    return applied(state, decide_role(state, ChangeRole("Editor", "group", "1", 2)))


def refused(decision: list[Event] | Refusal, reason: str) -> str:
    assert isinstance(decision, Refusal) and decision.reason == reason, decision
    return decision.message


def test_the_default_workspace_and_project_exist_and_never_change() -> None:
    """An empty fold holds Uncategorized (1/1); renaming, archiving or deleting either is a
    conflict."""
    state = Teams()
    assert state.workspaces[1].name == state.projects[1].name == "Uncategorized"
    assert "default" in refused(decide_workspace(state, RenameWorkspace(1, "x")), "conflict")
    assert "default" in refused(decide_workspace(state, ArchiveWorkspace(1, True)), "conflict")
    assert "default" in refused(decide_workspace(state, DeleteWorkspace(1)), "conflict")
    assert "default" in refused(decide_project(state, DeleteProject(1, 0)), "conflict")


def test_creating_a_workspace_makes_its_creator_its_admin_and_names_are_unique() -> None:
    """The creator holds WorkspaceAdmin on the new workspace (id 2); a second 'vision' and a
    second 'detection' in it conflict; the same project name in another workspace does not."""
    state = lab()
    assert P.ASSIGN_ROLES in state.permissions_of("ana", 2)
    assert P.ASSIGN_ROLES not in state.permissions_of("ana", 1)
    refused(decide_workspace(state, CreateWorkspace("vision", "cy")), "conflict")
    refused(decide_project(state, CreateProject(2, "detection", "ana")), "conflict")
    applied(state, decide_workspace(state, CreateWorkspace("speech", "cy")))
    applied(state, decide_project(state, CreateProject(3, "detection", "cy")))
    assert state.project_named(3, "detection") is not None


def test_names_are_checked() -> None:
    """Blank, too long, control characters and edge spaces are refused, naming the rule."""
    for name in ("", "   ", "x" * 81, "a\x00b", "tab\tin", " lead", "trail "):
        assert name_problem(name, "workspace"), name
    assert name_problem("Vision Lab 2", "workspace") is None
    assert refused(decide_workspace(Teams(), CreateWorkspace("", "ana")), "invalid")


def test_archiving_closes_a_workspace_and_its_projects() -> None:
    """An archived workspace takes no project, its projects read archived and cannot change;
    unarchiving opens them again; a repeat decides nothing."""
    state = lab()
    applied(state, decide_workspace(state, ArchiveWorkspace(2, True)))
    assert decide_workspace(state, ArchiveWorkspace(2, True)) == []
    assert state.project_archived(2)
    refused(decide_project(state, CreateProject(2, "new", "ana")), "conflict")
    refused(decide_project(state, EditProject(2, name="renamed")), "conflict")
    applied(state, decide_workspace(state, ArchiveWorkspace(2, False)))
    assert not state.project_archived(2)
    applied(state, decide_project(state, ArchiveProject(2, True)))
    refused(decide_project(state, EditProject(2, description="d")), "conflict")


def test_deletion_is_refused_while_not_empty_and_takes_the_grants_with_it() -> None:
    """A project with experiments and a workspace with projects are not deleted; once empty
    they are, and the workspace's grants go with it."""
    state = lab()
    assert "2 experiment" in refused(decide_project(state, DeleteProject(2, 2)), "conflict")
    assert "'detection'" in refused(decide_workspace(state, DeleteWorkspace(2)), "conflict")
    applied(state, decide_project(state, DeleteProject(2, 0)))
    assert state.project_or_default(2).project_id == DEFAULT_PROJECT_ID
    applied(state, decide_workspace(state, DeleteWorkspace(2)))
    assert not any(g.workspace_id == 2 for g in state.grants)


def test_groups_grant_their_members_and_deleting_one_withdraws_its_grants() -> None:
    """ben gets the group's Editor role on vision; cy gains it when added and loses it when
    removed; deleting the group withdraws it from everyone."""
    state = lab()
    assert P.UPDATE_EXPERIMENT in state.permissions_of("ben", 2)
    assert P.UPDATE_EXPERIMENT not in state.permissions_of("ben", 1)
    applied(state, decide_group(state, ChangeGroup(1, added=("cy",))))
    assert P.CREATE_PROJECT in state.permissions_of("cy", 2)
    applied(state, decide_group(state, ChangeGroup(1, removed=("cy",))))
    assert state.permissions_of("cy", 2) == frozenset()
    assert decide_group(state, ChangeGroup(1, added=("ben",))) == []
    applied(state, decide_group(state, DeleteGroup(1)))
    assert state.permissions_of("ben", 2) == frozenset()


def test_role_grants_are_checked_and_repeats_decide_nothing() -> None:
    """Unknown roles are invalid, cluster-only roles on a workspace too, unknown groups and
    workspaces not found; granting twice or withdrawing what is not held appends nothing."""
    state = lab()
    refused(decide_role(state, ChangeRole("Overlord", "user", "ana", None)), "invalid")
    refused(decide_role(state, ChangeRole("ClusterAdmin", "user", "ana", 2)), "invalid")
    refused(decide_role(state, ChangeRole("Viewer", "group", "9", 2)), "not_found")
    refused(decide_role(state, ChangeRole("Viewer", "user", "ana", 9)), "not_found")
    assert decide_role(state, ChangeRole("Editor", "group", "1", 2)) == []
    assert decide_role(state, ChangeRole("Viewer", "user", "cy", 2, assign=False)) == []


def test_the_rule_admin_owner_default_workspace_then_grants() -> None:
    """An admin may everything; an owner may change their own work anywhere but create only
    where allowed; everyone creates in the default workspace but sees only their own there; a
    grant counts on its workspace (or everywhere, cluster-wide) and nowhere else."""
    state = lab()
    assert permitted(state, "root", P.DELETE_WORKSPACE, admin=True, workspace_id=2)
    assert permitted(state, "cy", P.DELETE_EXPERIMENT, workspace_id=2, owner="cy")
    assert not permitted(state, "cy", P.CREATE_EXPERIMENT, workspace_id=2)
    assert permitted(state, "cy", P.CREATE_EXPERIMENT, workspace_id=1)
    assert not permitted(state, "cy", P.VIEW_EXPERIMENT, workspace_id=1, owner="ana")
    assert permitted(state, "ben", P.VIEW_EXPERIMENT, workspace_id=2, owner="ana")
    assert not permitted(state, "ben", P.DELETE_PROJECT, workspace_id=2)
    applied(state, decide_role(state, ChangeRole("Viewer", "user", "cy", None)))
    assert permitted(state, "cy", P.VIEW_EXPERIMENT, workspace_id=2, owner="ana")
    assert state.workspaces_with("cy", P.VIEW_EXPERIMENT) is None
    assert state.workspaces_with("ben", P.VIEW_EXPERIMENT) == {2}


def test_roles_are_nested_as_determined_defines_them() -> None:
    """Viewer is within Editor, Editor within WorkspaceAdmin, everything within ClusterAdmin;
    only roles holding a cluster-only permission are cluster-wide."""
    assert ROLES["Viewer"] < ROLES["Editor"] < ROLES["WorkspaceAdmin"] < ROLES["ClusterAdmin"]
    assert ROLES["EditorRestricted"] < ROLES["Editor"]
    assert {r for r in ROLES if cluster_wide(r)} == {"ClusterAdmin", "WorkspaceCreator"}
    assert not any(ROLES["WorkspaceAdmin"] & CLUSTER_ONLY)


def test_usage_groups_by_project_and_sums_into_workspaces() -> None:
    """Slot time groups by each experiment's project (tasks: the default one's); by workspace an
    experiment counts for its project's workspace (a deleted project's for the default one) and
    a task for its own, each row named after its workspace."""
    state = lab()
    spans = [
        Span("ana", 1, "default", "cpu", 2, 0, 1000, project_id=2),
        Span("ana", 2, "default", "cpu", 1, 0, 1000, project_id=1),
        Span("cy", None, "default", "cpu", 1, 0, 500, workspace_id=1),
        Span("cy", 3, "default", "cpu", 1, 0, 250, project_id=7),
        Span("cy", None, "default", "cpu", 3, 0, 100, workspace_id=2),
    ]
    rows = aggregate(spans, 0, 1000, "project", 1000)
    assert {(r["project"], r["slot_ms"]) for r in rows} == {(1, 1800), (2, 2000), (7, 250)}
    per_workspace = aggregate(
        spans, 0, 1000, "workspace", 1000, workspaces=project_workspaces(state)
    )
    by_workspace = placed(state, per_workspace, "workspace")
    assert [(r["name"], r["slot_ms"]) for r in by_workspace] == [
        ("Uncategorized", 1750),
        ("vision", 2300),
    ]
    with pytest.raises(ValueError, match="workspaces="):
        aggregate(spans, 0, 1000, "workspace", 1000)
    by_project = placed(state, rows, "project")
    assert [(r["name"], r["slot_ms"]) for r in by_project] == [
        ("Uncategorized", 2050),
        ("detection", 2000),
    ]


def test_a_bound_pool_serves_only_its_workspaces() -> None:
    """Binding 'gpu' to vision keeps it from the default workspace; adding, removing and
    replacing compose; the default pool cannot be bound; deleting a workspace unbinds it."""
    state = lab()
    assert state.pool_serves("gpu", 1)
    applied(state, decide_bindings(state, BindPool("gpu", add=(2,))))
    assert state.pool_serves("gpu", 2) and not state.pool_serves("gpu", 1)
    assert decide_bindings(state, BindPool("gpu", add=(2,))) == []
    applied(state, decide_bindings(state, BindPool("gpu", replace=(1, 2))))
    assert state.pool_serves("gpu", 1)
    applied(state, decide_bindings(state, BindPool("gpu", remove=(1, 2))))
    assert "gpu" not in state.pool_bindings
    refused(decide_bindings(state, BindPool("default", add=(2,))), "conflict")
    refused(decide_bindings(state, BindPool("gpu", add=(9,))), "not_found")
    applied(state, decide_bindings(state, BindPool("gpu", add=(2,))))
    applied(state, decide_project(state, DeleteProject(2, 0)))
    applied(state, decide_workspace(state, DeleteWorkspace(2)))
    assert not state.pool_bindings["gpu"] and state.pool_serves("gpu", 1)
