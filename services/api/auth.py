"""Who is calling: users (scrypt passwords, hashed bearer tokens), agents, trials, joiners.

Four kinds of bearer token are accepted:

- user tokens, from ``POST /api/v1/auth/login``; only their SHA-256 is stored (``api_tokens``);
- agent tokens, ``agent:<random>``, each bound to one agent id, issued once from the join token
  (:mod:`services.api.agent_credentials`); a revoked one is refused;
- the cluster's join token (:func:`join_token`), which only opens ``POST
  /api/v1/agents/{agent_id}/join``;
- trial tokens, ``trial:<label>:<run_id>:<hex>`` where ``<label>`` names the trial as
  :func:`events.domain.names.trial_label` does (``17``; a legacy trial ``9.1``) and ``<hex>`` is
  HMAC-SHA256 of ``trial:<label>:<run_id>`` under the cluster secret (created by the first
  migration); they open only their own trial and its allocations, and only while ``run_id`` is
  the trial's current run (a token of an earlier run is refused with 403, reason
  ``run_not_current``). Tokens of the older form without a run are refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import structlog
from aiohttp import web

from events import settings
from events.domain.names import parse_trial_id, trial_label, trial_stream
from events.domain.types import SlotsAllocated
from events.log.store import EventStore
from services.api import agent_credentials, tables
from services.api.audit_trail import actor_of, set_actor
from services.api.errors import ApiError, forbidden, unauthorized
from services.api.routing import Route, state_of

log = structlog.get_logger("api")

TRIAL_PREFIX = "trial:"
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1
# Checked against when the user does not exist, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${'00' * 16}${'00' * 32}"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller.

    Attributes:
        kind: ``user``, ``agent``, ``trial`` or ``join`` (the join token).
        name: the username, the agent id, the trial's label, or ``join``.
        admin: whether a user is an administrator.
        run_id: for a trial, the run its token was minted for.
        incarnation: for an agent, the process it last registered as.
    """

    kind: Literal["user", "agent", "trial", "join"]
    name: str
    admin: bool = False
    run_id: int | None = None
    incarnation: str | None = None

    @property
    def is_admin(self) -> bool:
        """Whether this is an administrator user."""
        return self.kind == "user" and self.admin

    def describe(self) -> dict[str, Any]:
        """The caller as shown by ``GET /api/v1/me``."""
        if self.kind == "user":
            return {"kind": "user", "username": self.name, "admin": self.admin}
        if self.kind == "trial":
            return {"kind": "trial", "trial_id": parse_trial_id(self.name), "run_id": self.run_id}
        if self.kind == "agent":
            return {"kind": "agent", "agent_id": self.name}
        return {"kind": self.kind}


_PRINCIPAL = web.RequestKey("cairn_principal", Principal)


# --- passwords and tokens -------------------------------------------------------------------


def hash_password(password: str) -> str:
    """Hashes a password with scrypt and a random salt (``scrypt$n$r$p$salt$hash``)."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches a :func:`hash_password` result (constant-time compare)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        got = hashlib.scrypt(
            password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p), dklen=32
        )
    except ValueError:
        return False
    return hmac.compare_digest(got.hex(), digest)


def hash_token(token: str) -> str:
    """The stored form of a bearer token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def sign_trial_token(secret: bytes, trial_id: int, run_id: int) -> str:
    """Mints the token that lets one run of a trial call the API for that trial only.

    Args:
        secret: the cluster secret (:func:`cluster_secret`).
        trial_id: e.g. ``17``.
        run_id: the run (``SlotsAllocated.run_id``) it is valid for.

    Returns:
        ``trial:<label>:<run_id>:<HMAC-SHA256(secret, "trial:<label>:<run_id>") hex>``.
    """
    return _sign(secret, f"{trial_label(trial_id)}:{run_id}")


