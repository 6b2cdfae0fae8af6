"""The web UI's files: ``/`` serves the single page, ``/ui/...`` its ES modules, styles and the
vendored chart libraries (``services/api/web``; ``make install`` copies the libraries into
``web/vendor`` from ``node_modules``).

These routes are public (the page logs in through ``/api/v1/auth/login`` and sends its token
with every API call) and hidden from the OpenAPI document. Paths are resolved inside the web
directory only.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from services.api.errors import not_found
from services.api.routing import PUBLIC, RouteTable

routes = RouteTable("webui")

WEB_ROOT = Path(__file__).resolve().parent / "web"
_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}


def resolve(relative: str, root: Path = WEB_ROOT) -> Path | None:
    """The file ``relative`` names under ``root``, or ``None`` when it is outside, hidden or
    missing."""
    if not relative or "\x00" in relative or len(relative) > 300:
        return None
    parts = relative.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        return None
    path = (root / relative).resolve()
    if not path.is_relative_to(root.resolve()) or not path.is_file():
        return None
    return path


def _file(path: Path, *, cache: bool) -> web.FileResponse:
    headers = {
        "Content-Type": _TYPES.get(path.suffix, "application/octet-stream"),
        "Cache-Control": "public, max-age=86400" if cache else "no-cache",
        "X-Content-Type-Options": "nosniff",
    }
    return web.FileResponse(path, headers=headers)


@routes.get("/", allow=PUBLIC, hidden=True, raw_response="text/html")
async def index(request: web.Request) -> web.StreamResponse:
    """The web UI's page (every view is a ``#/...`` route of it)."""
    return _file(WEB_ROOT / "index.html", cache=False)


@routes.get("/ui/{path:.+}", allow=PUBLIC, hidden=True, raw_response="text/javascript")
async def asset(request: web.Request) -> web.StreamResponse:
    """A module, stylesheet or vendored library of the web UI."""
    relative = request.match_info["path"]
    path = resolve(relative)
    if path is None:
        raise not_found(f"no web UI file {relative!r}")
    return _file(path, cache=relative.startswith("vendor/"))
