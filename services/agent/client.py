"""The agent's HTTP client for the API gateway (``/api/v1``, see ``docs/protocol.md``).

Every call retries connection errors, timeouts, 5xx, 408 and 429 with capped exponential
backoff and jitter; other 4xx answers raise :class:`ApiError` at once. POST bodies carry an
``idempotency_key`` chosen by the caller and reused across retries, so a request that reached
the server before its answer was lost is a no-op the second time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import structlog
from pydantic import BaseModel, ValidationError

from services.contracts.agent import (
    ExitedBody,
    HeartbeatBody,
    HeartbeatResponse,
    IdleBody,
    JoinResponse,
    LeavingBody,
    LogsBody,
    PendingPreemptionBody,
    PreemptionResponse,
    ReadyBody,
    RegisterBody,
    RendezvousJoinBody,
    RendezvousResponse,
    StartedBody,
)

log = structlog.get_logger("agent")

RETRYABLE_STATUS = frozenset({408, 425, 429})

_Answer = TypeVar("_Answer", bound=BaseModel)
_T = TypeVar("_T")


class ApiError(Exception):
    """The API answered with a status that retrying will not fix (or retries ran out)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message[:300]}")
        self.status = status
        self.message = message


def _seg(value: str) -> str:
    return quote(str(value), safe="")


def _body(model: type[BaseModel], **fields: Any) -> dict[str, Any]:
    """The JSON body of a request: ``fields`` checked against the gateway's ``model``, and only
    the fields given sent (what the gateway would refuse is refused here, as its 422 would be).

    Raises:
        ApiError: a field the gateway would refuse (status 422).
    """
    try:
        return model.model_validate(fields).model_dump(mode="json", exclude_unset=True)
    except ValidationError as exc:
        raise ApiError(422, f"not a valid {model.__name__}: {exc}") from None


def _answer(model: type[_Answer], answer: Any, what: str) -> _Answer:
    """``answer`` parsed as the gateway's ``model``.

    Raises:
        ApiError: the answer does not parse (status 200: the gateway answered, wrongly).
    """
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        raise ApiError(200, f"malformed {what} answer: {exc}") from None


def backoff(attempt: int, *, base: float = 0.2, cap: float = 5.0) -> float:
    """The delay before retry number ``attempt`` (0-based): exponential, capped, jittered."""
    delay: float = min(cap, base * 2**attempt)
    return delay * (0.5 + random.random() / 2)


def _retryable(error: ApiError) -> ApiError:
    """``error``, a failed answer, when it is worth another try (a 5xx or a RETRYABLE_STATUS).

    Raises:
        ApiError: ``error`` itself, for any other status.
    """
    if error.status < 500 and error.status not in RETRYABLE_STATUS:
        raise error
    return error


def _transport_error(exc: BaseException) -> ApiError:
    """A request that got no answer (connection, timeout, unreadable body), as a status-0 error."""
    return ApiError(0, f"{type(exc).__name__}: {exc}")


def _retry_delay(attempt: int, deadline: float | None, error: ApiError) -> float:
    """The :func:`backoff` delay before retry number ``attempt``.

    Raises:
        ApiError: ``error``, the last try's failure, when the retry would start after
            ``deadline`` (``None``: no deadline).
    """
    delay = backoff(attempt)
    if deadline is not None and time.monotonic() + delay > deadline:
        raise error
    return delay


async def _retried(
    attempt_once: Callable[[], Awaitable[_T | ApiError]],
    deadline: float | None,
    no_answer: tuple[type[Exception], ...],
    *,
    log_path: str | None = None,
) -> _T:
    """``attempt_once()``'s answer, tried again after each :func:`_retry_delay` until it answers.

    Args:
        attempt_once: one try: the answer, or a failed answer worth another try (what
            :func:`_retryable` returns).
        deadline: when retrying ends (``time.monotonic()``; ``None``: never).
        no_answer: what a try that got no answer raises (retried as :func:`_transport_error`).
        log_path: the request's path, to log a warning at the 1st, 5th and every 20th retry
            (``None``: retries are not logged).

    Raises:
        ApiError: what ``attempt_once`` raises (a failure retrying will not fix), or the last
            try's failure when the next would start after ``deadline``.
    """
    attempt = 0
    while True:
        try:
            answer = await attempt_once()
        except no_answer as exc:
            answer = _transport_error(exc)
        if not isinstance(answer, ApiError):
            return answer
        delay = _retry_delay(attempt, deadline, answer)
        attempt += 1
        if log_path is not None and (attempt in (1, 5) or attempt % 20 == 0):
            log.warning(
                "api call failed; retrying", path=log_path, error=str(answer), attempt=attempt
            )
        await asyncio.sleep(delay)


