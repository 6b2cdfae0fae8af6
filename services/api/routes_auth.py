"""Health, login/logout and ``me``.

A login's token expires after the cluster config's ``accounts.token_lifetime``; failed logins
are throttled per username and per client address (:mod:`services.api.throttle`).
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, Field

from services.api import auth
from services.api.audit_trail import set_actor
from services.api.errors import ApiError, parse, read_json, unauthorized
from services.api.routing import ANYONE, PUBLIC, RouteTable, cluster_of, store_of
from services.api.throttle import THROTTLER

routes = RouteTable("auth")


class LoginBody(BaseModel):
    """Credentials of a user."""

    username: str = Field(min_length=1)
    password: str


class LoginResponse(BaseModel):
    """A new bearer token, who it belongs to and when it expires."""

    token: str
    user: dict[str, object]
    expires_at: str


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
    "/api/v1/auth/login",
    allow=PUBLIC,
    body=LoginBody,
    response=LoginResponse,
    audit=False,
    more_errors={"429": "too many failed logins for the username or from the address"},
)
async def login(request: web.Request) -> web.Response:
    """Exchanges a username and password for a bearer token; 429 with ``Retry-After`` after
    too many failures for the username or from the client's address."""
    body = parse(LoginBody, await read_json(request))
    throttler = request.app[THROTTLER]
    address = request.remote or ""
    wait = throttler.retry_after(body.username, address)
    if wait:
        raise ApiError(
            429,
            f"too many failed logins for this user or from this address; retry in {wait} s",
            headers={"Retry-After": str(wait)},
        )
    accounts = cluster_of(request).accounts
    issued = await auth.login(
        store_of(request), body.username, body.password, lifetime=accounts.token_lifetime
    )
    if issued is None:
        throttler.failed(body.username, address)
        raise unauthorized("wrong username or password")
    throttler.succeeded(body.username, address)
    token, admin, expires_at = issued
    set_actor(request, body.username)
    response = web.json_response(
        {
            "token": token,
            "user": {"username": body.username, "admin": admin},
            "expires_at": expires_at.isoformat(),
        }
    )
    auth.set_session_cookie(response, token, max_age=accounts.token_lifetime)
    return response


@routes.post("/api/v1/auth/logout", allow=ANYONE)
async def logout(request: web.Request) -> web.Response:
    """Revokes the calling user token (other tokens are unaffected)."""
    token = auth.bearer(request)
    if token is not None and auth.principal_of(request).kind == "user":
        await auth.logout(store_of(request), token)
    response = web.json_response({})
    response.del_cookie(auth.SESSION_COOKIE, path=auth.SESSION_COOKIE_PATH)
    return response


@routes.get("/api/v1/me", allow=ANYONE)
async def me(request: web.Request) -> web.Response:
    """Who the bearer token belongs to."""
    return web.json_response(auth.principal_of(request).describe())
