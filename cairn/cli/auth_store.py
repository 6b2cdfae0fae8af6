"""Where the CLI keeps its tokens, how it resolves the master, and how it logs in on its own.

Tokens are stored per master in ``$CAIRN_HOME/auth.json`` (or ``~/.cairn/auth.json``), a file only
its owner may read (mode 0600)::

    {"masters": {"http://127.0.0.1:8080": {"token": "...", "username": "admin", "auto": true}}}

``auto`` marks a token the CLI obtained by itself (the embedded cluster's admin, or
``CAIRN_USER``/``CAIRN_PASSWORD``); such a token is replaced silently when the master refuses it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from cairn.client import ApiError, Client
from cairn.errors import AuthRequiredError
from cairn.local.cluster import default_data_dir
from cairn.local.service_credentials import admin_password
from cairn.local.state import read_state

AUTH_FILE = "auth.json"
DEFAULT_MASTER = "http://localhost:8080"


def normalize(master: str) -> str:
    """A master URL in the form used as a key: a scheme, no trailing slash."""
    master = master.strip().rstrip("/")
    if "://" not in master:
        master = f"http://{master}"
    return master


def local_master() -> str | None:
    """The embedded cluster's API URL from ``$CAIRN_HOME/cluster.json`` (``./.cairn``), if any."""
    state = read_state(default_data_dir())
    if state is None or not state.api_url:
        return None
    return normalize(state.api_url)


def resolve_master(given: str | None) -> str:
    """``-m`` if given, else ``$CAIRN_MASTER``, else the embedded cluster's, else localhost:8080."""
    if given:
        return normalize(given)
    env = os.environ.get("CAIRN_MASTER")
    if env:
        return normalize(env)
    return local_master() or DEFAULT_MASTER


def auth_path() -> Path:
    """``$CAIRN_HOME/auth.json`` when CAIRN_HOME is set, else ``~/.cairn/auth.json``."""
    home = os.environ.get("CAIRN_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".cairn"
    return base / AUTH_FILE


def _load() -> dict[str, Any]:
    try:
        data = json.loads(auth_path().read_text())
    except (OSError, ValueError):
        return {"masters": {}}
    if not isinstance(data, dict) or not isinstance(data.get("masters"), dict):
        return {"masters": {}}
    return data


def _save(data: dict[str, Any]) -> None:
    path = auth_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def stored(master: str) -> dict[str, Any] | None:
    """The stored entry (``token``, ``username``, ``auto``) for a master, if there is one."""
    entry = _load()["masters"].get(normalize(master))
    return entry if isinstance(entry, dict) and entry.get("token") else None


def store(master: str, token: str, username: str, *, auto: bool = False) -> None:
    """Saves the token for a master (replacing any other), keeping the file at mode 0600."""
    data = _load()
    data["masters"][normalize(master)] = {"token": token, "username": username, "auto": auto}
    _save(data)


def forget(master: str) -> bool:
    """Removes the master's token; returns whether there was one."""
    data = _load()
    had = data["masters"].pop(normalize(master), None) is not None
    if had:
        _save(data)
    return had


def _auto_credentials(master: str) -> tuple[str, str] | None:
    user, password = os.environ.get("CAIRN_USER"), os.environ.get("CAIRN_PASSWORD")
    if user and password is not None:
        return user, password
    if master == local_master():
        # the cluster's own record of it first: it is what the cluster was started with
        password = admin_password(default_data_dir()) or os.environ.get("CAIRN_ADMIN_PASSWORD")
        return ("admin", password) if password else None
    return None


def _login_hint(master: str) -> str:
    return f"not logged in to {master}: run `cairn user login` (or `cairn -m {master} user login`)"


def connect(args: argparse.Namespace) -> Client:
    """A client for ``args.master`` carrying the stored token, which logs in by itself when it may.

    On a 401 the client logs in with ``CAIRN_USER``/``CAIRN_PASSWORD``, or as the embedded
    cluster's admin (with the password ``cairn up`` keeps in ``admin.password``) when the master
    is the local cluster, provided no token was stored or the
    stored one was obtained that way; otherwise it raises :class:`AuthRequiredError` (exit 3).
    """
    master = resolve_master(getattr(args, "master", None))
    entry = stored(master)

    def on_unauthorized(client: Client) -> bool:
        current = stored(master)
        if current is not None and not current.get("auto"):
            raise AuthRequiredError(
                f"the master {master} refused the stored token for {current.get('username')!r}: "
                "run `cairn user login` again"
            )
        credentials = _auto_credentials(master)
        if credentials is None:
            raise AuthRequiredError(_login_hint(master))
        username, password = credentials
        helper = Client(master, timeout=client.timeout)
        try:
            token = helper.login(username, password)
        except ApiError as exc:
            if exc.status in (400, 401):
                raise AuthRequiredError(
                    f"could not log in to {master} as {username!r}: {exc}; run `cairn user login`"
                ) from None
            raise
        store(master, token, username, auto=True)
        client.token = token
        return True

    return Client(
        master,
        token=entry["token"] if entry else None,
        on_unauthorized=on_unauthorized,
    )
