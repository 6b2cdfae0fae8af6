"""A small synchronous client for the cairn REST API (``/api/v1``), used by the CLI.

Only the standard library is used (``urllib``). Errors map onto :mod:`cairn.errors`: an error
answer raises :class:`ApiError` (its exit code follows the HTTP status), a master that does not
answer raises :class:`~cairn.errors.UnreachableError`.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.client import HTTPException, HTTPResponse
from pathlib import Path
from typing import Any

from cairn.errors import CairnError, UnreachableError, exit_code_for_status

MAX_CODE_BYTES = 64 * 1024 * 1024
PAGE_LIMIT = 1000

Query = Mapping[str, str | int | float | bool | None]


class ApiError(CairnError):
    """The API answered with an error (its message, and the config path when there is one).

    Attributes:
        status: the HTTP status.
        path: the dotted location of the offending input field, if the API named one.
        errors: every ``(path, message)`` pair the API listed (config validation lists them all).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        path: str | None = None,
        errors: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.path = path
        self.errors = errors or []
        self.exit_code = exit_code_for_status(status)


def code_tarball(directory: Path | None, includes: Sequence[Path] = ()) -> bytes:
    """The directory as a tar.gz (caches and checkpoints left out), plus each of ``includes``
    (a file or a directory) at the top level under its own name, as Determined's ``-i``.

    Raises:
        CairnError: the packed code is over 64 MiB, or an include does not exist.
    """
    skip = {"__pycache__", ".git", "checkpoints", ".cairn"}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        roots = [(directory, Path())] if directory is not None else []
        for extra in includes:
            if not extra.exists():
                raise CairnError(f"{extra}: no such file or directory to include")
            if extra.is_file():
                tar.add(extra, arcname=extra.name)
            else:
                roots.append((extra, Path(extra.resolve().name)))
        for root, prefix in roots:
            for path in sorted(root.rglob("*")):
                relative = path.relative_to(root)
                if path.is_file() and not skip.intersection(relative.parts):
                    tar.add(path, arcname=str(prefix / relative))
    data = buf.getvalue()
    if len(data) > MAX_CODE_BYTES:
        where = directory if directory is not None else "the included files"
        raise CairnError(f"{where}: code is {len(data)} bytes packed; the limit is 64 MiB")
    return data


