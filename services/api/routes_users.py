"""Users: list them and add one (admin), activate and deactivate them (admin), change a
password (the user themself, or an admin), link one to a unix account that their code runs as
(admin; Determined's ``agent_user_group``)."""

from __future__ import annotations

from typing import Any

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from events.domain.deciders.identity import LinkAgentUser, decide_link
from events.domain.identities import ASSIGNED_UIDS, CLUSTER_UID, IDENTITIES_STREAM
from events.log.store import Transaction
from services.api import auth
from services.api.auth import create_user, list_users, principal_of
from services.api.decided import append_accepted
from services.api.errors import bad_request, conflict, forbidden, not_found, parse, read_json
from services.api.identities import load_identities
from services.api.inbox import in_transaction
from services.api.routing import USERS, Access, RouteTable, cluster_of, store_of

log = structlog.get_logger("api")
routes = RouteTable("users")

ADMINS: frozenset[Access] = frozenset({"admin"})


class User(BaseModel):
    """A user account (never its password)."""

    username: str
    admin: bool
    active: bool = True
    created_at: str


class UsersResponse(BaseModel):
    """Every user, by name."""

    users: list[User]


def _encodable(value: str) -> str:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return value


class CreateUserBody(BaseModel):
    """A new account."""

    username: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")
    password: str = Field(min_length=1, max_length=1000)
    admin: bool = False

    _password = field_validator("password")(_encodable)


class PasswordBody(BaseModel):
    """A new password; a user changing their own (not an admin) gives the current one too."""

    model_config = {"extra": "forbid"}

    password: str = Field(min_length=1, max_length=1000)
    old_password: str | None = Field(None, max_length=1000)

    @field_validator("password", "old_password")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        return value if value is None else _encodable(value)


class PasswordResponse(BaseModel):
    """Whose password changed (their other tokens are revoked)."""

    username: str


class ActiveResponse(BaseModel):
    """Whether the user is active now, and whether this call changed it."""

    username: str
    active: bool
    changed: bool


class CreateUserResponse(BaseModel):
    """The account created."""

    username: str
    admin: bool


def _check_length(request: web.Request, password: str) -> None:
    """A 400 naming ``password`` when it is shorter than the cluster's minimum."""
    least = cluster_of(request).accounts.min_password_length
    if len(password) < least:
        raise bad_request(
            f"password: must be at least {least} characters, got {len(password)}",
            path="password",
        )


@routes.get("/api/v1/users", allow=ADMINS, response=UsersResponse)
async def get_users(request: web.Request) -> web.Response:
    """Every user account, by name (admin)."""
    users = await list_users(store_of(request))
    return web.json_response({"users": users})


@routes.post("/api/v1/users", allow=ADMINS, body=CreateUserBody, response=CreateUserResponse)
async def post_user(request: web.Request) -> web.Response:
    """Adds a user account (admin; 400 for a password shorter than the cluster's minimum, 409
    when the name is taken)."""
    body = parse(CreateUserBody, await read_json(request))
    _check_length(request, body.password)
    if not await create_user(store_of(request), body.username, body.password, admin=body.admin):
        raise conflict(f"user {body.username!r} already exists")
    log.info(
        "user created", username=body.username, admin=body.admin, by=principal_of(request).name
    )
    return web.json_response({"username": body.username, "admin": body.admin})


@routes.post(
    "/api/v1/users/{username}/password",
    allow=USERS,
    body=PasswordBody,
    response=PasswordResponse,
)
async def post_password(request: web.Request) -> web.Response:
    """Changes a password: a user their own (giving the current one), an admin anyone's; every
    other token of the user is revoked; 400 for one shorter than the cluster's minimum."""
    principal = principal_of(request)
    username = request.match_info["username"]
    body = parse(PasswordBody, await read_json(request))
    store = store_of(request)
    own = principal.name == username
    if not (own or principal.is_admin):
        raise forbidden("a user may change only their own password (admins: anyone's)")
    if own and not principal.is_admin:
        if body.old_password is None:
            raise bad_request("old_password: the current password is required", path="old_password")
        if not await auth.check_password(store, username, body.old_password):
            raise forbidden("old_password: that is not the current password")
    _check_length(request, body.password)
    keep = auth.bearer(request) if own else None
    if not await auth.change_password(store, username, body.password, keep_token=keep):
        raise not_found(f"no user {username!r}")
    log.info("password changed", username=username, by=principal.name)
    return web.json_response({"username": username})


