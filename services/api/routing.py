"""Route declarations shared by the app, the auth middleware and the OpenAPI document.

Each ``routes_*`` module owns a :class:`RouteTable`; a route names who may call it and the
pydantic models of its body, query and response, so adding an endpoint adds its documentation
and its access rule in one place.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from events.domain.config.cluster import ClusterConfig
from events.log.bus import Bus
from events.log.bus_auth import Authority
from events.log.store import EventStore

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Access = Literal["public", "user", "admin", "agent", "trial", "join"]

PUBLIC: frozenset[Access] = frozenset({"public"})
USERS: frozenset[Access] = frozenset({"user"})
AGENTS: frozenset[Access] = frozenset({"agent", "admin"})
TRIAL_OR_AGENT: frozenset[Access] = frozenset({"trial", "agent", "admin"})
ANYONE: frozenset[Access] = frozenset({"user", "agent", "trial"})
JOINERS: frozenset[Access] = frozenset({"join", "admin"})


@dataclass(frozen=True)
class Route:
    """One endpoint.

    Attributes:
        method: HTTP method.
        path: aiohttp path pattern, e.g. ``/api/v1/trials/{trial_id}/reports``.
        handler: the coroutine serving it.
        summary: one line for the OpenAPI document.
        allow: who may call it: ``public`` (no token), ``user`` (any logged-in user), ``admin``
            (admin users), ``agent`` (an agent's own credential; the handler checks that it
            speaks for that agent), ``trial`` (a trial-scoped token; the handler checks that it
            is the right trial), ``join`` (the cluster's join token).
        tag: OpenAPI tag (the routes module's subject).
        body: JSON body model.
        query: query-string model.
        response: 200 response model.
        multipart: whether the body may also be ``multipart/form-data``.
        raw_response: media type of a non-JSON response (e.g. ``application/gzip``).
        max_body: the largest request body it reads, in bytes (``None``:
            :data:`services.api.limits.DEFAULT_MAX_BODY`).
        hidden: left out of the OpenAPI document (the web UI's files).
        audit: whether a successful call that appends no event is recorded as
            ``RequestAccepted`` (``False`` for telemetry: heartbeats, log lines).
        more_errors: statuses it may answer besides the common ones, with what they mean
            (``{"429": ...}`` for a throttled route), for the OpenAPI document.
        session_cookie: whether the session cookie authenticates it when no bearer token does
            (the task proxy, which a browser reaches without a script to add the header).
    """

    method: str
    path: str
    handler: Handler
    summary: str
    allow: frozenset[Access]
    tag: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    multipart: bool = False
    raw_response: str | None = None
    max_body: int | None = None
    hidden: bool = False
    audit: bool = True
    more_errors: dict[str, str] | None = None
    session_cookie: bool = False


@dataclass
class RouteTable:
    """The routes of one module, declared with :meth:`get` / :meth:`post` decorators."""

    tag: str
    routes: list[Route] = field(default_factory=list)

    def add(self, method: str, path: str, **options: Any) -> Callable[[Handler], Handler]:
        """Declares ``handler`` as serving ``method path`` with the given :class:`Route` options."""

        def wrap(handler: Handler) -> Handler:
            doc = (handler.__doc__ or "").strip().split("\n\n")[0]
            summary = options.pop("summary", None) or " ".join(doc.split())
            self.routes.append(
                Route(
                    method=method,
                    path=path,
                    handler=handler,
                    summary=summary,
                    tag=self.tag,
                    **options,
                )
            )
            return handler

        return wrap

    def get(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        """Declares a GET route."""
        return self.add("GET", path, **options)

    def post(self, path: str, **options: Any) -> Callable[[Handler], Handler]:
        """Declares a POST route."""
        return self.add("POST", path, **options)


@dataclass
class ApiState:
    """What handlers share: connections, the cluster secret and the route table.

    Attributes:
        store: the event store (and its pool, for the gateway's own tables).
        bus: the NATS bus, or ``None`` when running without one.
        secret: the cluster secret that signs trial tokens.
        routes: every route by handler, for the auth middleware.
        join_token: the token agents present once to join; loaded when the app starts.
        join_token_file: where the join token is kept (``None``: see
            :func:`services.api.auth.join_token`).
        nats_authority: the bus's signing authority, to issue agents their NATS users
            (``None``: the bus takes no credentials and agents get none).
        cluster: the cluster config (:mod:`events.domain.config.cluster`).
    """

    store: EventStore
    bus: Bus | None
    secret: bytes
    routes: dict[Handler, Route] = field(default_factory=dict)
    join_token: str = ""
    join_token_file: str | None = None
    nats_authority: Authority | None = None
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


STATE = web.AppKey("cairn_api", ApiState)


def state_of(request: web.Request) -> ApiState:
    """The shared state of the app serving ``request``."""
    return request.app[STATE]


def store_of(request: web.Request) -> EventStore:
    """The event store of the app serving ``request``."""
    return request.app[STATE].store


def cluster_of(request: web.Request) -> ClusterConfig:
    """The cluster config of the app serving ``request``."""
    return request.app[STATE].cluster
