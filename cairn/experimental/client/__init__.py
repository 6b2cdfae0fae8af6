"""The Python SDK, in the shape of Determined's ``determined.experimental.client``.

Drive experiments from a program instead of the CLI::

    from cairn.experimental import client

    client.login()  # optional: master and credentials as the CLI finds them
    exp = client.create_experiment("const.yaml", "./code")
    state = exp.wait(interval=1.0)  # ExperimentState.COMPLETED
    best = exp.top_checkpoint()
    path = best.download("./best")
    for point in exp.list_trials()[0].iter_metrics("validation"):
        print(point.steps_completed, point.metrics)

The module functions use one :class:`Determined` made on first use (or by :func:`login`); a
program talking to several masters makes a :class:`Determined` for each. The master and the
credentials are found as the CLI finds them (:mod:`cairn.auth`): ``login()``'s arguments, else
``CAIRN_MASTER``/``DET_MASTER`` and ``CAIRN_USER``/``CAIRN_PASSWORD`` or ``DET_USER``/``DET_PASS``,
else the token ``cairn user login`` stored, else the embedded cluster (``cairn up``) as its admin.

Everything goes through the REST API at ``/api/v1`` (:class:`cairn.client.Client`, the one HTTP
client cairn has); errors are :class:`cairn.errors.CairnError`\\ s (an
:class:`~cairn.client.ApiError` carries the HTTP status). ``docs/sdk.md`` lists what is here and
what of Determined's SDK is not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from cairn.experimental.client._checkpoints import Checkpoint
from cairn.experimental.client._determined import Determined
from cairn.experimental.client._experiments import Experiment
from cairn.experimental.client._models import Model, ModelVersion
from cairn.experimental.client._records import (
    Agent,
    CheckpointTrainingMetadata,
    TrialMetrics,
    User,
)
from cairn.experimental.client._states import (
    TERMINAL_STATES as TERMINAL_STATES,
)
from cairn.experimental.client._states import (
    CheckpointSortBy,
    CheckpointState,
    DownloadMode,
    ExperimentState,
    ModelSortBy,
    OrderBy,
    TrialState,
)
from cairn.experimental.client._trials import Trial
from cairn.experimental.client._workspaces import Project, Workspace

_determined: Determined | None = None


def login(
    master: str | None = None,
    user: str | None = None,
    password: str | None = None,
    cert_path: str | None = None,
    cert_name: str | None = None,
    noverify: bool = False,
) -> None:
    """Connects the module functions to a master (see :class:`Determined` for the arguments).

    Optional: the first module function called logs in with the defaults. Call it once,
    before any other.

    Raises:
        ValueError: the module is connected already.
    """
    global _determined
    if _determined is not None:
        raise ValueError("login() was called already (or another function logged in first)")
    _determined = Determined(master, user, password, cert_path, cert_name, noverify)


def _client() -> Determined:
    global _determined
    if _determined is None:
        _determined = Determined()
    return _determined


def create_experiment(
    config: str | os.PathLike[str] | Mapping[str, Any],
    model_dir: str | os.PathLike[str] | None = None,
    includes: Iterable[str | os.PathLike[str]] | None = None,
    project_id: int | None = None,
    template: str | None = None,
) -> Experiment:
    """Submits an experiment (see :meth:`Determined.create_experiment`)."""
    return _client().create_experiment(config, model_dir, includes, project_id, template)


def get_experiment(experiment_id: int) -> Experiment:
    """One experiment (see :meth:`Determined.get_experiment`)."""
    return _client().get_experiment(experiment_id)


def list_experiments(
    sort_by: Any = None,
    order_by: OrderBy | None = None,
    experiment_ids: Sequence[int] | None = None,
    labels: Sequence[str] | None = None,
    users: Sequence[str] | None = None,
    states: Sequence[ExperimentState] | None = None,
    name: str | None = None,
    project_id: int | None = None,
) -> list[Experiment]:
    """Experiments (see :meth:`Determined.list_experiments`)."""
    return _client().list_experiments(
        sort_by, order_by, experiment_ids, labels, users, states, name, project_id
    )


def get_trial(trial_id: int) -> Trial:
    """One trial."""
    return _client().get_trial(trial_id)


def get_checkpoint(uuid: str) -> Checkpoint:
    """One checkpoint."""
    return _client().get_checkpoint(uuid)


def create_model(
    name: str,
    description: str | None = "",
    metadata: Mapping[str, Any] | None = None,
    labels: Sequence[str] | None = None,
    workspace_name: str | None = None,
) -> Model:
    """Creates a model (see :meth:`Determined.create_model`)."""
    return _client().create_model(name, description, metadata, labels, workspace_name)


def get_model(identifier: str | int) -> Model:
    """One model, by name or number."""
    return _client().get_model(identifier)


def get_model_by_id(model_id: int) -> Model:
    """One model, by number."""
    return _client().get_model_by_id(model_id)


def get_models(
    sort_by: ModelSortBy = ModelSortBy.NAME,
    order_by: OrderBy = OrderBy.ASCENDING,
    name: str = "",
    description: str = "",
    model_id: int | None = None,
    workspace_names: Sequence[str] | None = None,
) -> list[Model]:
    """Models (see :meth:`Determined.get_models`)."""
    return _client().get_models(sort_by, order_by, name, description, model_id, workspace_names)


def iter_trials_metrics(
    trial_ids: Sequence[int], group: str = "training"
) -> Iterator[TrialMetrics]:
    """The points of one metric group of several trials."""
    return _client().iter_trials_metrics(trial_ids, group)


def list_agents() -> list[Agent]:
    """The cluster's agents."""
    return _client().list_agents()


