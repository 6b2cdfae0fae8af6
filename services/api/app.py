"""The aiohttp application: middlewares, the route tables, and startup (tables, admin, tokens)."""

from __future__ import annotations

import functools
from pathlib import Path

from aiohttp import web

from events.domain.config.cluster import ClusterConfig
from events.domain.config.storage import default_checkpoint_root
from events.log.bus import Bus
from events.log.bus_auth import Authority
from events.log.store import EventStore
from services.api import (
    openapi,
    proxy,
    routes_agents,
    routes_allocations,
    routes_audit,
    routes_auth,
    routes_checkpoints,
    routes_cluster,
    routes_events,
    routes_experiment_actions,
    routes_experiment_settings,
    routes_experiment_submit,
    routes_experiments,
    routes_master,
    routes_models,
    routes_observability,
    routes_pool_bindings,
    routes_rbac,
    routes_rendezvous,
    routes_searcher,
    routes_series,
    routes_tasks,
    routes_templates,
    routes_tensorboards,
    routes_tokens,
    routes_trial_control,
    routes_trials,
    routes_unmanaged,
    routes_usage,
    routes_users,
    routes_webhooks,
    routes_webui,
    routes_workspaces,
    tables,
    tokens,
)
from services.api.audit_trail import LIMITER, RejectionLimiter, audit_middleware
from services.api.auth import auth_middleware, ensure_admin, join_token
from services.api.errors import error_middleware
from services.api.limits import DEFAULT_MAX_BODY, body_limit_middleware
from services.api.routing import STATE, ApiState, Route, RouteTable
from services.api.throttle import THROTTLER, LoginThrottler

ROUTE_TABLES: tuple[RouteTable, ...] = (
    routes_auth.routes,
    routes_experiments.routes,
    routes_experiment_submit.routes,
    routes_experiment_actions.routes,
    routes_experiment_settings.routes,
    routes_templates.routes,
    routes_workspaces.routes,
    routes_rbac.routes,
    routes_webhooks.routes,
    routes_models.routes,
    routes_pool_bindings.routes,
    routes_master.routes,
    routes_agents.routes,
    routes_allocations.routes,
    routes_rendezvous.routes,
    routes_trials.routes,
    routes_trial_control.routes,
    routes_searcher.routes,
    routes_checkpoints.routes,
    routes_users.routes,
    routes_tokens.routes,
    routes_events.routes,
    openapi.routes,
    routes_series.routes,
    routes_cluster.routes,
    routes_audit.routes,
    routes_usage.routes,
    routes_unmanaged.routes,
    routes_tasks.routes,
    routes_tensorboards.routes,
    routes_observability.routes,
)


def all_routes() -> list[Route]:
    """Every API route the gateway serves (the web UI's file routes aside)."""
    return [route for table in ROUTE_TABLES for route in table.routes]


def create_app(
    store: EventStore,
    bus: Bus | None,
    *,
    secret: bytes,
    checkpoint_root: Path | None = None,
    join_token_file: str | None = None,
    nats_authority: Authority | None = None,
    cluster: ClusterConfig | None = None,
    admin_password: str | None = None,
    metrics_token: str | None = None,
) -> web.Application:
    """Builds the gateway application.

    On startup it applies the ``api`` migrations, gives tokens issued without an expiry the
    cluster's token lifetime, creates the initial admin user and loads the join token.

    Args:
        store: the event store (its pool also serves the gateway's own tables).
        bus: the NATS bus, or ``None``; nothing served today requires it.
        secret: the cluster secret signing trial tokens (:func:`services.api.auth.cluster_secret`).
        checkpoint_root: the default checkpoint root for experiments without
            ``checkpoint_storage`` (checkpoint downloads); ``None``: ``CAIRN_CHECKPOINT_ROOT``,
            else ``$CAIRN_HOME/checkpoints``, else ``~/.cairn/checkpoints``.
        join_token_file: the file holding the cluster's join token (see
            :func:`services.api.auth.join_token`).
        nats_authority: the bus's signing authority, to give joining agents NATS users.
        cluster: the cluster config (``None``: every default).
        admin_password: the initial admin's password (see
            :func:`services.api.auth.ensure_admin`); without one no admin is created.
        metrics_token: the bearer token a scraper may present for ``/metrics`` besides an
            admin's (:mod:`services.api.routes_observability`).

    Returns:
        The application, ready for an ``AppRunner``.
    """
    app = web.Application(
        middlewares=[
            routes_observability.request_metrics_middleware,
            audit_middleware,
            error_middleware,
            auth_middleware,
            body_limit_middleware,
        ],
        client_max_size=DEFAULT_MAX_BODY,
    )
    state = ApiState(
        store=store,
        bus=bus,
        secret=secret,
        join_token_file=join_token_file,
        nats_authority=nats_authority,
        cluster=cluster or ClusterConfig(),
    )
    app[STATE] = state
    app[LIMITER] = RejectionLimiter()
    app[THROTTLER] = LoginThrottler(state.cluster.accounts.login_throttle)
    app[routes_checkpoints.CHECKPOINT_ROOT] = default_checkpoint_root(checkpoint_root)
    routes_master.mark_started(app)
    for route in [*all_routes(), *routes_webui.routes.routes, *proxy.routes.routes]:
        app.router.add_route(route.method, route.path, route.handler)
        state.routes[route.handler] = route
    app.on_startup.append(functools.partial(_startup, admin_password=admin_password))
    routes_unmanaged.install(app)
    routes_observability.install(app, metrics_token=metrics_token)
    proxy.install(app)
    return app


async def _startup(app: web.Application, *, admin_password: str | None) -> None:
    state = app[STATE]
    await tables.migrate(state.store)
    await tokens.bound_lifetimes(state.store, state.cluster.accounts.token_lifetime)
    await ensure_admin(state.store, admin_password)
    state.join_token = await join_token(state.store, state.join_token_file)