def _error_from(exc: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(exc.read())
        err = body.get("error", {}) if isinstance(body, dict) else {}
    except (ValueError, OSError):
        err = {}
    if not isinstance(err, dict):
        err = {}
    message = str(err.get("message") or exc.reason or f"HTTP {exc.code}")
    path = err.get("path")
    if path and str(path) not in message:
        message = f"{path}: {message}"
    errors = [
        (str(e.get("path", "")), str(e.get("message", "")))
        for e in err.get("errors") or []
        if isinstance(e, dict)
    ]
    return ApiError(exc.code, message, path=str(path) if path else None, errors=errors)


class Client:
    """Bearer-token JSON calls against ``<master>/api/v1``.

    Attributes:
        master: the master's base URL, without a trailing slash.
        token: the bearer token sent with every call, if any.
        timeout: seconds to wait for an answer (streams wait forever).
        on_unauthorized: called with this client when a call is answered 401; if it returns
            True (it has set a new token) the call is retried once.
    """

    def __init__(
        self,
        master: str,
        token: str | None = None,
        timeout: float = 30.0,
        on_unauthorized: Callable[[Client], bool] | None = None,
    ) -> None:
        self.master = master.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.on_unauthorized = on_unauthorized

    # ------------------------------------------------------------------ transport

    def _url(self, path: str, query: Query | None) -> str:
        url = f"{self.master}/api/v1{path}"
        if query:
            pairs = {
                k: (str(v).lower() if isinstance(v, bool) else str(v))
                for k, v in query.items()
                if v is not None
            }
            if pairs:
                url += "?" + urllib.parse.urlencode(pairs)
        return url

    def _open(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Query | None = None,
        *,
        timeout: float | None = -1.0,
        retry: bool = True,
    ) -> HTTPResponse:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self._url(path, query), data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        wait = self.timeout if timeout == -1.0 else timeout
        try:
            response: HTTPResponse = urllib.request.urlopen(request, timeout=wait)
        except urllib.error.HTTPError as exc:
            error = _error_from(exc)
            exc.close()
            if (
                error.status == 401
                and retry
                and self.on_unauthorized is not None
                and self.on_unauthorized(self)
            ):
                return self._open(method, path, body, query, timeout=timeout, retry=False)
            raise error from None
        except (urllib.error.URLError, OSError, HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            raise UnreachableError(
                f"cannot reach the cairn API at {self.master}: {reason}"
            ) from None
        return response

    def call(self, method: str, path: str, body: Any = None, query: Query | None = None) -> Any:
        """One JSON request.

        Args:
            method: the HTTP method.
            path: the path under ``/api/v1``, e.g. ``/experiments/3``.
            body: a JSON-serialisable request body, or None for none.
            query: query parameters (None values are left out, booleans sent as true/false).

        Returns:
            The decoded JSON answer (None for an empty one).

        Raises:
            ApiError: the API answered 4xx/5xx.
            UnreachableError: the master did not answer.
        """
        with self._open(method, path, body, query) as resp:
            try:
                raw = resp.read()
            except (OSError, HTTPException) as exc:
                raise UnreachableError(f"lost the connection to {self.master}: {exc}") from None
        return json.loads(raw) if raw else None

    def get(self, path: str, **query: Any) -> Any:
        """``GET path?query`` as JSON."""
        return self.call("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        """``POST path`` with a JSON body (``{}`` when none is given)."""
        return self.call("POST", path, {} if body is None else body)

    def paginate(self, path: str, key: str, *, limit: int | None = None, **query: Any) -> Any:
        """Reads a paginated list; every page unless ``limit`` is given.

        Returns:
            One document like the API's: ``{key: [...], "pagination": {...}}`` (for several
            pages, the items of all of them and the first page's offset).
        """
        if limit is not None:
            return self.get(path, limit=limit, **query)
        offset = int(query.pop("offset", None) or 0)
        items: list[Any] = []
        total = 0
        while True:
            page = self.get(path, limit=PAGE_LIMIT, offset=offset + len(items), **query)
            batch = page.get(key) or []
            items.extend(batch)
            total = int((page.get("pagination") or {}).get("total", len(items)))
            if not batch or offset + len(items) >= total:
                break
        return {key: items, "pagination": {"offset": offset, "limit": len(items), "total": total}}

    def stream_lines(self, path: str, **query: Any) -> Iterator[bytes]:
        """Yields the lines of a streaming answer (NDJSON) as they arrive, without a timeout."""
        with self._open("GET", path, query=query, timeout=None) as resp:
            while True:
                try:
                    line = resp.readline()
                except (OSError, HTTPException) as exc:
                    raise UnreachableError(f"lost the connection to {self.master}: {exc}") from None
                if not line:
                    return
                if line.strip():
                    yield line

    def download(self, path: str) -> bytes:
        """The raw body of ``GET path`` (e.g. a tarball)."""
        with self._open("GET", path, timeout=None) as resp:
            try:
                return bytes(resp.read())
            except (OSError, HTTPException) as exc:
                raise UnreachableError(f"lost the connection to {self.master}: {exc}") from None

    # ------------------------------------------------------------------ auth and users

    def login(self, username: str, password: str) -> str:
        """Logs in and keeps the token for later calls; returns it."""
        answer = self.call("POST", "/auth/login", {"username": username, "password": password})
        self.token = str(answer["token"])
        return self.token

    def logout(self) -> None:
        """Revokes this client's token."""
        self.post("/auth/logout")
        self.token = None

    def me(self) -> dict[str, Any]:
        """Who the token belongs to: ``{"kind", "username", "admin"}``."""
        return dict(self.get("/me"))

    def list_users(self) -> dict[str, Any]:
        """``{"users": [...]}`` (admin only)."""
        return dict(self.get("/users"))

    def create_user(self, username: str, password: str, *, admin: bool = False) -> dict[str, Any]:
        """Creates a user (admin only; 409 if it exists)."""
        return dict(
            self.post("/users", {"username": username, "password": password, "admin": admin})
        )

    def change_password(
        self, username: str, password: str, *, old_password: str | None = None
    ) -> dict[str, Any]:
        """Sets a user's password (their own, with the current one; an admin: anyone's)."""
        body: dict[str, Any] = {"password": password}
        if old_password is not None:
            body["old_password"] = old_password
        return dict(self.post(f"/users/{_quote(username)}/password", body))

    def list_tokens(self, *, username: str | None = None, everyone: bool = False) -> dict[str, Any]:
        """``{"tokens": [...]}``: the caller's valid tokens (admins: ``username``'s, or
        everyone's)."""
        query: dict[str, Any] = {}
        if username:
            query["username"] = username
        if everyone:
            query["all"] = "true"
        return dict(self.get("/tokens", **query))

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        """Revokes a token by its id (one's own; admins: anyone's)."""
        return dict(self.call("DELETE", f"/tokens/{int(token_id)}"))

    def set_user_active(self, username: str, active: bool) -> dict[str, Any]:
        """Activates or deactivates a user (admin)."""
        action = "activate" if active else "deactivate"
        return dict(self.post(f"/users/{_quote(username)}/{action}"))

    def link_agent_user(
        self, username: str, uid: int, gid: int, *, user: str = "", group: str = ""
    ) -> dict[str, Any]:
        """Links a user to the unix account their trials run as (admin)."""
        body = {"agent_uid": uid, "agent_gid": gid, "agent_user": user, "agent_group": group}
        return dict(self.call("PUT", f"/users/{_quote(username)}/agent-user-group", body))

    def agent_user_group(self, username: str) -> dict[str, Any]:
        """The unix identity a user's trials run as (the user themself, or an admin)."""
        return dict(self.get(f"/users/{_quote(username)}/agent-user-group"))

    def master_info(self) -> dict[str, Any]:
        """The master's version, cluster id and uptime (no login needed)."""
        return dict(self.get("/master"))

    # ------------------------------------------------------------------ templates

    def list_templates(self) -> dict[str, Any]:
        """``{"templates": [...]}``."""
        return dict(self.get("/templates"))

    def get_template(self, name: str) -> dict[str, Any]:
        """One template: ``{"name", "owner", "config", "updated_at"}``."""
        return dict(self.get(f"/templates/{_quote(name)}"))

    def set_template(self, name: str, config: str | dict[str, Any]) -> dict[str, Any]:
        """Creates or replaces a template (YAML text or a mapping)."""
        return dict(self.call("PUT", f"/templates/{_quote(name)}", {"config": config}))

    def remove_template(self, name: str) -> dict[str, Any]:
        """Removes a template."""
        return dict(self.call("DELETE", f"/templates/{_quote(name)}"))

    # ------------------------------------------------------------------ experiments

    def create_experiment(
        self,
        config: str | dict[str, Any],
        code_dir: Path | None,
        *,
        activate: bool = True,
        template: str | None = None,
        includes: Sequence[Path] = (),
    ) -> int:
        """Submits a config (YAML text or a mapping) with the code directory, merged over
        ``template`` if given; returns the id."""
        answer = self.submit_experiment(
            config, code_dir, activate=activate, template=template, includes=includes
        )
        return int(answer["id"])

    def submit_experiment(
        self,
        config: str | dict[str, Any],
        code_dir: Path | None,
        *,
        activate: bool = True,
        template: str | None = None,
        includes: Sequence[Path] = (),
        project_id: int | None = None,
    ) -> dict[str, Any]:
        """Like :meth:`create_experiment`, but returns the whole answer: ``id``, ``code_ref``
        and ``warnings`` (``{path, message}`` for each setting accepted but ignored). Without
        a code directory or includes, no code is sent (the entrypoint must be in the image);
        ``project_id`` puts it in that project (over the config's workspace/project)."""
        body: dict[str, Any] = {"config": config, "activate": activate}
        if project_id is not None:
            body["project_id"] = project_id
        if code_dir is not None or includes:
            body["code"] = base64.b64encode(code_tarball(code_dir, includes)).decode()
        if template is not None:
            body["template"] = template
        return dict(self.call("POST", "/experiments", body))

    def patch_experiment(self, experiment_id: int, changes: dict[str, Any]) -> dict[str, Any]:
        """Changes an experiment's name, description, labels or resources."""
        return dict(self.call("PATCH", f"/experiments/{experiment_id}", changes))

    def continue_experiment(
        self, experiment_id: int, config: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Continues an ended single-trial experiment (``config``: a partial config on top)."""
        return dict(self.post(f"/experiments/{experiment_id}/continue", {"config": config or {}}))

    def list_experiments(self, *, limit: int | None = None, **query: Any) -> dict[str, Any]:
        """``{"experiments": [...], "pagination"}`` filtered by ``state``, ``owner``, ..."""
        return dict(self.paginate("/experiments", "experiments", limit=limit, **query))

    def get_experiment(self, experiment_id: int, *, at: str | None = None) -> dict[str, Any]:
        """One experiment with its trials (``at``: as it was at that log position or time)."""
        return dict(self.get(f"/experiments/{experiment_id}", at=at))

    def experiment_action(self, experiment_id: int, action: str) -> dict[str, Any]:
        """``pause``, ``activate``, ``cancel``, ``kill``, ``archive`` or ``unarchive``."""
        return dict(self.post(f"/experiments/{experiment_id}/{action}"))

    def delete_experiment(self, experiment_id: int) -> dict[str, Any]:
        """Starts deleting a terminal experiment (and its checkpoints)."""
        return dict(self.call("DELETE", f"/experiments/{experiment_id}"))

    def list_trials(self, experiment_id: int, **query: Any) -> dict[str, Any]:
        """``{"trials": [...], "pagination"}`` of one experiment."""
        return dict(self.paginate(f"/experiments/{experiment_id}/trials", "trials", **query))

    def list_checkpoints(self, experiment_id: int, **query: Any) -> dict[str, Any]:
        """``{"checkpoints": [...], "pagination"}`` of one experiment (best first by default)."""
        return dict(
            self.paginate(f"/experiments/{experiment_id}/checkpoints", "checkpoints", **query)
        )

    # ------------------------------------------------------------------ trials and checkpoints

    def run_command(
        self,
        argv: Sequence[str],
        config: dict[str, Any],
        context: Path | None = None,
        *,
        workspace: str | int | None = None,
    ) -> dict[str, Any]:
        """Submits a command task (``argv`` run in the uploaded ``context`` directory, if any)
        in ``workspace`` (its name or id; ``None``: the default workspace); returns the task as
        :meth:`get_task` does."""
        body: dict[str, Any] = {"argv": list(argv), "config": config}
        if context is not None:
            body["code"] = base64.b64encode(code_tarball(context)).decode()
        if workspace is not None:
            body["workspace"] = workspace
        return dict(self.call("POST", "/commands", body))

    def start_notebook(
        self,
        config: dict[str, Any],
        context: Path | None = None,
        *,
        workspace: str | int | None = None,
    ) -> dict[str, Any]:
        """Starts a notebook task (JupyterLab in the uploaded ``context`` directory, if any) in
        ``workspace`` (``None``: the default one); returns the task as :meth:`get_task` does."""
        return self._start_served("/notebooks", config, context, workspace)

    def start_shell(
        self,
        config: dict[str, Any],
        context: Path | None = None,
        *,
        workspace: str | int | None = None,
    ) -> dict[str, Any]:
        """Starts a shell task (its shells start in the uploaded ``context`` directory, if any)
        in ``workspace`` (``None``: the default one); returns the task as :meth:`get_task`
        does."""
        return self._start_served("/shells", config, context, workspace)

    def _start_served(
        self,
        path: str,
        config: dict[str, Any],
        context: Path | None,
        workspace: str | int | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"config": config}
        if context is not None:
            body["code"] = base64.b64encode(code_tarball(context)).decode()
        if workspace is not None:
            body["workspace"] = workspace
        return dict(self.call("POST", path, body))

    def start_tensorboard(
        self,
        experiment_ids: Sequence[int],
        trial_ids: Sequence[int] = (),
        config: dict[str, Any] | None = None,
        *,
        workspace: str | int | None = None,
    ) -> dict[str, Any]:
        """Starts a TensorBoard over every trial of ``experiment_ids`` and the trials
        ``trial_ids`` in ``workspace`` (``None``: the default one); returns the task as
        :meth:`get_task` does."""
        body: dict[str, Any] = {
            "experiment_ids": list(experiment_ids),
            "trial_ids": list(trial_ids),
            "config": config or {},
        }
        if workspace is not None:
            body["workspace"] = workspace
        return dict(self.call("POST", "/tensorboards", body))

    def list_tasks(self, *, workspace: str | int | None = None) -> dict[str, Any]:
        """The tasks the caller may see (their own, those of workspaces where a role lets them
        see tasks; an admin's: everyone's), of ``workspace`` (its name or id) when given:
        ``{"tasks": [...]}``."""
        if workspace is None:
            return dict(self.get("/tasks"))
        if isinstance(workspace, str):
            ref = urllib.parse.quote(workspace, safe="")
            workspace = int(self.get(f"/workspaces/{ref}")["id"])
        return dict(self.get("/tasks", workspace_id=workspace))

    def get_task(self, task_id: str) -> dict[str, Any]:
        """One task: state, argv, config, allocation, outcome and exit code."""
        return dict(self.get(f"/tasks/{urllib.parse.quote(task_id, safe='')}"))

    def kill_task(self, task_id: str) -> dict[str, Any]:
        """Asks to kill a task: ``{"id", "state", "changed"}``."""
        return dict(self.post(f"/tasks/{urllib.parse.quote(task_id, safe='')}/kill"))

    def task_logs(self, task_id: str, **query: Any) -> dict[str, Any]:
        """One page of a task's output: ``{"logs", "next_after_id", "done"}``."""
        return dict(self.get(f"/tasks/{urllib.parse.quote(task_id, safe='')}/logs", **query))

    def get_trial(self, trial_id: int) -> dict[str, Any]:
        """One trial with its allocations, checkpoints and progress."""
        return dict(self.get(f"/trials/{trial_id}"))

    def trial_logs(self, trial_id: int, **query: Any) -> dict[str, Any]:
        """One page of a trial's logs: ``{"logs", "next_after_id", "done"}``."""
        return dict(self.get(f"/trials/{trial_id}/logs", **query))

    def follow_trial_logs(self, trial_id: int, **query: Any) -> Iterator[dict[str, Any]]:
        """A trial's logs as they are written, until it ends and they are drained."""
        for line in self.stream_lines(f"/trials/{trial_id}/logs", follow=True, **query):
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                yield item

    def kill_trial(self, trial_id: int) -> dict[str, Any]:
        """Asks the scheduler to kill a trial."""
        return dict(self.post(f"/trials/{trial_id}/kill"))

    def get_checkpoint(self, uuid: str) -> dict[str, Any]:
        """One checkpoint."""
        return dict(self.get(f"/checkpoints/{_quote(uuid)}"))

    def delete_checkpoints(self, uuids: list[str]) -> dict[str, Any]:
        """Asks for checkpoints of ended experiments to be deleted."""
        return dict(self.call("DELETE", "/checkpoints", {"checkpoint_uuids": uuids}))

    def download_checkpoint(self, uuid: str) -> bytes:
        """A checkpoint's directory as a tar.gz."""
        return self.download(f"/checkpoints/{_quote(uuid)}/download")

    # ------------------------------------------------------------------ model registry

    def list_models(self, **query: Any) -> dict[str, Any]:
        """``{"models": [...]}`` (``name``, ``label``, ``archived``, ``workspace_names``,
        ``workspace_ids`` (comma-separated), ``sort_by``, ``order_by`` filter and order them)."""
        return dict(self.get("/models", **query))

    def create_model(self, name: str, **fields: Any) -> dict[str, Any]:
        """Creates a model (``description``, ``labels``, ``metadata``, ``notes``, and its
        workspace: ``workspace_name`` or ``workspace_id``, neither for Uncategorized); returns
        it."""
        body = {"name": name, **{k: v for k, v in fields.items() if v is not None}}
        return dict(self.post("/models", body))

    def get_model(self, name: str) -> dict[str, Any]:
        """One model, by name or number."""
        return dict(self.get(f"/models/{_quote(name)}"))

    def patch_model(self, name: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Changes a model's name, description, labels, metadata or notes; returns it."""
        return dict(self.call("PATCH", f"/models/{_quote(name)}", changes))

    def move_model(
        self,
        name: str,
        *,
        workspace_name: str | None = None,
        workspace_id: int | None = None,
    ) -> dict[str, Any]:
        """Moves a model, with its versions, to another workspace (by name or id); returns
        it."""
        body: dict[str, Any] = {}
        if workspace_name is not None:
            body["workspace_name"] = workspace_name
        if workspace_id is not None:
            body["destination_workspace_id"] = int(workspace_id)
        return dict(self.post(f"/models/{_quote(name)}/move", body))

    def set_model_archived(self, name: str, archived: bool) -> dict[str, Any]:
        """Archives or unarchives a model; returns it."""
        verb = "archive" if archived else "unarchive"
        return dict(self.post(f"/models/{_quote(name)}/{verb}", {}))

    def delete_model(self, name: str) -> dict[str, Any]:
        """Deletes a model and its versions."""
        return dict(self.call("DELETE", f"/models/{_quote(name)}"))

    def list_model_versions(self, name: str) -> dict[str, Any]:
        """``{"model": {...}, "model_versions": [...]}``, oldest version first."""
        return dict(self.get(f"/models/{_quote(name)}/versions"))

    def register_model_version(
        self, name: str, checkpoint_uuid: str, **fields: Any
    ) -> dict[str, Any]:
        """Registers a checkpoint as the model's next version (``name``, ``comment``,
        ``labels``, ``metadata``, ``notes`` of the version in ``fields``); returns it."""
        body = {
            "checkpoint_uuid": checkpoint_uuid,
            **{k: v for k, v in fields.items() if v is not None},
        }
        return dict(self.post(f"/models/{_quote(name)}/versions", body))

    def get_model_version(self, name: str, version: int) -> dict[str, Any]:
        """One version of a model (``-1``: the latest)."""
        return dict(self.get(f"/models/{_quote(name)}/versions/{int(version)}"))

    def patch_model_version(
        self, name: str, version: int, changes: dict[str, Any]
    ) -> dict[str, Any]:
        """Changes a version's name, comment, labels, metadata or notes; returns it."""
        path = f"/models/{_quote(name)}/versions/{int(version)}"
        return dict(self.call("PATCH", path, changes))

    def delete_model_version(self, name: str, version: int) -> dict[str, Any]:
        """Deletes one version of a model."""
        return dict(self.call("DELETE", f"/models/{_quote(name)}/versions/{int(version)}"))

    # ------------------------------------------------------------------ agents and slots

    def list_agents(self, *, at: str | None = None) -> dict[str, Any]:
        """``{"agents": [...]}``, each with its slots (``at``: as they were then)."""
        return dict(self.get("/agents", at=at))

    def set_agent_enabled(
        self, agent_id: str, enabled: bool, *, drain: bool = False
    ) -> dict[str, Any]:
        """Enables or disables a whole agent (admin; ``drain`` lets running work finish)."""
        if enabled:
            return dict(self.post(f"/agents/{_quote(agent_id)}/enable"))
        return dict(self.post(f"/agents/{_quote(agent_id)}/disable", {"drain": drain}))

    def list_agent_credentials(self) -> dict[str, Any]:
        """``{"credentials": [...]}``: every agent credential issued, live and revoked (admin)."""
        return dict(self.get("/agent-credentials"))

    def revoke_agent(self, agent_id: str) -> dict[str, Any]:
        """Revokes an agent's credential (admin): the agent is refused and declared lost."""
        return dict(self.post(f"/agents/{_quote(agent_id)}/revoke", {}))

    def list_slots(self) -> dict[str, Any]:
        """``{"slots": [...]}`` over all agents."""
        return dict(self.get("/slots"))

    def set_slot_enabled(self, agent_id: str, slot_id: str, enabled: bool) -> dict[str, Any]:
        """Enables or disables one slot of an agent (admin)."""
        action = "enable" if enabled else "disable"
        return dict(self.post(f"/agents/{_quote(agent_id)}/slots/{_quote(slot_id)}/{action}"))


def _quote(part: str) -> str:
    return urllib.parse.quote(str(part), safe="")
