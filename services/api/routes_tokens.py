"""User tokens: list them and revoke one (see :mod:`services.api.tokens`).

A user lists and revokes their own tokens; an admin anyone's (``?all=true`` lists every
user's, ``?username=`` one user's).
"""

from __future__ import annotations

import structlog
from aiohttp import web
from pydantic import BaseModel, Field

from services.api import tokens
from services.api.auth import bearer, principal_of
from services.api.errors import forbidden, not_found, parse
from services.api.routing import USERS, RouteTable, store_of

log = structlog.get_logger("api")
routes = RouteTable("tokens")

MAX_TOKEN_ID = 2**62


class Token(BaseModel):
    """A user token (never the token itself)."""

    id: int
    username: str
    created_at: str
    expires_at: str | None
    current: bool = Field(description="whether it is the token this request was made with")


class TokensQuery(BaseModel):
    """Whose tokens: the caller's by default; an admin may name a user or ask for all."""

    model_config = {"extra": "forbid"}

    username: str | None = Field(None, max_length=100)
    all: bool = False


class TokensResponse(BaseModel):
    """The valid tokens, newest first."""

    tokens: list[Token]


class RevokeTokenResponse(BaseModel):
    """The token revoked."""

    id: int
    username: str


def _token_id(request: web.Request) -> int:
    raw = request.match_info["token_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_TOKEN_ID:
        raise not_found(f"no token {raw!r}")
    return int(raw)


@routes.get("/api/v1/tokens", allow=USERS, query=TokensQuery, response=TokensResponse)
async def list_tokens(request: web.Request) -> web.Response:
    """The caller's valid tokens (an admin: ``username``'s, or everyone's with ``all``)."""
    principal = principal_of(request)
    query = parse(TokensQuery, dict(request.query))
    username: str | None = query.username or principal.name
    if query.all:
        username = None
    if username != principal.name and not principal.is_admin:
        raise forbidden("a user lists only their own tokens (admins: anyone's)")
    found = await tokens.list_tokens(store_of(request), username=username, current=bearer(request))
    return web.json_response({"tokens": found})


@routes.add("DELETE", "/api/v1/tokens/{token_id}", allow=USERS, response=RevokeTokenResponse)
async def revoke_token(request: web.Request) -> web.Response:
    """Revokes a token at once (its owner or an admin; 404 for an unknown or expired one)."""
    principal = principal_of(request)
    token_id = _token_id(request)
    store = store_of(request)
    owner = await tokens.owner_of(store, token_id)
    if owner is None:
        raise not_found(f"no token {token_id}")
    if owner != principal.name and not principal.is_admin:
        raise forbidden("a user revokes only their own tokens (admins: anyone's)")
    if not await tokens.revoke(store, token_id):
        raise not_found(f"no token {token_id}")
    log.info("token revoked", token_id=token_id, username=owner, by=principal.name)
    return web.json_response({"id": token_id, "username": owner})