def sign_serve_token(secret: bytes, task_id: str, allocation_id: str) -> str:
    """The token a task's server (a notebook) requires of every request: only the API's proxy,
    which adds it, and the agent that started the server know it, so another process that can
    reach the server's port (another user's trial on the same host) is refused.

    Args:
        secret: the cluster secret (:func:`cluster_secret`).
        task_id: the task.
        allocation_id: the task's allocation (a new allocation gets a new token).

    Returns:
        ``HMAC-SHA256(secret, "serve:<task_id>:<allocation_id>")`` in hex.
    """
    label = f"serve:{task_id}:{allocation_id}".encode()
    return hmac.new(secret, label, hashlib.sha256).hexdigest()


def _sign(secret: bytes, label: str) -> str:
    mac = hmac.new(secret, f"{TRIAL_PREFIX}{label}".encode(), hashlib.sha256).hexdigest()
    return f"{TRIAL_PREFIX}{label}:{mac}"


def verify_trial_token(secret: bytes, token: str) -> tuple[str, int] | None:
    """The trial label (``"17"``) and run a trial token was minted for, or ``None`` if it is
    not valid (forged, or of the older form without a run)."""
    if not token.startswith(TRIAL_PREFIX):
        return None
    signed, sep, _ = token[len(TRIAL_PREFIX) :].rpartition(":")
    label, sep2, run = signed.rpartition(":")
    if not sep or not sep2 or not label or not (run.isascii() and run.isdigit()) or len(run) > 18:
        return None
    expected = _sign(secret, signed)
    if not hmac.compare_digest(expected.encode(), token.encode()):
        return None
    return label, int(run)


# --- stored credentials ---------------------------------------------------------------------


async def cluster_secret(store: EventStore) -> bytes:
    """The cluster secret that signs trial tokens (applies the gateway's migrations first)."""
    await tables.migrate(store)
    value = await store.fetchval("SELECT value FROM api_secrets WHERE name = 'cluster'")
    return bytes.fromhex(str(value))


async def trial_token(store: EventStore, trial_id: int, run_id: int) -> str:
    """Mints the token of run ``run_id`` of trial ``trial_id`` (for code outside the gateway)."""
    return sign_trial_token(await cluster_secret(store), trial_id, run_id)


async def join_token(store: EventStore, path: str | None = None) -> str:
    """The cluster's join token, which agents present once to receive their own credential.

    Read from ``path`` (a file, mode 0600, one line) when given; else ``CAIRN_AGENT_TOKEN`` (the
    name the one shared agent token had, still honoured for clusters configured that way);
    else a random token generated on first use and kept in ``api_secrets``, so every gateway
    replica agrees on it.

    Raises:
        ApiError: 500 when ``path`` cannot be read or is empty.
    """
    if path:
        try:
            value = (await asyncio.to_thread(Path(path).read_text)).strip()
        except OSError as exc:
            raise ApiError(500, f"cannot read the join token file {path}: {exc}") from exc
        if not value:
            raise ApiError(500, f"the join token file {path} is empty")
        return value
    from_env = settings.AGENT_TOKEN.get()
    if from_env:
        return from_env
    await tables.migrate(store)
    await store.execute(
        "INSERT INTO api_secrets (name, value) VALUES ('agent_token', $1) "
        "ON CONFLICT (name) DO NOTHING",
        "join:" + secrets.token_urlsafe(32),
    )
    value = await store.fetchval("SELECT value FROM api_secrets WHERE name = 'agent_token'")
    return str(value)


LEGACY_ADMIN_PASSWORD = "admin"
"""The password earlier versions gave the initial admin when none was set; it is replaced by the
one given, the first time the gateway starts with one (see :func:`ensure_admin`)."""


