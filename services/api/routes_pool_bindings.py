"""Resource pools bound to workspaces: which workspaces a pool serves (admins).

An unbound pool serves every workspace; a bound one only its workspaces: an experiment of
another workspace naming it is refused at submission (400 naming ``resources.resource_pool``)
and cannot move into a workspace its pool does not serve (409). Work already admitted is left
alone when bindings change. The default pool serves everyone and cannot be bound. Bindings are
facts on stream ``teams`` (``PoolBindingsSet``), so the audit trail shows each change.
"""

from __future__ import annotations

from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, Field

from events.domain.aggregates.teams import Teams
from events.domain.authorization import Permission
from events.domain.deciders import Decision
from events.domain.deciders.teams import BindPool, decide_bindings
from events.domain.types.teams import MAX_NAME
from services.api.auth import Principal
from services.api.errors import bad_request, parse, read_json
from services.api.routing import USERS, RouteTable, store_of
from services.api.teams import authorize, current_teams, decide_teams, workspace_by_ref

routes = RouteTable("pools")

MAX_BINDINGS = 1000
"""The most workspaces one request names."""


class BindingsBody(BaseModel):
    """Workspaces, by name or id."""

    model_config = {"extra": "forbid"}

    workspace_names: list[Annotated[str, Field(max_length=MAX_NAME * 4)]] = Field(
        default_factory=list, max_length=MAX_BINDINGS
    )


class BindingsResponse(BaseModel):
    """The workspaces a pool serves (``bound`` false: every workspace)."""

    pool: str
    bound: bool
    workspaces: list[str]


MAX_POOL_NAME = 200
"""The longest pool name a path may give."""


def pool_of(request: web.Request) -> str:
    """The pool the path names; a 400 for one no config could name (empty, too long, control
    characters, not encodable text)."""
    pool = request.match_info["pool"]
    try:
        pool.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("pool: not a valid name", path="pool") from None
    if not pool or len(pool) > MAX_POOL_NAME or not pool.isprintable():
        raise bad_request(
            f"pool: a pool name is 1 to {MAX_POOL_NAME} printable characters", path="pool"
        )
    return pool


def _answer(teams: Teams, pool: str) -> dict[str, Any]:
    bound = sorted(teams.pool_bindings.get(pool, ()))
    names = [teams.workspaces[w].name for w in bound if w in teams.workspaces]
    return {"pool": pool, "bound": bool(bound), "workspaces": names}


@routes.get(
    "/api/v1/resource-pools/{pool}/workspace-bindings", allow=USERS, response=BindingsResponse
)
async def list_bindings(request: web.Request) -> web.Response:
    """The workspaces a pool serves."""
    teams = await current_teams(store_of(request))
    return web.json_response(_answer(teams, pool_of(request)))


async def _change(request: web.Request, mode: str) -> web.Response:
    pool = pool_of(request)
    body = parse(BindingsBody, await read_json(request))

    def act(teams: Teams, principal: Principal) -> Decision:
        authorize(teams, principal, Permission.BIND_POOLS, what=f"binding pool {pool!r}")
        ids = tuple(workspace_by_ref(teams, name).workspace_id for name in body.workspace_names)
        command = (
            BindPool(pool, replace=ids)
            if mode == "replace"
            else BindPool(pool, add=ids)
            if mode == "add"
            else BindPool(pool, remove=ids)
        )
        return decide_bindings(teams, command)

    await decide_teams(request, act)
    return web.json_response(_answer(await current_teams(store_of(request)), pool))


@routes.post(
    "/api/v1/resource-pools/{pool}/workspace-bindings",
    allow=USERS,
    body=BindingsBody,
    response=BindingsResponse,
)
async def add_bindings(request: web.Request) -> web.Response:
    """Binds a pool to more workspaces (admins)."""
    return await _change(request, "add")


@routes.add(
    "PUT",
    "/api/v1/resource-pools/{pool}/workspace-bindings",
    allow=USERS,
    body=BindingsBody,
    response=BindingsResponse,
)
async def replace_bindings(request: web.Request) -> web.Response:
    """Makes a pool serve exactly these workspaces (none: every one; admins)."""
    return await _change(request, "replace")


@routes.add(
    "DELETE",
    "/api/v1/resource-pools/{pool}/workspace-bindings",
    allow=USERS,
    body=BindingsBody,
    response=BindingsResponse,
)
async def remove_bindings(request: web.Request) -> web.Response:
    """Unbinds a pool from some workspaces (admins; unbound from all, it serves every one)."""
    return await _change(request, "remove")
