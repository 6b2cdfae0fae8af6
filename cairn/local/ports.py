"""The API's port: the one asked for when it is free, else any free one."""

from __future__ import annotations

import socket

from cairn.local.servers import free_port


def port_free(port: int) -> bool:
    """True if nothing listens on ``port`` on 127.0.0.1 (we could bind it just now)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def api_port(preferred: int) -> int:
    """``preferred`` if it is free, else (or when it is 0) any free port."""
    if preferred == 0 or not port_free(preferred):
        return free_port()
    return preferred