async def ensure_admin(store: EventStore, password: str | None) -> None:
    """Creates the ``admin`` user on first start, with ``password``; there is no default.

    An existing admin keeps its password, unless it is still the one earlier versions set by
    default (:data:`LEGACY_ADMIN_PASSWORD`): a data directory from before is upgraded to the
    password given, so the old default stops working. Without a password no admin is made (and
    the gateway says so); the others still work.

    Args:
        store: the event store.
        password: the initial admin's password (``cairn up`` generates one at the first start
            and hands it over in ``CAIRN_ADMIN_PASSWORD_FILE``).
    """
    loop = asyncio.get_running_loop()
    stored = await store.fetchval("SELECT password_hash FROM api_users WHERE username = 'admin'")
    if stored is not None:
        if password is None or password == LEGACY_ADMIN_PASSWORD:
            return
        legacy = await loop.run_in_executor(
            None, verify_password, LEGACY_ADMIN_PASSWORD, str(stored)
        )
        if legacy:
            await change_password(store, "admin", password)
            log.warning("replaced the admin's default password with the one given")
        return
    if not password:
        log.warning(
            "no admin user created: no initial password given "
            "(set CAIRN_ADMIN_PASSWORD_FILE or CAIRN_ADMIN_PASSWORD)"
        )
        return
    hashed = await loop.run_in_executor(None, hash_password, password)
    await store.execute(
        "INSERT INTO api_users (username, password_hash, admin) VALUES ('admin', $1, true) "
        "ON CONFLICT (username) DO NOTHING",
        hashed,
    )
    log.info("created initial admin user")


async def create_user(store: EventStore, username: str, password: str, *, admin: bool) -> bool:
    """Adds a user; returns ``False`` if the name is taken."""
    hashed = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
    row = await store.fetchval(
        "INSERT INTO api_users (username, password_hash, admin) VALUES ($1, $2, $3) "
        "ON CONFLICT (username) DO NOTHING RETURNING 1",
        username,
        hashed,
        admin,
    )
    return row is not None


async def user_exists(store: EventStore, username: str) -> bool:
    """Whether an account named ``username`` exists (active or not)."""
    found = await store.fetchval("SELECT 1 FROM api_users WHERE username = $1", username)
    return found is not None


async def list_users(store: EventStore) -> list[dict[str, Any]]:
    """Every user account by name: ``username``, ``admin``, ``active``, ``created_at`` (ISO
    8601)."""
    rows = await store.fetch(
        "SELECT username, admin, active, created_at FROM api_users ORDER BY username"
    )
    return [
        {
            "username": str(r["username"]),
            "admin": bool(r["admin"]),
            "active": bool(r["active"]),
            "created_at": r["created_at"].isoformat(),
        }
        for r in rows
    ]


async def set_active(store: EventStore, username: str, active: bool) -> bool | None:
    """Activates or deactivates a user; deactivating revokes every token the user holds.

    Returns:
        Whether the user was active before, or ``None`` when there is no such user.
    """
    async with store.connection() as conn, conn.transaction():
        before = await conn.fetchval(
            "SELECT active FROM api_users WHERE username = $1 FOR UPDATE", username
        )
        if before is None:
            return None
        await conn.execute("UPDATE api_users SET active = $2 WHERE username = $1", username, active)
        if not active:
            await conn.execute("DELETE FROM api_tokens WHERE username = $1", username)
    return bool(before)


async def check_password(store: EventStore, username: str, password: str) -> bool:
    """Whether ``password`` is ``username``'s (as slow for an unknown user as for a known one)."""
    stored = await store.fetchval(
        "SELECT password_hash FROM api_users WHERE username = $1", username
    )
    hashed = str(stored) if stored is not None else _DUMMY_HASH
    ok = await asyncio.get_running_loop().run_in_executor(None, verify_password, password, hashed)
    return stored is not None and ok


