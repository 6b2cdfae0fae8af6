"""The gateway's half of the audit trail: every request's origin, and the facts for requests
that would otherwise leave no trace.

:func:`audit_middleware` (outermost) gives each request an id (the client's ``X-Request-ID``
when it is a short token, else a new one; echoed in the response) and binds an
:class:`events.log.origin.Origin`, so every event the request appends carries its actor, request id
and remote address. When the response is known it records:

- ``RequestRejected`` for a refused request: any 4xx of a mutating method (POST, PUT, PATCH,
  DELETE), and 401/403 of any method. It holds the method, route, path, status and the error
  message, never a body, token or password; for an input error (400, 413) only the path of the
  bad field, since the message may echo a value that was sent.
- ``RequestAccepted`` for a mutating request of a user that succeeded without appending an
  event (accounts, passwords, a logout, a change to what it already was), unless its route is
  declared ``audit=False`` (logins, heartbeats, log lines). Agents and trials report through
  idempotent intake, where a call that appends nothing is a dropped duplicate: not recorded.

Flooding rule: per caller (the actor, or ``remote:<address>`` before authentication) at most
:data:`PER_CALLER` rejections are recorded one by one per :data:`WINDOW_SECONDS`, and at most
:data:`OVERALL` across all callers; the others are counted, and the caller's next recorded
rejection carries that count in ``suppressed``. A hostile caller thus costs at most a few
appends a minute while the trail still says how many refusals there were. Counts live in the
gateway process: those pending when it stops are only logged.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web

from events.domain.types.audit import AUDIT_STREAM, RequestAccepted, RequestRejected
from events.log import origin
from events.log.envelope import NewEvent, new
from events.log.errors import EventsError
from services.api.routing import STATE

log = structlog.get_logger("api")

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
INPUT_ERRORS = frozenset({400, 413, 422})
MAX_MESSAGE = 300
MAX_PATH = 300
WINDOW_SECONDS = 60.0
PER_CALLER = 10
OVERALL = 120
MAX_CALLERS = 10_000
REQUEST_ID_HEADER = "X-Request-ID"
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$", re.ASCII)


@dataclass
class _Call:
    """What the audit middleware learns about a request while it is served (one shared object:
    a handler may serve a clone of the request, which copies the reference)."""

    origin: origin.Origin
    intake: bool = False


_CALL = web.RequestKey("cairn_call", _Call)


@dataclass
class _Window:
    start: float
    recorded: int = 0
    suppressed: int = 0


class RejectionLimiter:
    """Decides which rejections are recorded one by one (see the module's flooding rule).

    Args:
        per_caller: rejections recorded per caller per window.
        overall: rejections recorded per window across all callers.
        window: the window's length in seconds.
        clock: a monotonic clock (tests pass their own).
    """

    def __init__(
        self,
        *,
        per_caller: int = PER_CALLER,
        overall: int = OVERALL,
        window: float = WINDOW_SECONDS,
        clock: Any = time.monotonic,
    ) -> None:
        self.per_caller = per_caller
        self.overall = overall
        self.window = window
        self.clock = clock
        self._callers: OrderedDict[str, _Window] = OrderedDict()
        self._overall = _Window(start=clock())

    def admit(self, caller: str) -> int | None:
        """Counts one rejection by ``caller``.

        Returns:
            ``None`` when it is only counted; otherwise the number of the caller's rejections
            suppressed before it, to be recorded with it.
        """
        now = self.clock()
        if now - self._overall.start >= self.window:
            self._overall = _Window(start=now)
        slot = self._callers.get(caller)
        if slot is None:
            slot = _Window(start=now)
            self._callers[caller] = slot
            while len(self._callers) > MAX_CALLERS:
                dropped, old = self._callers.popitem(last=False)
                if old.suppressed:
                    log.warning("rejections not recorded", caller=dropped, count=old.suppressed)
        else:
            self._callers.move_to_end(caller)
        if now - slot.start >= self.window:
            slot.start, slot.recorded = now, 0
        if slot.recorded >= self.per_caller or self._overall.recorded >= self.overall:
            slot.suppressed += 1
            return None
        slot.recorded += 1
        self._overall.recorded += 1
        suppressed, slot.suppressed = slot.suppressed, 0
        return suppressed


LIMITER = web.AppKey("cairn_rejection_limiter", RejectionLimiter)


def actor_of(kind: str, name: str) -> str:
    """The actor name of an authenticated caller: a username, ``trial:<id>``, ``agent:<id>``
    or ``join``."""
    if kind in ("trial", "agent"):
        return f"{kind}:{name}"
    return name


def set_actor(request: web.Request, actor: str, *, intake: bool = False) -> None:
    """Names the authenticated caller of ``request`` on its origin (the auth middleware).

    ``intake``: the caller is an agent or a trial, whose calls are idempotent intake: one that
    appends nothing is a duplicate and is not recorded as ``RequestAccepted``.
    """
    call = request.get(_CALL)
    if call is not None:
        call.origin.actor = actor
        call.intake = intake


def _request_id(request: web.Request) -> str:
    given = request.headers.get(REQUEST_ID_HEADER, "").strip()
    return given if _REQUEST_ID.match(given) else str(uuid.uuid4())


def _route_of(request: web.Request) -> str:
    info = request.match_info
    if info.http_exception is not None or info.route.resource is None:
        return "<no route>"
    return info.route.resource.canonical


def _message_of(response: web.StreamResponse) -> str:
    """What the refusal said, without any value taken from the request.

    Errors about the input (400, 413, 422) echo what was sent (``got 'hunter2'``), which may be
    a secret: only the path of the offending field is kept. Other refusals (401, 403, 404, 409)
    describe the server's state and are kept, cut to :data:`MAX_MESSAGE` characters.
    """
    body = getattr(response, "body", None)
    if not isinstance(body, bytes):
        return ""
    try:
        error = json.loads(body)["error"]
        message, path = str(error["message"]), error.get("path")
    except (ValueError, KeyError, TypeError):
        return ""
    if response.status in INPUT_ERRORS:
        return f"invalid input at {str(path)[:MAX_PATH]}" if path else "invalid input"
    return message[:MAX_MESSAGE]


def _experiment_of(request: web.Request) -> int | None:
    raw = request.match_info.get("experiment_id", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


def _audited(request: web.Request) -> bool:
    state = request.app[STATE]
    route = state.routes.get(request.match_info.handler)
    return route is None or route.audit


async def _record(request: web.Request, event: NewEvent) -> None:
    try:
        async with request.app[STATE].store.transaction() as tx:
            await tx.append(AUDIT_STREAM, [event])
    except EventsError as exc:
        log.warning("audit fact not recorded", type=event.event.event_type, error=str(exc))
    except Exception:
        # The caller's answer is already decided; a failed audit write must not turn it into 500.
        log.exception("audit fact not recorded", type=event.event.event_type)


@web.middleware
async def audit_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Outermost middleware: binds the request's origin and records what the log would miss."""
    found = origin.Origin(request_id=_request_id(request), remote=request.remote)
    call = _Call(origin=found)
    request[_CALL] = call
    with origin.bound(found):
        response: web.StreamResponse = await handler(request)
        if not response.prepared:
            response.headers[REQUEST_ID_HEADER] = found.request_id or ""
        status = response.status
        method = request.method
        path = request.path[:MAX_PATH]
        actor = found.actor
        if 400 <= status < 500 and (method in MUTATING or status in (401, 403)):
            caller = actor or f"remote:{found.remote}"
            suppressed = request.app[LIMITER].admit(caller)
            if suppressed is not None:
                fact = RequestRejected(
                    method=method,
                    route=_route_of(request),
                    path=path,
                    status=status,
                    message=_message_of(response),
                    suppressed=suppressed,
                    experiment_id=_experiment_of(request),
                )
                await _record(request, new(fact, actor=actor or "anonymous"))
        elif (
            200 <= status < 300
            and method in MUTATING
            and found.appended == 0
            and not call.intake
            and _audited(request)
        ):
            fact_ok = RequestAccepted(
                method=method,
                route=_route_of(request),
                path=path,
                status=status,
                experiment_id=_experiment_of(request),
            )
            await _record(request, new(fact_ok, actor=actor or "anonymous"))
    return response
