"""Which master to talk to, as whom, and where tokens are kept: shared by the CLI and the SDK.

**The master**: an explicit address (``-m``, ``login(master=...)``), else ``$CAIRN_MASTER``,
else Determined's ``$DET_MASTER`` (then ``$DET_MASTER_ADDR``), else the embedded cluster's API
from ``$CAIRN_HOME/cluster.json`` (``./.cairn``), else ``http://localhost:8080``. An address
without a scheme gets ``http://`` and, without a port, Determined's 8080.

**The user**: an explicit one (``-u``, ``login(user=...)``) logs in with the password given, or
with ``$CAIRN_PASSWORD``/``$DET_PASS``, or one asked on the terminal, unless the token stored for
the master is already that user's. Otherwise the stored token is used; when the master refuses it
(or none is stored) the client logs in by itself with ``$CAIRN_USER``/``$CAIRN_PASSWORD``, else
Determined's ``$DET_USER``/``$DET_PASS``, else as the embedded cluster's admin (with the password
``cairn up`` keeps in ``admin.password``) when the master is the local cluster. Where a ``CAIRN_*`` variable and its Determined twin are both set, the
``CAIRN_*`` one wins.

**Tokens** are stored per master in ``$CAIRN_HOME/auth.json`` (or ``~/.cairn/auth.json``), a
file only its owner may read (mode 0600)::

    {"masters": {"http://127.0.0.1:8080": {"token": "...", "username": "admin", "auto": true}}}

``auto`` marks a token the client obtained by itself; such a token is replaced silently when the
master refuses it. Every variable is read when a client is made, never at import time.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cairn.client import ApiError, Client
from cairn.errors import AuthRequiredError, UsageError
from cairn.local.layout import default_data_dir
from cairn.local.service_credentials import admin_password
from cairn.local.state import read_state
from events import settings

AUTH_FILE = "auth.json"
DEFAULT_PORT = 8080
DEFAULT_MASTER = f"http://localhost:{DEFAULT_PORT}"
MASTER_VARIABLES = tuple(s.name for s in settings.MASTERS)
"""Where the master's address is read from, first set wins."""
CREDENTIAL_VARIABLES = tuple((u.name, p.name) for u, p in settings.CREDENTIALS)
"""(user, password) variable pairs, first pair set wins."""


def normalize(master: str) -> str:
    """A master URL in the form used as a key: a scheme, a port when none was given without a
    scheme (Determined's 8080), no trailing slash."""
    master = master.strip().rstrip("/")
    if "://" not in master:
        master = f"http://{master}"
        if urlsplit(master).port is None:
            master = f"{master}:{DEFAULT_PORT}"
    return master


def local_master() -> str | None:
    """The embedded cluster's API URL from ``$CAIRN_HOME/cluster.json`` (``./.cairn``), if any."""
    state = read_state(default_data_dir())
    if state is None or not state.api_url:
        return None
    return normalize(state.api_url)


def resolve_master(given: str | None) -> str:
    """The master's URL (see the module docstring for the order)."""
    if given:
        return normalize(given)
    for setting in settings.MASTERS:
        value = setting.get()
        if value:
            return normalize(value)
    return local_master() or DEFAULT_MASTER


def auth_path() -> Path:
    """``$CAIRN_HOME/auth.json`` when CAIRN_HOME is set, else ``~/.cairn/auth.json``."""
    return settings.home_or_user_dir() / AUTH_FILE


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


def env_credentials() -> tuple[str, str] | None:
    """``(user, password)`` from ``CAIRN_USER``/``CAIRN_PASSWORD``, else ``DET_USER``/``DET_PASS``."""
    for user_setting, password_setting in settings.CREDENTIALS:
        user, password = user_setting.get(), password_setting.get()
        if user and password is not None:
            return user, password
    return None


def env_password(user: str) -> str | None:
    """The password the environment gives for ``user``: that of the first pair naming ``user``,
    else a password variable set without its user variable."""
    for user_setting, password_setting in settings.CREDENTIALS:
        named, password = user_setting.get(), password_setting.get()
        if password is not None and named in (user, None):
            return password
    return None


def _auto_credentials(master: str) -> tuple[str, str] | None:
    found = env_credentials()
    if found is not None:
        return found
    if master == local_master():
        # the cluster's own record of it first: it is what the cluster was started with
        password = admin_password(default_data_dir()) or settings.ADMIN_PASSWORD.get()
        return ("admin", password) if password else None
    return None


def _login_hint(master: str) -> str:
    return f"not logged in to {master}: run `cairn user login` (or `cairn -m {master} user login`)"


def login(master: str, username: str, password: str, *, timeout: float = 30.0) -> str:
    """Logs in to ``master`` and stores the token (as the user's own); returns it.

    Raises:
        AuthRequiredError: the master refused the username or password.
        UnreachableError: the master did not answer.
    """
    try:
        token = Client(master, timeout=timeout).login(username, password)
    except ApiError as exc:
        if exc.status in (400, 401):
            raise AuthRequiredError(f"login to {master} as {username!r} failed: {exc}") from None
        raise
    store(master, token, username)
    return token


def _ask_password(master: str, user: str) -> str:
    if not sys.stdin.isatty():
        raise AuthRequiredError(
            f"a password for {user!r} on {master} is required: set CAIRN_PASSWORD (or DET_PASS), "
            f"or run `cairn -m {master} user login {user}` first"
        )
    return getpass.getpass(f"Password for user '{user}': ")


def session(
    master: str | None = None,
    user: str | None = None,
    password: str | None = None,
    *,
    timeout: float = 30.0,
) -> Client:
    """A client for the master, carrying a token, that logs in again by itself when it may.

    Args:
        master: the master's address (default: the environment, see the module docstring).
        user: log in as this user (unless the stored token is already theirs).
        password: ``user``'s password (default: ``$CAIRN_PASSWORD``/``$DET_PASS``, else asked
            on a terminal).
        timeout: seconds to wait for each answer.

    Raises:
        AuthRequiredError: ``user`` was given, its password is needed and none can be had, or
            the master refused it.
        UsageError: ``password`` was given without ``user``.
    """
    address = resolve_master(master)
    if password is not None and not user:
        raise UsageError("a password needs a user to go with it")
    entry = stored(address)
    if user and (password is not None or entry is None or entry.get("username") != user):
        secret = password if password is not None else env_password(user)
        login(address, user, secret if secret is not None else _ask_password(address, user))
        entry = stored(address)

    def on_unauthorized(client: Client) -> bool:
        current = stored(address)
        if current is not None and not current.get("auto"):
            raise AuthRequiredError(
                f"the master {address} refused the stored token for {current.get('username')!r}: "
                "run `cairn user login` again"
            )
        credentials = _auto_credentials(address)
        if credentials is None:
            raise AuthRequiredError(_login_hint(address))
        username, secret = credentials
        helper = Client(address, timeout=client.timeout)
        try:
            token = helper.login(username, secret)
        except ApiError as exc:
            if exc.status in (400, 401):
                raise AuthRequiredError(
                    f"could not log in to {address} as {username!r}: {exc}; run `cairn user login`"
                ) from None
            raise
        store(address, token, username, auto=True)
        client.token = token
        return True

    return Client(
        address,
        token=entry["token"] if entry else None,
        timeout=timeout,
        on_unauthorized=on_unauthorized,
    )