async def change_password(
    store: EventStore, username: str, password: str, *, keep_token: str | None = None
) -> bool:
    """Sets a user's password and revokes the user's tokens (all but ``keep_token``, the one
    the change was made with); returns ``False`` when there is no such user."""
    hashed = await asyncio.get_running_loop().run_in_executor(None, hash_password, password)
    keep = hash_token(keep_token) if keep_token is not None else ""
    async with store.connection() as conn, conn.transaction():
        found = await conn.fetchval(
            "UPDATE api_users SET password_hash = $2 WHERE username = $1 RETURNING 1",
            username,
            hashed,
        )
        if found is None:
            return False
        await conn.execute(
            "DELETE FROM api_tokens WHERE username = $1 AND token_hash <> $2", username, keep
        )
    return True


async def login(
    store: EventStore, username: str, password: str, *, lifetime: timedelta
) -> tuple[str, bool, datetime] | None:
    """Checks a password and issues a new user token, valid for ``lifetime``.

    Returns:
        ``(token, admin, expires_at)``, or ``None`` when the user is unknown or the password
        wrong.

    Raises:
        ApiError: 401 saying so when the password is right but the user is deactivated.
    """
    row = await store.fetchrow(
        "SELECT password_hash, admin, active FROM api_users WHERE username = $1", username
    )
    stored = str(row["password_hash"]) if row is not None else _DUMMY_HASH
    ok = await asyncio.get_running_loop().run_in_executor(None, verify_password, password, stored)
    if row is None or not ok:
        return None
    if not row["active"]:
        raise unauthorized(f"user {username!r} is deactivated; an admin can activate it")
    token = secrets.token_urlsafe(32)
    expires_at = await store.fetchval(
        "INSERT INTO api_tokens (token_hash, username, expires_at) "
        "VALUES ($1, $2, now() + $3::interval) RETURNING expires_at",
        hash_token(token),
        username,
        lifetime,
    )
    return token, bool(row["admin"]), expires_at


async def logout(store: EventStore, token: str) -> None:
    """Revokes a user token."""
    await store.execute("DELETE FROM api_tokens WHERE token_hash = $1", hash_token(token))


async def authenticate(request: web.Request, token: str) -> Principal | None:
    """Resolves a bearer token to its principal, or ``None`` when it is not valid.

    Raises:
        ApiError: 403 (reason ``run_not_current``) for a trial token whose run is no longer
            the trial's current run.
    """
    state = state_of(request)
    if token.startswith(TRIAL_PREFIX):
        minted = verify_trial_token(state.secret, token)
        if minted is None:
            return None
        label, run_id = minted
        await _check_run_current(state.store, label, run_id)
        return Principal("trial", label, run_id=run_id)
    if token.startswith(agent_credentials.TOKEN_PREFIX):
        credential = await agent_credentials.lookup(state.store, token)
        if credential is None:
            return None
        return Principal("agent", credential.agent_id, incarnation=credential.incarnation)
    if state.join_token and hmac.compare_digest(token.encode(), state.join_token.encode()):
        return Principal("join", "join")
    row = await state.store.fetchrow(
        """SELECT u.username, u.admin FROM api_tokens t JOIN api_users u USING (username)
           WHERE t.token_hash = $1 AND (t.expires_at IS NULL OR t.expires_at > now())
             AND u.active""",
        hash_token(token),
    )
    if row is None:
        return None
    return Principal("user", str(row["username"]), admin=bool(row["admin"]))


async def _check_run_current(store: EventStore, label: str, run_id: int) -> None:
    """Raises a 403 unless ``run_id`` is trial ``label``'s current run: the run of its latest
    ``SlotsAllocated``, whose ``TrialExited`` is not recorded."""
    from services.api.runs import RUN_NOT_CURRENT  # runs reads views, which reads this module

    latest = await store.latest_lifecycle(
        trial_stream(parse_trial_id(label)), ("SlotsAllocated", "TrialExited"), limit=2
    )
    current: int | None = None
    for event in latest:  # newest first: an exit after the latest allocation ends it
        if event.type == "SlotsAllocated":
            current = event.decode_as(SlotsAllocated).run_id
            break
        if event.type == "TrialExited":
            break
    if current != run_id:
        raise ApiError(
            403,
            f"this token belongs to run {run_id} of trial {label}, which is not the trial's "
            f"current run" + (f" ({current})" if current is not None else ""),
            details={"reason": RUN_NOT_CURRENT},
        )


