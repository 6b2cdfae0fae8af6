"""User YAML and configs are parsed here, off the event loop.

A config or template is at most a few hundred KiB and its YAML is bounded
(:mod:`events.domain.config.safe_yaml`), but parsing and validating the largest still takes a moment of
CPU; done on the event loop it would hold up every other request (health checks, heartbeats,
reports) meanwhile. :func:`off_loop` runs such work on a small pool of its own, two at a time,
whatever else uses the default executor.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

from events.domain.config import load_yaml
from services.api.errors import ApiError

log = structlog.get_logger("api")

CONFIG_TIMEOUT_S = 60.0
"""How long a config may take to parse and validate; past it the API answers 503. The config
limits keep the largest config at a few seconds, so only an overloaded gateway gets there."""

_CONFIG_WORKERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="config")

T = TypeVar("T")


async def off_loop(work: Callable[..., T], *args: Any) -> T:
    """``work(*args)`` on the config workers, within :data:`CONFIG_TIMEOUT_S`.

    Raises:
        ApiError: 503 when it took longer (the gateway is overloaded).
        Exception: whatever ``work`` raised.
    """
    future = asyncio.get_running_loop().run_in_executor(_CONFIG_WORKERS, work, *args)
    try:
        return await asyncio.wait_for(future, CONFIG_TIMEOUT_S)
    except TimeoutError:
        log.warning("config parsing timed out", limit_s=CONFIG_TIMEOUT_S)
        raise ApiError(503, "config parsing timed out, retry later") from None


async def yaml_off_loop(text: str, source: str = "<config>") -> Any:
    """:func:`events.domain.config.load_yaml` of ``text``, off the event loop.

    Raises:
        ConfigError: the YAML is invalid or past the limits.
        ApiError: 503 when parsing took too long.
    """
    return await off_loop(load_yaml, text, source)
