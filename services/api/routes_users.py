"""Users (admin only): list them and add one."""

from __future__ import annotations

import structlog
from aiohttp import web
from pydantic import BaseModel, Field, field_validator

from services.api.auth import create_user, list_users, principal_of
from services.api.errors import conflict, parse, read_json
from services.api.routing import Access, RouteTable, store_of

log = structlog.get_logger("api")
routes = RouteTable("users")

ADMINS: frozenset[Access] = frozenset({"admin"})


class User(BaseModel):
    """A user account (never its password)."""

    username: str
    admin: bool
    created_at: str


class UsersResponse(BaseModel):
    """Every user, by name."""

    users: list[User]


class CreateUserBody(BaseModel):
    """A new account."""

    username: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,99}$")
    password: str = Field(min_length=1, max_length=1000)
    admin: bool = False

    @field_validator("password")
    @classmethod
    def _encodable(cls, value: str) -> str:
        try:
            value.encode()
        except UnicodeEncodeError:
            raise ValueError("must be valid Unicode text") from None
        return value


class CreateUserResponse(BaseModel):
    """The account created."""

    username: str
    admin: bool


@routes.get("/api/v1/users", allow=ADMINS, response=UsersResponse)
async def get_users(request: web.Request) -> web.Response:
    """Every user account, by name (admin)."""
    users = await list_users(store_of(request))
    return web.json_response({"users": users})


@routes.post("/api/v1/users", allow=ADMINS, body=CreateUserBody, response=CreateUserResponse)
async def post_user(request: web.Request) -> web.Response:
    """Adds a user account (admin; 409 when the name is taken)."""
    body = parse(CreateUserBody, await read_json(request))
    if not await create_user(store_of(request), body.username, body.password, admin=body.admin):
        raise conflict(f"user {body.username!r} already exists")
    log.info(
        "user created", username=body.username, admin=body.admin, by=principal_of(request).name
    )
    return web.json_response({"username": body.username, "admin": body.admin})
