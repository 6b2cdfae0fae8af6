"""Health, login/logout and ``me``."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, Field

from services.api import auth
from services.api.audit_trail import set_actor
from services.api.errors import parse, read_json, unauthorized
from services.api.routing import ANYONE, PUBLIC, RouteTable, store_of

routes = RouteTable("auth")


class LoginBody(BaseModel):
    """Credentials of a user."""

    username: str = Field(min_length=1)
    password: str


class LoginResponse(BaseModel):
    """A new bearer token and who it belongs to."""

    token: str
    user: dict[str, object]


class HealthResponse(BaseModel):
    """The gateway is up."""

    status: str


@routes.get("/api/v1/health", allow=PUBLIC, response=HealthResponse)
async def health(request: web.Request) -> web.Response:
    """Liveness: the gateway answers."""
    return web.json_response({"status": "ok"})


# A login issues a session token (kept in ``api_tokens``), it changes nothing in the cluster's
# work: only refused logins go in the audit trail (as RequestRejected).
@routes.post(
    "/api/v1/auth/login", allow=PUBLIC, body=LoginBody, response=LoginResponse, audit=False
)
async def login(request: web.Request) -> web.Response:
    """Exchanges a username and password for a bearer token."""
    body = parse(LoginBody, await read_json(request))
    issued = await auth.login(store_of(request), body.username, body.password)
    if issued is None:
        raise unauthorized("wrong username or password")
    token, admin = issued
    set_actor(request, body.username)
    return web.json_response({"token": token, "user": {"username": body.username, "admin": admin}})


@routes.post("/api/v1/auth/logout", allow=ANYONE)
async def logout(request: web.Request) -> web.Response:
    """Revokes the calling user token (other tokens are unaffected)."""
    token = auth.bearer(request)
    if token is not None and auth.principal_of(request).kind == "user":
        await auth.logout(store_of(request), token)
    return web.json_response({})


@routes.get("/api/v1/me", allow=ANYONE)
async def me(request: web.Request) -> web.Response:
    """Who the bearer token belongs to."""
    return web.json_response(auth.principal_of(request).describe())