# --- request helpers ------------------------------------------------------------------------


def bearer(request: web.Request) -> str | None:
    """The bearer token of a request, if it carries one."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


SESSION_COOKIE = "cairn_session"
"""The cookie holding a user's session token after a login, sent by a browser only to the task
proxy (:data:`SESSION_COOKIE_PATH`), so a page served there needs no token in its URL."""

SESSION_COOKIE_PATH = "/proxy/"


def set_session_cookie(response: web.StreamResponse, token: str, *, max_age: timedelta) -> None:
    """Sets the session cookie: HttpOnly (no script reads it), SameSite=Strict (no other
    site's page sends it), scoped to the proxy's paths."""
    response.set_cookie(
        SESSION_COOKIE,
        token,
        path=SESSION_COOKIE_PATH,
        max_age=int(max_age.total_seconds()),
        httponly=True,
        samesite="Strict",
    )


def session_token(request: web.Request, route: Route | None) -> str | None:
    """The request's bearer token, else (on a route taking it) its session cookie."""
    token = bearer(request)
    if token is None and route is not None and route.session_cookie:
        token = request.cookies.get(SESSION_COOKIE) or None
    return token


def principal_of(request: web.Request) -> Principal:
    """The authenticated caller of ``request`` (set by :func:`auth_middleware`)."""
    principal = request.get(_PRINCIPAL)
    if not isinstance(principal, Principal):
        raise unauthorized()
    return principal


def check_trial(principal: Principal, trial_id: int) -> None:
    """Raises 403 when a trial token reaches for another trial than its own."""
    if principal.kind == "trial" and principal.name != trial_label(trial_id):
        raise forbidden(f"this token is scoped to trial {principal.name}, not {trial_id}")


def check_holder(
    principal: Principal, allocation_id: str, run_id: int, placements: dict[str, list[str]]
) -> None:
    """Raises 403 unless an agent's credential holds slots in the allocation, or a trial's token
    was minted for the allocation's run (users and admins pass)."""
    if principal.kind == "agent" and principal.name not in placements:
        raise forbidden(f"agent {principal.name} holds no slots in allocation {allocation_id}")
    if principal.kind == "trial" and principal.run_id != run_id:
        raise forbidden(
            f"this token belongs to run {principal.run_id} of trial {principal.name}, "
            f"not to allocation {allocation_id} (run {run_id})"
        )


def check_agent(principal: Principal, agent_id: str) -> None:
    """Raises 403 when an agent's credential speaks for another agent than its own."""
    if principal.kind == "agent" and principal.name != agent_id:
        raise forbidden(f"this credential belongs to agent {principal.name}, not {agent_id}")


@web.middleware
async def auth_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Authenticates every route but the public ones and enforces each route's ``allow`` set."""
    if request.match_info.http_exception is not None:
        raise request.match_info.http_exception
    route = state_of(request).routes.get(request.match_info.handler)
    if route is None or "public" not in route.allow:
        token = session_token(request, route)
        if token is None:
            raise unauthorized("missing bearer token")
        principal = await authenticate(request, token)
        if principal is None:
            raise unauthorized("invalid or expired token")
        set_actor(
            request,
            actor_of(principal.kind, principal.name),
            intake=principal.kind in ("agent", "trial"),
        )
        allowed = route.allow if route is not None else frozenset()
        if not (principal.kind in allowed or ("admin" in allowed and principal.is_admin)):
            raise forbidden(
                f"a {principal.kind} token may not call {request.method} {request.path}"
            )
        request[_PRINCIPAL] = principal
    response: web.StreamResponse = await handler(request)
    return response
