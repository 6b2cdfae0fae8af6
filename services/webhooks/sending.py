"""One delivery attempt: post a body to a webhook's URL and say how it went.

An attempt succeeds on a 2xx answer. A 408, 429 or 5xx answer, a timeout or a failed
connection is worth retrying; any other answer (a redirect, which is never followed, or a 4xx)
and a refused address are final. The client follows no redirect, reads no proxy from the
environment and connects only through :class:`~services.webhooks.addresses.CheckingResolver`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver

from events.domain.config.cluster import WebhookPolicy
from events.domain.webhooks.urls import Endpoints, UrlError, parse_url
from services.webhooks.addresses import AddressRefused, CheckingResolver, describe, literal_problem

RETRYABLE = frozenset({408, 429})
"""4xx answers worth retrying (a timeout or throttling at the receiver)."""
MAX_ANSWER = 64 * 1024
"""The most of a receiver's answer read (it is only drained)."""


@dataclass(frozen=True)
class Attempt:
    """How one attempt went.

    Attributes:
        ok: the receiver answered 2xx.
        status: the HTTP status it answered (``None``: no answer).
        error: what went wrong, for people ('' when ``ok``).
        final: no retry can help (a 4xx, a redirect, a refused address or URL).
    """

    ok: bool
    status: int | None = None
    error: str = ""
    final: bool = False


class Poster:
    """The HTTP client deliveries are posted with (one per process; see the module doc).

    Args:
        policy: the cluster config's ``webhooks`` section (timeout, allowed networks).
        endpoints: the cluster's own services, never to be reached.
        resolver: the resolver names are asked of (``None``: the system's); tests map names.
    """

    def __init__(
        self,
        policy: WebhookPolicy,
        endpoints: Endpoints,
        resolver: AbstractResolver | None = None,
    ) -> None:
        self.policy = policy
        self.endpoints = endpoints
        self.networks = policy.networks()
        self._resolver = CheckingResolver(self.networks, endpoints, resolver)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=self._resolver, use_dns_cache=False, force_close=True, limit=0
            )
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False)
        return self._session

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> Attempt:
        """Posts ``body`` to ``url`` once, within the policy's timeout."""
        try:
            target = parse_url(url)
        except UrlError as exc:
            return Attempt(False, error=str(exc), final=True)
        if problem := literal_problem(target, self.networks, self.endpoints):
            return Attempt(False, error=f"refused: {problem}", final=True)
        timeout = self.policy.timeout.total_seconds()
        try:
            async with self._client().post(
                url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as answer:
                await answer.content.read(MAX_ANSWER)
                status = answer.status
        except AddressRefused as exc:
            return Attempt(False, error=f"refused: {exc}", final=True)
        except TimeoutError:
            return Attempt(False, error=f"no answer within {timeout:g} s")
        except aiohttp.ClientError as exc:
            refused = _refused(exc)
            error = describe(exc)
            return Attempt(False, error=f"refused: {error}" if refused else error, final=refused)
        except (OSError, ValueError) as exc:  # a socket or TLS error outside aiohttp's own
            return Attempt(False, error=describe(exc))
        if 200 <= status < 300:
            return Attempt(True, status)
        if status >= 500 or status in RETRYABLE:
            return Attempt(False, status, f"the receiver answered {status}")
        if 300 <= status < 400:
            error = f"the receiver answered {status} (redirects are not followed)"
            return Attempt(False, status, error, final=True)
        return Attempt(False, status, f"the receiver answered {status}", final=True)

    async def close(self) -> None:
        """Closes the client (a later :meth:`post` opens another)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
        await asyncio.sleep(0)


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, AddressRefused):
            return True
        seen = getattr(seen, "os_error", None) or seen.__cause__
    return False


__all__ = ["RETRYABLE", "Attempt", "Poster"]
