"""Login throttling: failed logins counted per username and per client address.

A guesser who tries many passwords for one user, or many users from one address, gets
``429 Too Many Requests`` with ``Retry-After`` once the failures within the window reach the
cluster config's limits (``accounts.login_throttle``); a throttled attempt is not checked (and
not counted). A successful login clears the failures of its username, everywhere they were
counted (so a user who mistyped is not held back), but not an address's failures for other
usernames: logging in to one's own account does not buy more guesses at someone else's.

Counts live in the gateway's memory: each replica throttles on its own, and a restart forgets
them. The number of usernames and addresses tracked is bounded, the oldest dropped first, so a
flood of made-up names cannot grow the gateway's memory.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from events.domain.config.cluster import LoginThrottle

MAX_TRACKED = 100_000
"""Most usernames plus addresses whose failures are remembered at once."""


@dataclass
class _Failures:
    """Recent failures of one username or address, oldest first: ``(time, username)``."""

    times: collections.deque[tuple[float, str]] = field(default_factory=collections.deque)


class LoginThrottler:
    """Counts failed logins and says how long a username or address must wait.

    Args:
        rules: the cluster config's ``accounts.login_throttle``.
        clock: seconds, monotonic (a test may pass its own).
    """

    def __init__(
        self, rules: LoginThrottle, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rules = rules
        self._clock = clock
        self._window = rules.window.total_seconds()
        self._seen: collections.OrderedDict[str, _Failures] = collections.OrderedDict()

    def _recent(self, key: str, now: float) -> collections.deque[tuple[float, str]]:
        entry = self._seen.get(key)
        if entry is None:
            return collections.deque()
        while entry.times and entry.times[0][0] <= now - self._window:
            entry.times.popleft()
        if not entry.times:
            del self._seen[key]
        return entry.times

    def _wait(self, key: str, limit: int, now: float) -> float:
        times = self._recent(key, now)
        if len(times) < limit:
            return 0.0
        # Allowed again once enough of the failures have left the window.
        return times[len(times) - limit][0] + self._window - now

    def retry_after(self, username: str, address: str) -> int:
        """Seconds (at least 1) before ``username`` from ``address`` may try again; 0: now."""
        now = self._clock()
        wait = max(
            self._wait(f"user:{username}", self.rules.max_failures_per_user, now),
            self._wait(f"addr:{address}", self.rules.max_failures_per_address, now),
        )
        return max(1, math.ceil(wait)) if wait > 0 else 0

    def failed(self, username: str, address: str) -> None:
        """Counts a failed login of ``username`` from ``address``."""
        now = self._clock()
        for key in (f"user:{username}", f"addr:{address}"):
            entry = self._seen.pop(key, None) or _Failures()
            entry.times.append((now, username))
            self._seen[key] = entry  # most recently failed last
        while len(self._seen) > MAX_TRACKED:
            self._seen.popitem(last=False)

    def succeeded(self, username: str, address: str) -> None:
        """Clears the failures of ``username``: its own count and its part of ``address``'s."""
        self._seen.pop(f"user:{username}", None)
        entry = self._seen.get(f"addr:{address}")
        if entry is not None:
            entry.times = collections.deque(t for t in entry.times if t[1] != username)
            if not entry.times:
                del self._seen[f"addr:{address}"]


THROTTLER = web.AppKey("cairn_login_throttler", LoginThrottler)
"""The gateway's login throttler."""
