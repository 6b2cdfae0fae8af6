"""Which URLs a webhook may name, and which addresses a delivery may connect to.

Two checks, both pure:

- :func:`url_problem`, at creation and on a URL change: the URL is ``http(s)://host[:port]/...``
  without credentials or fragment, and lies under one of the cluster config's
  ``webhooks.allowed_urls`` prefixes (none: no URL is allowed).
- :func:`address_problem`, on every address a delivery is about to connect to (the host's
  address *as resolved for that connection*, so a name that later resolves elsewhere gains
  nothing): an address that is not globally routable (loopback, link-local, private, shared,
  reserved, multicast, unspecified) is refused unless it lies in one of
  ``webhooks.allowed_networks``, and a service of the cluster itself (its API, database, bus)
  is refused whatever the networks allow.

A prefix is ``scheme://host[:port][/path]``: the scheme and port must be equal (a missing port
is the scheme's default), the path of the URL must start with the prefix's path, and the host
must be equal, or match ``*.example.com`` (any subdomain of ``example.com``), or be ``*``
(any host).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from events.domain.types.webhooks import MAX_URL

DEFAULT_PORTS = {"http": 80, "https": 443}
_WILDCARD = re.compile(r"\*(\.[^/:?#*]+)?")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class UrlError(ValueError):
    """A URL or prefix that is not an ``http(s)`` URL cairn posts to; the message says why."""


@dataclass(frozen=True)
class Target:
    """A webhook URL taken apart.

    Attributes:
        scheme: ``http`` or ``https``.
        host: the host name, lower case (an IPv6 address without brackets).
        port: the port, the scheme's default when the URL names none.
        path: the path, ``/`` when empty.
    """

    scheme: str
    host: str
    port: int
    path: str

    @property
    def literal(self) -> IPAddress | None:
        """The host as an IP address, when the URL names one."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def _split(text: str, what: str) -> Target:
    if not isinstance(text, str) or not text:
        raise UrlError(f"{what} must be a non-empty URL")
    if len(text) > MAX_URL:
        raise UrlError(f"{what} is at most {MAX_URL} characters (this one has {len(text)})")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise UrlError(f"{what} holds spaces or control characters")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UrlError(f"{what} is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise UrlError(f"{what} must start with http:// or https:// (got {text[:40]!r})")
    host = (parts.hostname or "").lower()
    if not host:
        raise UrlError(f"{what} names no host")
    if parts.username is not None or parts.password is not None:
        raise UrlError(f"{what} must not carry a user name or password")
    if parts.fragment:
        raise UrlError(f"{what} must not have a #fragment")
    if port == 0:
        raise UrlError(f"{what} names port 0")
    return Target(scheme, host, port or DEFAULT_PORTS[scheme], parts.path or "/")


def parse_url(url: str) -> Target:
    """A webhook URL taken apart.

    Raises:
        UrlError: it is not ``http(s)://host[:port]/...``, or carries credentials or a fragment.
    """
    return _split(url, "url")


@dataclass(frozen=True)
class UrlPrefix:
    """An entry of ``webhooks.allowed_urls``, taken apart (see the module doc)."""

    scheme: str
    host: str
    port: int
    path: str

    def allows(self, target: Target) -> bool:
        """Whether ``target`` lies under this prefix."""
        if (target.scheme, target.port) != (self.scheme, self.port):
            return False
        if self.host != "*":
            if self.host.startswith("*."):
                if not target.host.endswith(self.host[1:]):
                    return False
            elif target.host != self.host:
                return False
        return target.path.startswith(self.path)


def parse_prefix(text: str) -> UrlPrefix:
    """An ``allowed_urls`` entry taken apart.

    Raises:
        UrlError: it is not ``http(s)://host[:port][/path]`` (``*`` or ``*.domain`` as host).
    """
    scheme, sep, rest = text.partition("://")
    wildcard = _WILDCARD.match(rest) if sep else None
    if wildcard is not None:
        text = f"{scheme}://wildcard{wildcard.group(1) or ''}{rest[wildcard.end() :]}"
    target = _split(text, "an allowed URL prefix")
    host = wildcard.group(0).lower() if wildcard is not None else target.host
    return UrlPrefix(target.scheme, host, target.port, target.path)


def url_problem(url: str, allowed: Iterable[str]) -> str | None:
    """Why a webhook may not post to ``url`` (``None``: it may).

    Args:
        url: the URL a user gave.
        allowed: the cluster config's ``webhooks.allowed_urls``.
    """
    try:
        target = parse_url(url)
    except UrlError as exc:
        return str(exc)
    prefixes = list(allowed)
    if not prefixes:
        return (
            "url: the cluster config allows no webhook URL (an administrator lists the allowed "
            "prefixes in webhooks.allowed_urls)"
        )
    if not any(parse_prefix(p).allows(target) for p in prefixes):
        shown = ", ".join(prefixes[:5]) + (", ..." if len(prefixes) > 5 else "")
        return f"url: {url[:200]!r} is not under an allowed prefix (webhooks.allowed_urls: {shown})"
    return None


@dataclass(frozen=True)
class Endpoint:
    """A service of the cluster itself that a delivery must never reach.

    Attributes:
        name: what it is, for the refusal (``the API``, ``the database``).
        address: where it listens; an unspecified one (``0.0.0.0``, ``::``) or a loopback
            one stands for every local address (:attr:`Endpoints.local`).
        port: its port.
    """

    name: str
    address: IPAddress
    port: int


@dataclass(frozen=True)
class Endpoints:
    """The cluster's own services, and the addresses of the machine the check runs on."""

    services: tuple[Endpoint, ...] = ()
    local: frozenset[IPAddress] = frozenset()


def _plain(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _is_local(address: IPAddress, endpoints: Endpoints) -> bool:
    return address.is_loopback or address.is_unspecified or address in endpoints.local


def address_problem(
    address: IPAddress,
    port: int,
    *,
    allowed_networks: Sequence[IPNetwork] = (),
    endpoints: Endpoints = Endpoints(),
) -> str | None:
    """Why a delivery may not connect to ``address:port`` (``None``: it may).

    Args:
        address: the address about to be connected to.
        port: the port.
        allowed_networks: the cluster config's ``webhooks.allowed_networks``.
        endpoints: the cluster's own services (always refused).
    """
    address = _plain(address)
    for service in endpoints.services:
        own = _plain(service.address)
        if port != service.port:
            continue
        if address == own or (_is_local(own, endpoints) and _is_local(address, endpoints)):
            return f"{address} port {port} is {service.name} of this cluster"
    if address.is_global and not address.is_multicast:
        return None
    if any(address in network for network in allowed_networks):
        return None
    kind = (
        "a loopback"
        if address.is_loopback
        else "a link-local"
        if address.is_link_local
        else "an unspecified"
        if address.is_unspecified
        else "a multicast"
        if address.is_multicast
        else "a private or reserved"
    )
    return (
        f"{address} is {kind} address (an administrator may allow its network in "
        "webhooks.allowed_networks)"
    )


__all__ = [
    "DEFAULT_PORTS",
    "Endpoint",
    "Endpoints",
    "Target",
    "UrlError",
    "UrlPrefix",
    "address_problem",
    "parse_prefix",
    "parse_url",
    "url_problem",
]
