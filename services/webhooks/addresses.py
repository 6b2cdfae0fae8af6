"""Where a delivery may connect: the check on the address each connection is made to.

A webhook names a host; what it resolves to may change between the creation check and any
later delivery (DNS rebinding). So the check is made by the resolver the HTTP client connects
through (:class:`CheckingResolver`): every connection resolves afresh (no DNS cache), and the
addresses it would connect to are checked by :func:`events.domain.webhooks.urls.address_problem`
first; one refused address refuses the connection. A URL naming an address (not a name) never
reaches a resolver, so :func:`literal_problem` checks it before the request. Redirects are
never followed and no proxy from the environment is used (see :mod:`.sending`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import psutil
import structlog
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from events.domain.webhooks.urls import (
    Endpoint,
    Endpoints,
    IPAddress,
    IPNetwork,
    Target,
    address_problem,
)

log = structlog.get_logger("webhooks")


class AddressRefused(OSError):
    """A delivery would connect to an address it may not reach; the message says why."""


class CheckingResolver(AbstractResolver):
    """Resolves through ``base`` and refuses any answer holding an address deliveries may not
    reach (see the module doc).

    Args:
        networks: the cluster config's ``webhooks.allowed_networks``.
        endpoints: the cluster's own services.
        base: the resolver asked (``None``: aiohttp's default, the system's resolver).
    """

    def __init__(
        self,
        networks: Sequence[IPNetwork],
        endpoints: Endpoints,
        base: AbstractResolver | None = None,
    ) -> None:
        self.networks = tuple(networks)
        self.endpoints = endpoints
        self.base = base or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The addresses of ``host``, all of them allowed.

        Raises:
            AddressRefused: one of them is not (an ``OSError``: the client reports a failed
                connection, which the sender records with this message).
        """
        answers = await self.base.resolve(host, port, family)
        for answer in answers:
            address = ipaddress.ip_address(answer["host"])
            problem = address_problem(
                address, port, allowed_networks=self.networks, endpoints=self.endpoints
            )
            if problem is not None:
                raise AddressRefused(f"{host} resolves to {problem}")
        return answers

    async def close(self) -> None:
        """Closes the base resolver."""
        await self.base.close()


def literal_problem(
    target: Target, networks: Sequence[IPNetwork], endpoints: Endpoints
) -> str | None:
    """Why a URL naming an address may not be posted to (``None``: it may, or it names a
    host, which the resolver checks at connect time)."""
    address = target.literal
    if address is None:
        return None
    return address_problem(address, target.port, allowed_networks=networks, endpoints=endpoints)


def local_addresses() -> frozenset[IPAddress]:
    """Every address of this machine's interfaces."""
    found: set[IPAddress] = set()
    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, psutil.Error) as exc:  # pragma: no cover - a host without /proc
        log.warning("cannot list this machine's addresses", error=str(exc))
        return frozenset()
    for entries in interfaces.values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    found.add(ipaddress.ip_address(entry.address.split("%", 1)[0]))
                except ValueError:
                    continue
    return frozenset(found)


def _addresses_of(host: str) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return []
    out: list[IPAddress] = []
    for info in infos:
        try:
            out.append(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]))
        except ValueError:
            continue
    return out


def _host_port(url: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or default_port
    except ValueError:
        return None
    host = parts.hostname or ""
    if not host or host.startswith("/"):
        return None  # a Unix socket: nothing a delivery can connect to
    return host, port


def cluster_endpoints(
    *,
    db: str | None = None,
    nats: str | None = None,
    api: Iterable[tuple[str, int]] = (),
) -> Endpoints:
    """The cluster's own services a delivery must never reach, and this machine's addresses.

    Args:
        db: the database DSN (its host and port are taken; nothing else of it is kept).
        nats: the bus URL, likewise (several, comma-separated, are all taken).
        api: the gateway's listening ``(host, port)`` pairs.
    """
    named: list[tuple[str, str, int]] = []
    if db and (found := _host_port(db, 5432)):
        named.append(("the database", *found))
    for url in (nats or "").split(","):
        if url.strip() and (found := _host_port(url.strip(), 4222)):
            named.append(("the event bus", *found))
    named.extend(("the API", host, port) for host, port in api)
    services = tuple(
        Endpoint(name, address, port)
        for name, host, port in named
        for address in _addresses_of(host)
    )
    return Endpoints(services=services, local=local_addresses())


def describe(exc: BaseException) -> str:
    """A delivery error for people: the refusal when an address was refused, else the error."""
    seen: Any = exc
    for _ in range(5):
        if isinstance(seen, AddressRefused):
            return str(seen)
        nxt = getattr(seen, "os_error", None) or seen.__cause__
        if nxt is None:
            break
        seen = nxt
    text = str(exc) or type(exc).__name__
    return text[:500]


__all__ = [
    "AddressRefused",
    "CheckingResolver",
    "cluster_endpoints",
    "describe",
    "literal_problem",
    "local_addresses",
]
