"""Request body limits: each route reads at most its own ``max_body`` bytes (413 beyond).

The limit is the route's (:attr:`services.api.routing.Route.max_body`), else
:data:`DEFAULT_MAX_BODY`. A declared ``Content-Length`` over it is refused before any of the
body is read; a body without one is cut off by aiohttp as it is read (``client_max_size``).
Multipart parts are not covered by ``client_max_size``; handlers read them with
:func:`read_part`. What a body may record in the log is bounded separately, by the store
(:data:`events.log.limits.MAX_EVENT_BYTES`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import BodyPartReader, web

from services.api.errors import ApiError
from services.api.routing import state_of

MIB = 1024 * 1024

DEFAULT_MAX_BODY = 1 * MIB
"""Largest body of a route that names no limit of its own: twice the largest event."""

MAX_CODE_BYTES = 64 * MIB
"""Largest code tarball an experiment may carry (packed), as the CLI enforces too."""

EXPERIMENT_MAX_BODY = MAX_CODE_BYTES * 4 // 3 + 4 * MIB
"""Largest experiment creation: the code base64-encoded in JSON, plus the config."""

BATCH_MAX_BODY = 32 * MIB
"""Largest batch of trial reports or log lines."""


def too_large(request: web.Request, limit: int, what: str = "request body") -> ApiError:
    """The 413 for a body (or part of one) over ``limit`` bytes."""
    return ApiError(
        413,
        f"{what} of {request.method} {request.path} is over its limit of {limit} bytes",
        details={"limit": limit},
    )


def limit_of(request: web.Request) -> int:
    """The body limit of the route serving ``request``."""
    route = state_of(request).routes.get(request.match_info.handler)
    if route is None or route.max_body is None:
        return DEFAULT_MAX_BODY
    return route.max_body


@web.middleware
async def body_limit_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refuses a declared body over the route's limit at once and caps what is read."""
    limit = limit_of(request)
    length = request.content_length
    if length is not None and length > limit:
        raise too_large(request, limit)
    try:
        response: web.StreamResponse = await handler(request.clone(client_max_size=limit))
    except web.HTTPRequestEntityTooLarge:
        raise too_large(request, limit) from None
    return response


async def read_part(
    request: web.Request, part: BodyPartReader, limit: int, what: str = "part"
) -> bytes:
    """Reads one multipart part, decoded, refusing it with a 413 once it passes ``limit``."""
    data = bytearray()
    while chunk := await part.read_chunk():
        data.extend(chunk)
        if len(data) > limit:
            raise too_large(request, limit, what)
    return bytes(part.decode(data))
