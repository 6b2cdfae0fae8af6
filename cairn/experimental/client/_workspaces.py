"""Workspaces and projects in the SDK (Determined's ``Workspace`` and ``Project``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from cairn.client import Client
from cairn.experimental.client._experiments import Experiment
from cairn.experimental.client._records import _MasterObject


class Project(_MasterObject):
    """A project of a workspace (get one with :meth:`Workspace.get_project`).

    Attributes:
        id: the project's id.
        name: its name.
        workspace_id: its workspace's id.
        description: its description.
        archived: whether it, or its workspace, is archived.
    """

    def __init__(self, session: Client, project_id: int, data: Mapping[str, Any] | None = None):
        self.id = int(project_id)
        super().__init__(session, data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        self.name = str(data.get("name") or "")
        self.workspace_id = int(data.get("workspace_id") or 1)
        self.description = str(data.get("description") or "")
        self.archived = bool(data.get("archived"))

    def reload(self) -> None:
        """Reads the project again from the master."""
        self._hydrate(self._session.get(f"/projects/{self.id}"))

    def list_experiments(self) -> list[Experiment]:
        """The project's experiments you may read, newest first."""
        rows = self._session.list_experiments(project_id=self.id, archived="all")["experiments"]
        return [Experiment(int(row["id"]), self._session, row) for row in rows]

    def archive(self) -> None:
        """Archives the project."""
        self._hydrate(self._session.post(f"/projects/{self.id}/archive"))

    def unarchive(self) -> None:
        """Unarchives the project."""
        self._hydrate(self._session.post(f"/projects/{self.id}/unarchive"))

    def __repr__(self) -> str:
        return f"Project(id={self.id}, name={self.name!r}, workspace_id={self.workspace_id})"


class Workspace(_MasterObject):
    """A workspace (get one with :meth:`Determined.get_workspace`).

    Attributes:
        id: the workspace's id.
        name: its name.
        archived: whether it is archived.
    """

    def __init__(self, session: Client, name: str, data: Mapping[str, Any] | None = None):
        self.name = name
        super().__init__(session, data)

    def _hydrate(self, data: Mapping[str, Any]) -> None:
        self.id = int(data["id"])
        self.name = str(data.get("name") or self.name)
        self.archived = bool(data.get("archived"))

    @property
    def _path(self) -> str:
        return f"/workspaces/{quote(self.name, safe='')}"

    def reload(self) -> None:
        """Reads the workspace again from the master."""
        self._hydrate(self._session.get(self._path))

    def list_projects(self) -> list[Project]:
        """The workspace's projects, by id."""
        rows = self._session.get(f"{self._path}/projects")["projects"]
        return [Project(self._session, int(row["id"]), row) for row in rows]

    def get_project(self, project_name: str) -> Project:
        """The workspace's project named ``project_name``.

        Raises:
            ValueError: it has none by that name.
        """
        for project in self.list_projects():
            if project.name == project_name:
                return project
        raise ValueError(f"workspace {self.name!r} has no project {project_name!r}")

    def create_project(self, name: str, description: str | None = None) -> Project:
        """Creates a project in the workspace."""
        row = self._session.post(
            f"{self._path}/projects", {"name": name, "description": description or ""}
        )
        return Project(self._session, int(row["id"]), row)

    def delete_project(self, name: str) -> None:
        """Deletes the workspace's (empty) project named ``name``."""
        self._session.call("DELETE", f"/projects/{self.get_project(name).id}")

    def __repr__(self) -> str:
        return f"Workspace(id={self.id}, name={self.name!r})"
