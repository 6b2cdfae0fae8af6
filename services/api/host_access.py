"""The gateway's side of :mod:`events.domain.config.host_requests`: a config that asks for host paths,
devices or capabilities the cluster config (``tasks``) does not allow is a 400 naming the
field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from events.domain.config.host_requests import host_request_errors
from services.api.errors import ApiError
from services.api.routing import cluster_of


def check_host_requests(request: web.Request, config: Mapping[str, Any]) -> None:
    """Raises a 400 naming every part of ``config`` that asks more of a host than allowed.

    Raises:
        ApiError: 400, ``invalid config: bind_mounts[0].host_path: / is outside the allowed
            roots [...]``, with every such error in ``errors``.
    """
    errors = host_request_errors(config, cluster_of(request).tasks)
    if not errors:
        return
    path, message = errors[0]
    raise ApiError(
        400,
        f"invalid config: {path}: {message}",
        path=path,
        details={"errors": [{"path": p, "message": m} for p, m in errors]},
    )
