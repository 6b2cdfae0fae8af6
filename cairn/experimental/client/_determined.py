"""A connection to one master (:class:`Determined`): what the SDK's module functions do,
for that master."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cairn.auth import session
from cairn.errors import UsageError
from cairn.experimental.client._checkpoints import Checkpoint
from cairn.experimental.client._experiments import Experiment
from cairn.experimental.client._models import Model
from cairn.experimental.client._records import Agent, TrialMetrics, User
from cairn.experimental.client._states import ExperimentState, ModelSortBy, OrderBy
from cairn.experimental.client._trials import Trial
from cairn.experimental.client._workspaces import Workspace

log = logging.getLogger("cairn.client")


def _read_config(config: str | os.PathLike[str] | Mapping[str, Any]) -> str | dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    path = Path(config)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read the config {path}: {exc.strerror or exc}") from None


class Determined:
    """A connection to one master: everything the module functions do, for that master.

    Args:
        master: the master's address (default: ``CAIRN_MASTER``, ``DET_MASTER``, the embedded
            cluster, ``localhost:8080``).
        user: log in as this user.
        password: ``user``'s password (default: ``CAIRN_PASSWORD``/``DET_PASS``, else asked on a
            terminal).
        cert_path: not supported (cairn uses the system's certificate store).
        cert_name: not supported.
        noverify: not supported.

    Raises:
        UsageError: a certificate setting was given.
        AuthRequiredError: the credentials were refused, or none could be had.
    """

    def __init__(
        self,
        master: str | None = None,
        user: str | None = None,
        password: str | None = None,
        cert_path: str | None = None,
        cert_name: str | None = None,
        noverify: bool = False,
    ) -> None:
        if cert_path is not None or cert_name is not None or noverify:
            raise UsageError("cert_path, cert_name and noverify are not supported by cairn")
        self._session = session(master, user, password)

    @property
    def master(self) -> str:
        """The master's URL."""
        return self._session.master

    def create_experiment(
        self,
        config: str | os.PathLike[str] | Mapping[str, Any],
        model_dir: str | os.PathLike[str] | None = None,
        includes: Iterable[str | os.PathLike[str]] | None = None,
        project_id: int | None = None,
        template: str | None = None,
    ) -> Experiment:
        """Submits an experiment and activates it.

        Args:
            config: the config: a YAML file's path, or a mapping.
            model_dir: the code directory (``None``: no code; the entrypoint is in the image).
            includes: files or directories added to the code under their own names.
            project_id: the project to create it in (over the config's workspace/project).
            template: a template the config is merged over.

        Returns:
            The experiment.

        Raises:
            UsageError: the config file cannot be read.
            ApiError: the master refused the config (``errors`` lists every problem).
        """
        answer = self._session.submit_experiment(
            _read_config(config),
            Path(model_dir) if model_dir is not None else None,
            template=template,
            includes=[Path(p) for p in includes or ()],
            project_id=project_id,
        )
        for warning in answer.get("warnings") or []:
            log.warning("config %s: %s", warning.get("path"), warning.get("message"))
        return Experiment(int(answer["id"]), self._session)

    def get_experiment(self, experiment_id: int) -> Experiment:
        """One experiment.

        Raises:
            ApiError: no such experiment (status 404), or not yours to read.
        """
        return Experiment(experiment_id, self._session)

    def list_experiments(
        self,
        sort_by: Any = None,
        order_by: OrderBy | None = None,
        experiment_ids: Sequence[int] | None = None,
        labels: Sequence[str] | None = None,
        users: Sequence[str] | None = None,
        states: Sequence[ExperimentState] | None = None,
        name: str | None = None,
        project_id: int | None = None,
    ) -> list[Experiment]:
        """The experiments you may read (archived ones too), newest first, filtered by ids,
        labels (all of them), owners, states, a substring of the name and a project."""
        owner = users[0] if users is not None and len(users) == 1 else None
        state = ",".join(s.value for s in states) if states else None
        rows = self._session.list_experiments(
            archived="all",
            owner=owner,
            state=state,
            name=name,
            project_id=project_id,
            order_by="id" if order_by in (OrderBy.ASC, OrderBy.ASCENDING) else None,
        )["experiments"]
        out = []
        for row in rows:
            if experiment_ids is not None and row["id"] not in set(experiment_ids):
                continue
            if users is not None and row.get("owner") not in set(users):
                continue
            experiment = Experiment(int(row["id"]), self._session, row)
            if labels and not set(labels) <= experiment.labels:
                experiment.reload()  # a list row has no labels
                if not set(labels) <= experiment.labels:
                    continue
            out.append(experiment)
        return out

    def get_trial(self, trial_id: int) -> Trial:
        """One trial."""
        return Trial(trial_id, self._session)

    def get_checkpoint(self, uuid: str) -> Checkpoint:
        """One checkpoint."""
        return Checkpoint(self._session, uuid)

    def create_model(
        self,
        name: str,
        description: str | None = "",
        metadata: Mapping[str, Any] | None = None,
        labels: Sequence[str] | None = None,
        workspace_name: str | None = None,
    ) -> Model:
        """Creates a model owned by this connection's user, in workspace ``workspace_name``
        (``None``: Uncategorized).

        Raises:
            ApiError: the name breaks a rule or the workspace is unknown (400), you may not
                create models in that workspace (403), or the name is taken or the workspace
                archived (409).
        """
        data = self._session.create_model(
            name,
            description=description or "",
            metadata=dict(metadata or {}),
            labels=list(labels or []),
            workspace_name=workspace_name,
        )
        return Model(self._session, str(data["name"]), data)

    def get_model(self, identifier: str | int) -> Model:
        """One model, by name or number.

        Raises:
            ApiError: no such model (status 404).
        """
        return Model(self._session, str(identifier))

    def get_model_by_id(self, model_id: int) -> Model:
        """One model, by number."""
        return Model(self._session, str(int(model_id)))

    def get_models(
        self,
        sort_by: ModelSortBy = ModelSortBy.NAME,
        order_by: OrderBy = OrderBy.ASCENDING,
        name: str = "",
        description: str = "",
        model_id: int | None = None,
        workspace_names: Sequence[str] | None = None,
    ) -> list[Model]:
        """The models, filtered by a substring of the name or description, a number and
        workspaces."""
        descending = order_by in (OrderBy.DESCENDING, OrderBy.DESC)
        rows = self._session.list_models(
            sort_by=sort_by.value,
            order_by="desc" if descending else "asc",
            name=name or None,
            workspace_names=",".join(workspace_names) if workspace_names else None,
        )["models"]
        return [
            Model(self._session, str(row["name"]), row)
            for row in rows
            if (model_id is None or row.get("id") == model_id)
            and description in str(row.get("description") or "")
        ]

    def iter_trials_metrics(
        self, trial_ids: Sequence[int], group: str = "training"
    ) -> Iterator[TrialMetrics]:
        """The points of one metric group of several trials, trial by trial."""
        for trial_id in trial_ids:
            yield from Trial(trial_id, self._session, {}).iter_metrics(group)

    def list_agents(self) -> list[Agent]:
        """The cluster's agents."""
        agents = []
        for row in self._session.list_agents()["agents"]:
            slots = row.get("slots") or []
            agents.append(
                Agent(
                    agent_id=str(row.get("agent_id")),
                    state=str(row.get("state")),
                    enabled=bool(row.get("enabled")),
                    resource_pool=row.get("resource_pool"),
                    hostname=row.get("hostname"),
                    slots=[str(s.get("slot_id")) for s in slots],
                    busy_slots=sum(1 for s in slots if s.get("allocation_id")),
                )
            )
        return agents

    def whoami(self) -> User:
        """The user this connection acts as."""
        me = self._session.me()
        return User(username=str(me.get("username")), admin=bool(me.get("admin")))

    def get_session_username(self) -> str:
        """The name of the user this connection acts as."""
        return self.whoami().username

    def get_workspace(self, name: str) -> Workspace:
        """The workspace named ``name`` (one you may see).

        Raises:
            ApiError: no such workspace (status 404).
        """
        return Workspace(self._session, name)

    def list_workspaces(self) -> list[Workspace]:
        """The workspaces you may see, by id."""
        rows = self._session.get("/workspaces")["workspaces"]
        return [Workspace(self._session, str(row["name"]), row) for row in rows]

    def create_workspace(self, name: str) -> Workspace:
        """Creates a workspace (admins and WorkspaceCreators); you administer it."""
        row = self._session.post("/workspaces", {"name": name})
        return Workspace(self._session, str(row["name"]), row)

    def delete_workspace(self, name: str) -> None:
        """Deletes the (empty) workspace named ``name``."""
        self._session.call("DELETE", f"/workspaces/{quote(name, safe='')}")

    def list_users(self, active: bool | None = None) -> list[User]:
        """Every user (admins only), or only the active (or inactive) ones."""
        users = [
            User(
                username=str(u.get("username")),
                admin=bool(u.get("admin")),
                active=bool(u.get("active", True)),
            )
            for u in self._session.list_users()["users"]
        ]
        return [u for u in users if active is None or u.active == active]

    def create_user(
        self, username: str, admin: bool, password: str | None = None, remote: bool = False
    ) -> User:
        """Creates a user (admins only)."""
        if remote:
            raise UsageError("remote users (an external identity provider) are not supported")
        if password is None:
            raise UsageError("a password is required")
        made = self._session.create_user(username, password, admin=admin)
        return User(username=str(made.get("username", username)), admin=bool(made.get("admin")))

    def logout(self) -> None:
        """Revokes this connection's token."""
        self._session.logout()
