"""The gateway's ``/metrics``, ``/healthz`` and ``/readyz``, and the HTTP latency middleware.

``/metrics`` (Prometheus's text format) answers an admin's token or the cluster's metrics token
(``--metrics-token-file``), and no one else: the cluster's gauges name its pools and agents and
how busy they are (``docs/security.md``). ``/healthz`` (the process answers) and ``/readyz``
(the database answers and the bus is connected) are public and say nothing but which check
failed. ``/api/v1/health`` stays what it was, the liveness the CLI and older checks call.

HTTP latency is labelled by method, route template (``/api/v1/trials/{trial_id}``, never the
path asked for) and status code, so its series are bounded by the route table.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Histogram
from pydantic import BaseModel

from services.api.auth import authenticate, bearer
from services.api.cluster_gauges import ClusterGauges
from services.api.errors import forbidden, unauthorized
from services.api.routing import PUBLIC, Handler, RouteTable, state_of, store_of
from services.observability import health
from services.observability.process import CONTENT_TYPE, ProcessMetrics

routes = RouteTable("observability")

HTTP_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods labelled by name; any other is ``other`` (the method is the client's text)."""
UNMATCHED = "unmatched"
"""The route label of a request no route matched (a 404 or 405)."""


class LiveResponse(BaseModel):
    """The gateway's process answers."""

    status: str


class ReadyResponse(BaseModel):
    """Whether the gateway can serve, and each check's result (``ok`` or what is wrong)."""

    ready: bool
    checks: dict[str, str]


@dataclass
class GatewayMetrics:
    """The gateway's registry and what it holds.

    Attributes:
        process: the registry with the append histograms.
        cluster: the cluster's gauges, read at each scrape.
        requests: HTTP latency by method, route template and status code.
        token: the metrics bearer token (``None``: only admins' tokens scrape).
    """

    process: ProcessMetrics
    cluster: ClusterGauges
    requests: Histogram
    token: str | None


OBSERVED = web.AppKey("cairn_observability", GatewayMetrics)


def install(app: web.Application, *, metrics_token: str | None) -> None:
    """Gives ``app`` its registry (closed with the app)."""
    process = ProcessMetrics()
    requests = Histogram(
        "cairn_http_request_seconds",
        "Seconds the gateway took to answer, by method, route template and status code",
        ["method", "route", "code"],
        buckets=HTTP_SECONDS_BUCKETS,
        registry=process.registry,
    )
    app[OBSERVED] = GatewayMetrics(
        process=process,
        cluster=ClusterGauges(process.registry),
        requests=requests,
        token=metrics_token or None,
    )

    async def close(app: web.Application) -> None:
        app[OBSERVED].process.close()

    app.on_cleanup.append(close)


def route_label(request: web.Request) -> str:
    """The template of the route that served ``request`` (:data:`UNMATCHED` if none did)."""
    if request.match_info.http_exception is not None:
        return UNMATCHED
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else UNMATCHED


@web.middleware
async def request_metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Observes each request's latency under its method, route template and status code
    (499 for a request its client gave up on, as nginx counts it)."""
    started = time.perf_counter()
    code = 500
    try:
        response = await handler(request)
        code = response.status
        return response
    except web.HTTPException as exc:
        code = exc.status
        raise
    except asyncio.CancelledError:
        code = 499
        raise
    finally:
        observed = request.app.get(OBSERVED)
        if observed is not None:
            method = request.method if request.method in METHODS else "other"
            observed.requests.labels(
                method=method, route=route_label(request), code=str(code)
            ).observe(time.perf_counter() - started)


async def check_scraper(request: web.Request) -> None:
    """Lets through the metrics token or an admin's token; 401 without a valid token, 403 for
    any other principal."""
    token = bearer(request)
    if token is None:
        raise unauthorized(
            "GET /metrics needs a bearer token: an admin's, or the metrics token "
            "(--metrics-token-file; docs/operations.md)"
        )
    expected = request.app[OBSERVED].token
    if expected is not None and hmac.compare_digest(token.encode(), expected.encode()):
        return
    principal = await authenticate(request, token)
    if principal is None:
        raise unauthorized("invalid or expired token")
    if not (principal.kind == "user" and principal.admin):
        raise forbidden(f"a {principal.kind} token that is not an admin's may not read /metrics")


@routes.get(
    "/metrics",
    allow=PUBLIC,
    audit=False,
    raw_response="text/plain",
    more_errors={"403": "the token is neither an admin's nor the metrics token"},
)
async def metrics(request: web.Request) -> web.Response:
    """The gateway's and the cluster's metrics in Prometheus's text format (an admin's token or
    the metrics token)."""
    await check_scraper(request)
    observed = request.app[OBSERVED]
    await observed.cluster.refresh(store_of(request))
    return web.Response(body=observed.process.exposition(), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/healthz", allow=PUBLIC, audit=False, response=LiveResponse)
async def healthz(request: web.Request) -> web.Response:
    """Liveness: the gateway's process answers."""
    return web.json_response({"status": "ok"})


@routes.get(
    "/readyz",
    allow=PUBLIC,
    audit=False,
    response=ReadyResponse,
    more_errors={"503": "not ready: the body's checks name what failed"},
)
async def readyz(request: web.Request) -> web.Response:
    """Readiness: the database answers and the bus (when configured) is connected; 503 naming
    the checks that failed otherwise."""
    state = state_of(request)
    checks = {"database": await health.database(state.store), "bus": health.bus(state.bus)}
    status, body = health.verdict(checks)
    request.app[OBSERVED].process.ready.set(status == 200)
    return web.json_response(body, status=status)
