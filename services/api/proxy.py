"""The task proxy: ``/proxy/{task_id}/{path}`` forwards HTTP and WebSocket traffic to the address
a task's agent recorded in ``TaskReady``, so users reach a notebook without reaching an agent.

Invariants a change must keep:

- The only upstream is the recorded ``address``:``port`` of a task that is ready and has not
  ended, folded from the log on every request; nothing in the request (path, query, headers)
  picks the host or port. The path is forwarded unchanged (the task serves under
  ``/proxy/<task_id>/``).
- Only the task's owner, an admin, or a user whose role grants ``update_nsc`` in the task's
  workspace passes (403 otherwise, a mere viewer included: a notebook or a shell runs code as
  its owner; 404 for an unknown task), and anyone but the owner only with a bearer token, never
  with the browser's session cookie: a task's pages are its owner's code on this origin, which
  must not run where another user's token lives. The
  caller's cairn credentials never travel on: the ``Authorization`` header and the session
  cookie are stripped, and the upstream client keeps no cookies of its own. What goes upstream
  carries instead the task server's own token (``sign_serve_token``), which only the proxy and
  the agent know: the server refuses whoever reaches its port another way.
- Bodies are streamed both ways; a request body over :data:`MAX_PROXY_BODY` is refused (413),
  and so is a WebSocket frame over :data:`MAX_WS_FRAME` (the connection is closed, code 1009).
- A task not ready yet, or whose server refuses the connection, answers 502; an ended one 410.
  A WebSocket handshake the task's server refuses with a 4xx is answered with that status.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from events.domain.aggregates import TaskView
from events.domain.authorization import Permission
from services.api.access import check_task
from services.api.auth import SESSION_COOKIE, principal_of, sign_serve_token
from services.api.errors import ApiError
from services.api.routes_tasks import load_task
from services.api.routing import USERS, RouteTable, state_of, store_of

log = structlog.get_logger("api")
routes = RouteTable("proxy")

MAX_PROXY_BODY = 256 * 1024 * 1024
"""The largest request body forwarded to a task (a notebook's upload), in bytes."""

MAX_WS_FRAME = 32 * 1024 * 1024
"""The largest WebSocket message forwarded either way, in bytes."""

CONNECT_TIMEOUT = 10.0

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "cookie",
        "content-length",
    }
)
"""Request headers not copied as they are (``cookie`` is copied without the session cookie;
``host`` is set to the caller's, as the task's server checks origins against it)."""

WS_HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions"})

CLIENT = web.AppKey("cairn_proxy_client", aiohttp.ClientSession)


class _BodyTooLarge(Exception):
    pass


def forwarded_headers(request: web.Request, task: TaskView) -> CIMultiDict[str]:
    """The headers sent upstream: the caller's, minus hop-by-hop ones and cairn's credentials,
    plus the token the task's server requires (:func:`~services.api.auth.sign_serve_token`)."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in WS_HANDSHAKE or lower == "sec-websocket-protocol":
            continue
        headers.add(name, value)
    cookies = _without_session(request.headers.getall("Cookie", []))
    if cookies:
        headers["Cookie"] = cookies
    headers["Host"] = request.host
    headers["X-Forwarded-For"] = request.remote or ""
    headers["X-Forwarded-Proto"] = request.scheme
    if task.allocation_id is not None:
        token = sign_serve_token(state_of(request).secret, task.task_id, task.allocation_id)
        headers["Authorization"] = f"token {token}"
    return headers


def _without_session(values: list[str]) -> str:
    jar: SimpleCookie = SimpleCookie()
    for value in values:
        try:
            jar.load(value)
        except Exception:
            continue
    return "; ".join(f"{k}={m.value}" for k, m in jar.items() if k != SESSION_COOKIE)


def _target(task: TaskView, request: web.Request) -> URL:
    """The recorded address with the request's path and query (never another host)."""
    assert task.address is not None and task.port is not None
    base = URL.build(scheme="http", host=task.address, port=task.port)
    return base.with_path(request.raw_path.split("?", 1)[0], encoded=True).with_query(
        request.rel_url.query
    )


