"""JSON errors: ``{"error": {"message", "path"?}}`` for every failure, never an HTML page.

Handlers raise :class:`ApiError` (or its helpers); :func:`error_middleware` renders it, turns
request-validation problems into 400, an event over the store's size limit into 413, an
unreachable database into 503 and anything unexpected into a logged 500.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

import structlog
from aiohttp import web
from pydantic import BaseModel, ValidationError

from events.log.errors import (
    ConcurrencyError,
    DuplicateEventError,
    EventTooLargeError,
    StoreUnavailableError,
)
from events.log.storable import find_unstorable, within_depth

log = structlog.get_logger("api")
M = TypeVar("M", bound=BaseModel)

MAX_JSON_DEPTH = 100
"""Deepest nesting of lists and objects in a request body."""


class ApiError(Exception):
    """An error with an HTTP status, shown to the client as JSON.

    Attributes:
        status: HTTP status code.
        message: what went wrong, for a person.
        path: the dotted location of the offending input field, if there is one.
        details: extra fields merged into the ``error`` object (e.g. every config error).
        headers: extra response headers (``Retry-After`` of a 429).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        path: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.path = path
        self.details = details or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON document sent to the client."""
        error: dict[str, Any] = {"message": self.message}
        if self.path is not None:
            error["path"] = self.path
        error.update(self.details)
        return {"error": error}


def bad_request(message: str, path: str | None = None) -> ApiError:
    """A 400: the request is malformed or invalid."""
    return ApiError(400, message, path=path)


def unauthorized(message: str = "authentication required") -> ApiError:
    """A 401: no or an unknown token."""
    return ApiError(401, message)


def forbidden(message: str = "not allowed") -> ApiError:
    """A 403: the token is valid but may not do this."""
    return ApiError(403, message)


def not_found(message: str) -> ApiError:
    """A 404: the named thing does not exist."""
    return ApiError(404, message)


def conflict(message: str) -> ApiError:
    """A 409: the request is valid but not in the current state."""
    return ApiError(409, message)


def dotted(loc: Sequence[str | int]) -> str:
    """Renders a pydantic error location as ``items[0].metadata``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "<body>"


def from_validation(exc: ValidationError, prefix: str = "") -> ApiError:
    """Turns a pydantic error on a request body into a 400 naming the first bad field."""
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else {"loc": (), "msg": str(exc)}
    path = dotted([*([prefix] if prefix else []), *first["loc"]])
    return ApiError(
        400,
        f"{path}: {first['msg']}",
        path=path,
        details={
            "errors": [
                {"path": dotted([*([prefix] if prefix else []), *e["loc"]]), "message": e["msg"]}
                for e in errors
            ]
        },
    )


def parse(model: type[M], data: Any, prefix: str = "") -> M:
    """Validates ``data`` as ``model``; a problem raises a 400 :class:`ApiError` with its path.

    Args:
        model: the request model.
        data: the decoded JSON (or query) to validate.
        prefix: where ``data`` sits in the request, e.g. ``items[3]``, prepended to error paths.
    """
    found = find_unstorable(data)
    if found is not None:
        where, problem = found
        path = dotted([*([prefix] if prefix else []), *where])
        raise bad_request(f"{path}: {problem}", path)
    return validate(model, data, prefix)


def validate(model: type[M], data: Any, prefix: str = "") -> M:
    """:func:`parse` for a part of a body :func:`read_json` returned, which has already been
    checked for what PostgreSQL cannot store: only the model's own rules are applied.

    Args:
        model: the request model.
        data: a part of the decoded body.
        prefix: where ``data`` sits in the request, e.g. ``items[3]``, prepended to error paths.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, prefix) from None


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; an empty body reads as ``{}``.

    Raises:
        ApiError: 400 when the body is not JSON, nests deeper than :data:`MAX_JSON_DEPTH`, or
            holds text PostgreSQL cannot store (NUL, a lone surrogate); the path names where.
    """
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except RecursionError:
        raise bad_request(
            f"request body is nested more than {MAX_JSON_DEPTH} levels deep"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    # Strings of an all-ASCII body without a backslash hold no NUL (JSON refuses it raw and it
    # has no escape to come from) and no lone surrogate (neither an escape nor, in any of the
    # encodings json accepts, a byte of 0xD8 or more to encode one): only the depth is left to
    # check, which is cheap. Otherwise the full walk finds the problem and its path.
    if raw.isascii() and b"\\" not in raw and within_depth(data, MAX_JSON_DEPTH):
        return data
    found = find_unstorable(data, max_depth=MAX_JSON_DEPTH)
    if found is not None:
        where, problem = found
        path = dotted(where)
        raise bad_request(f"{path}: {problem}", path)
    return data


def error_response(error: ApiError) -> web.Response:
    """Renders an :class:`ApiError` as a JSON response."""
    return web.json_response(error.body(), status=error.status, headers=error.headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Outermost middleware: every failure leaves as JSON; unexpected ones are logged as 500."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as exc:
        return error_response(exc)
    except ValidationError as exc:
        return error_response(from_validation(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ApiError(exc.status, exc.reason))
    except StoreUnavailableError as exc:
        log.warning("store unavailable", path=request.path, error=str(exc))
        return error_response(ApiError(503, "database unavailable, retry later"))
    except EventTooLargeError as exc:
        return error_response(
            ApiError(
                413,
                f"too large to record: {exc}",
                details={"event_type": exc.event_type, "size": exc.size, "limit": exc.limit}
                | ({"part": exc.part} if exc.part else {}),
            )
        )
    except ConcurrencyError as exc:
        log.warning("write conflict", path=request.path, error=str(exc))
        return error_response(ApiError(409, "concurrent update, retry"))
    except DuplicateEventError as exc:
        return error_response(ApiError(409, f"duplicate event, not stored again: {exc}"))
    except UnicodeError:
        # Only input holds text UTF-8 cannot encode (a lone surrogate): the client's fault.
        log.warning("unencodable input", method=request.method, path=request.path, exc_info=True)
        return error_response(ApiError(400, "request holds text that is not valid Unicode"))
    except RecursionError:
        log.warning("input nested too deeply", method=request.method, path=request.path)
        return error_response(ApiError(400, "request is nested too deeply"))
    except Exception:
        log.exception("unhandled error", method=request.method, path=request.path)
        return error_response(ApiError(500, "internal server error"))