def whoami() -> User:
    """The user the module acts as."""
    return _client().whoami()


def get_session_username() -> str:
    """The name of the user the module acts as."""
    return _client().get_session_username()


def list_users(active: bool | None = None) -> list[User]:
    """Users (admins only)."""
    return _client().list_users(active)


def create_user(
    username: str, admin: bool, password: str | None = None, remote: bool = False
) -> User:
    """Creates a user (admins only)."""
    return _client().create_user(username, admin, password, remote)


def logout() -> None:
    """Revokes the module's token and forgets the connection."""
    global _determined
    if _determined is not None:
        _determined.logout()
    _determined = None


def get_workspace(name: str) -> Workspace:
    """The workspace named ``name`` (see :meth:`Determined.get_workspace`)."""
    return _client().get_workspace(name)


def list_workspaces() -> list[Workspace]:
    """The workspaces you may see."""
    return _client().list_workspaces()


def create_workspace(name: str) -> Workspace:
    """Creates a workspace (see :meth:`Determined.create_workspace`)."""
    return _client().create_workspace(name)


def delete_workspace(name: str) -> None:
    """Deletes an empty workspace."""
    _client().delete_workspace(name)


__all__ = [
    "Agent",
    "Checkpoint",
    "CheckpointSortBy",
    "CheckpointState",
    "CheckpointTrainingMetadata",
    "Determined",
    "DownloadMode",
    "Experiment",
    "ExperimentState",
    "Model",
    "ModelSortBy",
    "ModelVersion",
    "OrderBy",
    "Project",
    "Trial",
    "TrialMetrics",
    "TrialState",
    "User",
    "Workspace",
    "create_experiment",
    "create_model",
    "create_user",
    "create_workspace",
    "delete_workspace",
    "get_checkpoint",
    "get_experiment",
    "get_model",
    "get_model_by_id",
    "get_models",
    "get_session_username",
    "get_trial",
    "get_workspace",
    "iter_trials_metrics",
    "list_agents",
    "list_experiments",
    "list_users",
    "list_workspaces",
    "login",
    "logout",
    "whoami",
]