async def _live_task(request: web.Request) -> TaskView:
    task_id = request.match_info["task_id"]
    store = store_of(request)
    task = await load_task(store, task_id)
    principal = principal_of(request)
    await check_task(store, principal, task, Permission.UPDATE_TASKS)
    if principal.name != task.owner and "Authorization" not in request.headers:
        # The task's pages run on this origin, where a browser keeps its cairn token: its
        # owner's code must never run in another user's (an admin's) logged-in browser.
        raise ApiError(
            403,
            f"task {task_id} is {task.owner}'s: another user reaches it through the proxy with "
            "a bearer token (the API, the CLI), never in a browser",
        )
    if task.ended:
        raise ApiError(
            410,
            f"task {task_id} has ended ({task.outcome or 'ended'}"
            + (f": {task.message}" if task.message else "")
            + "); start a new one",
        )
    if not task.ready:
        raise ApiError(
            502,
            f"task {task_id} is not ready yet (it is {task.state.lower()}); "
            f"retry once `cairn {task.kind} list` shows it ready",
        )
    return task


def _unreachable(task_id: str) -> ApiError:
    return ApiError(502, f"task {task_id} does not answer; it may be starting or stopping")


@routes.add(
    "*",
    "/proxy/{task_id}/{path:.*}",
    allow=USERS,
    hidden=True,
    audit=False,
    session_cookie=True,
    max_body=MAX_PROXY_BODY,
)
async def forward(request: web.Request) -> web.StreamResponse:
    """Forwards one request (or a WebSocket) to the task's server (its owner, an admin, or
    ``update_nsc`` in its workspace)."""
    task = await _live_task(request)
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _websocket(request, task)
    return await _http(request, task)


async def _http(request: web.Request, task: TaskView) -> web.StreamResponse:
    session = request.app[CLIENT]
    too_large = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal too_large
        seen = 0
        async for chunk in request.content.iter_any():
            seen += len(chunk)
            if seen > MAX_PROXY_BODY:
                too_large = True
                raise _BodyTooLarge
            yield chunk

    has_body = request.body_exists
    try:
        upstream = await session.request(
            request.method,
            _target(task, request),
            headers=forwarded_headers(request, task),
            data=body() if has_body else None,
            allow_redirects=False,
        )
    except (aiohttp.ClientError, _BodyTooLarge, TimeoutError) as exc:
        if too_large:
            raise ApiError(413, f"request body over {MAX_PROXY_BODY} bytes") from None
        log.info("proxy upstream failed", task_id=task.task_id, error=str(exc))
        raise _unreachable(task.task_id) from None
    async with upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in upstream.headers.items():
            if name.lower() not in HOP_BY_HOP or name.lower() == "content-length":
                response.headers.add(name, value)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("proxy upstream broke off", task_id=task.task_id, error=str(exc))
            return response
        await response.write_eof()
        return response


async def _websocket(request: web.Request, task: TaskView) -> web.StreamResponse:
    session = request.app[CLIENT]
    protocols = [
        p.strip()
        for value in request.headers.getall("Sec-WebSocket-Protocol", [])
        for p in value.split(",")
        if p.strip()
    ]
    try:
        upstream = await session.ws_connect(
            _target(task, request),
            headers=forwarded_headers(request, task),
            protocols=protocols,
            max_msg_size=MAX_WS_FRAME,
            autoping=True,
        )
    except aiohttp.WSServerHandshakeError as exc:
        if not 400 <= exc.status < 500:
            log.info("proxy websocket upstream failed", task_id=task.task_id, error=str(exc))
            raise _unreachable(task.task_id) from None
        raise ApiError(  # the task's server refused it (e.g. a cross-site Origin): say so
            exc.status, f"task {task.task_id}'s server refused the WebSocket ({exc.status})"
        ) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.info("proxy websocket upstream failed", task_id=task.task_id, error=str(exc))
        raise _unreachable(task.task_id) from None
    client = web.WebSocketResponse(
        protocols=(upstream.protocol,) if upstream.protocol else (),
        max_msg_size=MAX_WS_FRAME,
        autoping=True,
    )
    await client.prepare(request)

    async def pump(
        source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
        sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    ) -> None:
        async for message in source:
            if message.type == aiohttp.WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            else:
                break

    async with upstream:
        pumps = [
            asyncio.create_task(pump(client, upstream)),
            asyncio.create_task(pump(upstream, client)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for one in pumps:
                one.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        code = client.close_code or upstream.close_code or aiohttp.WSCloseCode.OK
        await upstream.close()
        await client.close(code=code)
    return client


async def _client(app: web.Application) -> AsyncIterator[None]:
    app[CLIENT] = aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT),
    )
    yield
    await app[CLIENT].close()


def install(app: web.Application) -> None:
    """Opens the proxy's upstream client while ``app`` serves (the route is in :data:`routes`)."""
    app.cleanup_ctx.append(_client)


__all__ = ["MAX_PROXY_BODY", "MAX_WS_FRAME", "forward", "install", "routes"]