def _activation(active: bool) -> Any:
    verb = "activate" if active else "deactivate"

    async def handler(request: web.Request) -> web.Response:
        principal = principal_of(request)
        username = request.match_info["username"]
        parse(EmptyBody, await read_json(request))
        if not active and username == principal.name:
            raise conflict("an admin cannot deactivate themself")
        before = await auth.set_active(store_of(request), username, active)
        if before is None:
            raise not_found(f"no user {username!r}")
        if before != active:
            log.info(f"user {verb}d", username=username, by=principal.name)
        return web.json_response(
            {"username": username, "active": active, "changed": before != active}
        )

    handler.__name__ = f"{verb}_user"
    handler.__doc__ = (
        f"{verb.capitalize()}s a user (admin); a deactivated user can neither log in nor use "
        "a token issued before."
    )
    return handler


class EmptyBody(BaseModel):
    """No fields."""

    model_config = {"extra": "forbid"}


for _active in (True, False):
    routes.post(
        f"/api/v1/users/{{username}}/{'activate' if _active else 'deactivate'}",
        allow=ADMINS,
        body=EmptyBody,
        response=ActiveResponse,
    )(_activation(_active))


UNIX_NAME = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"
"""What an account or group name of the machines looks like (as ``useradd`` takes it)."""


def _unix_id(value: int) -> int:
    if value == 0:
        raise ValueError("user code never runs as root: 0 is refused")
    if value == CLUSTER_UID or value in ASSIGNED_UIDS:
        raise ValueError(
            f"{value} is in the range cairn assigns itself "
            f"({CLUSTER_UID}-{ASSIGNED_UIDS.stop - 1}); link to an account outside it"
        )
    return value


class AgentUserGroupBody(BaseModel):
    """The unix account a user's code runs as (``agent_user``/``agent_group``: its names)."""

    model_config = {"extra": "forbid"}

    agent_uid: int = Field(ge=0, le=2**32 - 2)
    agent_gid: int = Field(ge=0, le=2**32 - 2)
    agent_user: str = Field("", pattern=UNIX_NAME + "|^$")
    agent_group: str = Field("", pattern=UNIX_NAME + "|^$")

    _ids = field_validator("agent_uid", "agent_gid")(_unix_id)


class AgentUserGroup(BaseModel):
    """The unix identity a user's code runs as; ``linked`` when an admin chose it (else the
    cluster assigned it), all null when no code of theirs has run yet."""

    username: str
    agent_uid: int | None
    agent_gid: int | None
    agent_user: str | None
    agent_group: str | None
    linked: bool


@routes.add(
    "PUT",
    "/api/v1/users/{username}/agent-user-group",
    allow=ADMINS,
    body=AgentUserGroupBody,
    response=AgentUserGroup,
)
async def put_agent_user_group(request: web.Request) -> web.Response:
    """Links a user to a unix account that their trials run as from their next run on (admin;
    uid and gid 0 and cairn's own range are refused)."""
    principal = principal_of(request)
    username = request.match_info["username"]
    body = parse(AgentUserGroupBody, await read_json(request))
    store = store_of(request)
    if not await auth.user_exists(store, username):
        raise not_found(f"no user {username!r}")
    command = LinkAgentUser(
        username=username,
        agent_uid=body.agent_uid,
        agent_gid=body.agent_gid,
        agent_user=body.agent_user,
        agent_group=body.agent_group,
        actor=principal.name,
    )

    async def work(tx: Transaction) -> None:
        state = await load_identities(tx)
        await append_accepted(
            tx, IDENTITIES_STREAM, decide_link(state, command), expected_version=state.version
        )

    await in_transaction(store, work)
    log.info(
        "user linked to a unix account",
        username=username,
        agent_uid=body.agent_uid,
        agent_gid=body.agent_gid,
        by=principal.name,
    )
    return web.json_response(
        {
            "username": username,
            "agent_uid": body.agent_uid,
            "agent_gid": body.agent_gid,
            "agent_user": body.agent_user or username,
            "agent_group": body.agent_group,
            "linked": True,
        }
    )


@routes.get("/api/v1/users/{username}/agent-user-group", allow=USERS, response=AgentUserGroup)
async def get_agent_user_group(request: web.Request) -> web.Response:
    """The unix identity a user's code runs as (the user themself, or an admin)."""
    principal = principal_of(request)
    username = request.match_info["username"]
    if principal.name != username and not principal.is_admin:
        raise forbidden("a user may read only their own agent user group (admins: anyone's)")
    store = store_of(request)
    if not await auth.user_exists(store, username):
        raise not_found(f"no user {username!r}")
    found = (await load_identities(store)).of(username)
    if found is None:
        return web.json_response(
            {
                "username": username,
                "agent_uid": None,
                "agent_gid": None,
                "agent_user": None,
                "agent_group": None,
                "linked": False,
            }
        )
    return web.json_response({"username": username, **found.to_json()})