class ApiClient:
    """Calls the API gateway with the agent token.

    Args:
        api_url: the gateway's base URL (``http://host:port``; ``/api/v1`` is appended).
        token: the agent token (``Authorization: Bearer``), or empty for none.
        timeout: per-request timeout in seconds.
    """

    def __init__(self, api_url: str, token: str, *, timeout: float = 30.0) -> None:
        base = api_url.rstrip("/")
        self.base = base if base.endswith("/api/v1") else base + "/api/v1"
        self.token = token
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout)
            )
        return self._session

    async def close(self) -> None:
        """Closes the connection pool."""
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        retry_for: float | None = 60.0,
    ) -> Any:
        """Sends one request, retrying transient failures for up to ``retry_for`` seconds.

        Args:
            method: HTTP method.
            path: path under ``/api/v1``.
            body: JSON body.
            params: query parameters.
            retry_for: how long to keep retrying (``None``: forever).

        Returns:
            The decoded JSON answer (``None`` for an empty body).

        Raises:
            ApiError: a non-retryable status, or retries ran out.
        """
        deadline = None if retry_for is None else time.monotonic() + retry_for

        async def once() -> Any:
            async with self._http().request(
                method, self.base + path, json=body, params=params
            ) as resp:
                text = await resp.text()
                if resp.status < 300:
                    return await resp.json(content_type=None) if text.strip() else None
                return _retryable(ApiError(resp.status, text))

        return await _retried(
            once, deadline, (aiohttp.ClientError, TimeoutError, ValueError), log_path=path
        )

    async def join(self, agent_id: str, join_token: str) -> JoinResponse:
        """``POST /agents/{id}/join`` with the join token (not this client's token)."""
        headers = {"Authorization": f"Bearer {join_token}", "Accept": "application/json"}

        async def once() -> JoinResponse | ApiError:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as session,
                session.post(
                    f"{self.base}/agents/{_seg(agent_id)}/join", json={}, headers=headers
                ) as resp,
            ):
                text = await resp.text()
                if resp.status < 300:
                    return _answer(JoinResponse, await resp.json(content_type=None), "join")
                return _retryable(ApiError(resp.status, text))

        return await _retried(
            once, time.monotonic() + 60.0, (aiohttp.ClientError, TimeoutError, ValueError)
        )

    async def register(
        self,
        agent_id: str,
        resource_pool: str,
        slots: list[dict[str, Any]],
        hostname: str,
        incarnation: str,
        key: str,
        *,
        reserved_for: str | None = None,
    ) -> Any:
        """``POST /agents/{id}/register`` (``reserved_for``: the one allocation an ephemeral
        agent was started for; sent only when given, so an older gateway still takes the
        registration of an ordinary agent)."""
        reserved = {"reserved_for": reserved_for} if reserved_for is not None else {}
        body = _body(
            RegisterBody,
            resource_pool=resource_pool,
            slots=slots,
            hostname=hostname,
            incarnation=incarnation,
            idempotency_key=key,
            **reserved,
        )
        return await self.request(
            "POST", f"/agents/{_seg(agent_id)}/register", body=body, retry_for=None
        )

    async def leaving(self, agent_id: str, incarnation: str, key: str, *, retry_for: float) -> Any:
        """``POST /agents/{id}/leaving``: this process is shutting down and takes no new work."""
        body = _body(LeavingBody, incarnation=incarnation, idempotency_key=key)
        return await self.request(
            "POST", f"/agents/{_seg(agent_id)}/leaving", body=body, retry_for=retry_for
        )

    async def heartbeat(
        self, agent_id: str, running: list[str], incarnation: str, seq: int, key: str
    ) -> HeartbeatResponse:
        """``POST /agents/{id}/heartbeat``; a single attempt window of a few seconds."""
        body = _body(
            HeartbeatBody, running=running, incarnation=incarnation, seq=seq, idempotency_key=key
        )
        answer = await self.request(
            "POST", f"/agents/{_seg(agent_id)}/heartbeat", body=body, retry_for=5.0
        )
        return _answer(HeartbeatResponse, answer, "heartbeat")

    async def spec(self, allocation_id: str, agent_id: str) -> dict[str, Any]:
        """``GET /allocations/{id}/spec?agent_id=...``: the answer as sent, which
        :meth:`services.agent.runtime.RunSpec.from_api` parses (a malformed spec fails the run's
        launch, reported as its exit)."""
        answer = await self.request(
            "GET", f"/allocations/{_seg(allocation_id)}/spec", params={"agent_id": agent_id}
        )
        if not isinstance(answer, dict):
            raise ApiError(200, f"spec is not an object: {answer!r}")
        return answer

    async def download_code(self, code_ref: str, dest: Path, *, retry_for: float = 120.0) -> None:
        """``GET /code/{ref}`` streamed into ``dest`` (written atomically)."""
        part = dest.with_name(dest.name + ".part")

        async def once() -> ApiError | None:
            async with self._http().get(
                f"{self.base}/code/{_seg(code_ref)}",
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout),
            ) as resp:
                if resp.status >= 300:
                    return _retryable(ApiError(resp.status, await resp.text()))
                with part.open("wb") as fh:
                    async for chunk in resp.content.iter_chunked(1 << 16):
                        fh.write(chunk)
                part.replace(dest)
                return None

        await _retried(once, time.monotonic() + retry_for, (aiohttp.ClientError, TimeoutError))

    async def _post_allocation(
        self,
        allocation_id: str,
        action: str,
        model: type[BaseModel],
        *,
        retry_for: float | None = 60.0,
        **fields: Any,
    ) -> Any:
        """``POST /allocations/{id}/{action}`` with ``fields`` checked against ``model``."""
        body = _body(model, **fields)
        return await self.request(
            "POST", f"/allocations/{_seg(allocation_id)}/{action}", body=body, retry_for=retry_for
        )

    async def started(
        self, allocation_id: str, agent_id: str, incarnation: str, listed_from: int, key: str
    ) -> Any:
        """``POST /allocations/{id}/started`` (retried until it lands)."""
        return await self._post_allocation(
            allocation_id,
            "started",
            StartedBody,
            retry_for=None,
            agent_id=agent_id,
            incarnation=incarnation,
            listed_from=listed_from,
            idempotency_key=key,
        )

    async def exited(
        self,
        allocation_id: str,
        agent_id: str,
        exit_code: int,
        message: str,
        key: str,
        *,
        agent_shutdown: bool = False,
    ) -> Any:
        """``POST /allocations/{id}/exited`` (retried until it lands); ``agent_shutdown``: the
        agent stopped the run because it is shutting down."""
        shutdown = {"agent_shutdown": True} if agent_shutdown else {}
        return await self._post_allocation(
            allocation_id,
            "exited",
            ExitedBody,
            retry_for=None,
            agent_id=agent_id,
            exit_code=exit_code,
            message=message,
            idempotency_key=key,
            **shutdown,
        )

    async def pending_preemption(
        self, allocation_id: str, agent_id: str, reason: str, key: str, *, retry_for: float
    ) -> Any:
        """``POST /allocations/{id}/signals/pending_preemption``: the resource manager that
        started this agent signalled its job, so the run is to checkpoint and give its slots
        back (the API records the preemption once)."""
        return await self._post_allocation(
            allocation_id,
            "signals/pending_preemption",
            PendingPreemptionBody,
            retry_for=retry_for,
            agent_id=agent_id,
            reason=reason,
            idempotency_key=key,
        )

    async def ready(
        self, allocation_id: str, agent_id: str, address: str, port: int, key: str
    ) -> Any:
        """``POST /allocations/{id}/ready``: a task's server accepts connections."""
        return await self._post_allocation(
            allocation_id,
            "ready",
            ReadyBody,
            agent_id=agent_id,
            address=address,
            port=port,
            idempotency_key=key,
        )

    async def idle(self, allocation_id: str, agent_id: str, idle_seconds: int, key: str) -> Any:
        """``POST /allocations/{id}/idle``: a task's server has been idle ``idle_seconds``."""
        return await self._post_allocation(
            allocation_id,
            "idle",
            IdleBody,
            agent_id=agent_id,
            idle_seconds=idle_seconds,
            idempotency_key=key,
        )

    async def logs(
        self, allocation_id: str, lines: list[dict[str, Any]], key: str, *, retry_for: float
    ) -> Any:
        """``POST /allocations/{id}/logs``."""
        return await self._post_allocation(
            allocation_id, "logs", LogsBody, retry_for=retry_for, lines=lines, idempotency_key=key
        )

    async def rendezvous_join(
        self, allocation_id: str, agent_id: str, address: str, port: int, key: str
    ) -> RendezvousResponse:
        """``POST /allocations/{id}/rendezvous``: this agent's part of the gang is reachable at
        ``address:port`` (retried for a minute)."""
        answer = await self._post_allocation(
            allocation_id,
            "rendezvous",
            RendezvousJoinBody,
            agent_id=agent_id,
            address=address,
            port=port,
            idempotency_key=key,
        )
        return _answer(RendezvousResponse, answer, "rendezvous")

    async def rendezvous(
        self, allocation_id: str, agent_id: str, wait_seconds: float
    ) -> RendezvousResponse:
        """``GET /allocations/{id}/rendezvous``: long-polls up to ``wait_seconds`` for the
        other agents of the gang."""
        answer = await self.request(
            "GET",
            f"/allocations/{_seg(allocation_id)}/rendezvous",
            params={"agent_id": agent_id, "timeout_seconds": str(wait_seconds)},
        )
        return _answer(RendezvousResponse, answer, "rendezvous")

    async def preemption(self, allocation_id: str, wait_seconds: float) -> PreemptionResponse:
        """``GET /allocations/{id}/signals/preemption``: long-polls up to ``wait_seconds``;
        ``current: false`` once the run has ended or was replaced."""
        answer = await self.request(
            "GET",
            f"/allocations/{_seg(allocation_id)}/signals/preemption",
            params={"timeout_seconds": str(wait_seconds)},
        )
        return _answer(PreemptionResponse, answer, "preemption")
