"""A TensorBoard task's process: ``python -m cairn.tasks.tensorboard_server``.

It copies the trials' TensorBoard files named by the sources file (see
:mod:`cairn.tasks.tensorboard_sources`) into a local logdir, one run per trial
(``trial_<id>``), copies again every :data:`SYNC_SECONDS` while it runs (new and grown files,
:mod:`cairn.tasks.tensorboard_sync`), and serves TensorBoard on the agent's address and port
under the API proxy's path prefix (``/proxy/<task id>/``).

TensorBoard has no credential of its own, so its WSGI app runs behind :class:`TokenGate` in
this process: every request must carry ``Authorization: token <t>`` with the token from the
environment (:data:`~cairn.tasks.tensorboard_sources.TOKEN_VARIABLE`; never the command line),
which only the API's proxy adds. Whoever reaches the port another way (another user's trial
on the same host) gets 403.
"""

from __future__ import annotations

import argparse
import hmac
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from cairn.tasks.tensorboard_sources import TOKEN_VARIABLE, read_sources
from cairn.tasks.tensorboard_sync import TensorboardSync

log = logging.getLogger("cairn.tasks.tensorboard")

SYNC_SECONDS = 3.0
"""How often the trials' files are copied again."""

RELOAD_SECONDS = 3
"""How often TensorBoard reads the logdir again."""

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class TokenGate:
    """A WSGI layer that passes a request on only with ``Authorization: token <token>``.

    Args:
        app: the WSGI app behind it (TensorBoard's).
        token: the token every request must carry.
    """

    def __init__(self, app: WsgiApp, token: str) -> None:
        if not token:
            raise ValueError("an empty token would let everyone in")
        self.app = app
        self._expected = f"token {token}".encode()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """Answers 403 unless the request carries the token."""
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if not hmac.compare_digest(given, self._expected):
            body = b"this TensorBoard is reached through cairn's proxy only\n"
            start_response(
                "403 Forbidden",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
            )
            return [body]
        return self.app(environ, start_response)


def _keep_syncing(sync: TensorboardSync, stop: threading.Event) -> None:
    while True:
        try:
            report = sync.sync()
        except Exception:  # a bug here must not take the pages down; the next round retries
            log.exception("TensorBoard files could not be copied")
        else:
            copied = len(report.created) + len(report.appended) + len(report.replaced)
            if copied:
                log.info("copied %d TensorBoard file(s)", copied)
        if stop.wait(SYNC_SECONDS):
            return


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The server's command line (nothing secret on it)."""
    parser = argparse.ArgumentParser(prog="python -m cairn.tasks.tensorboard_server")
    parser.add_argument("--address", required=True, help="the address to bind")
    parser.add_argument("--port", type=int, required=True, help="the port to bind")
    parser.add_argument("--prefix", required=True, help="the path prefix, /proxy/<task id>/")
    parser.add_argument("--sources", type=Path, required=True, help="the sources file")
    parser.add_argument("--logdir", type=Path, required=True, help="the local logdir")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Copies the files, keeps copying, and serves TensorBoard until stopped."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    token = os.environ.get(TOKEN_VARIABLE, "")
    if not token:
        print(f"{TOKEN_VARIABLE} is not set: refusing to serve without a token", file=sys.stderr)
        return 2
    try:
        sources = read_sources(args.sources)
    except (OSError, ValueError) as exc:
        print(f"cannot read the sources file {args.sources}: {exc}", file=sys.stderr)
        return 2
    args.logdir.mkdir(parents=True, exist_ok=True)
    sync = TensorboardSync(list(sources.sources), args.logdir)
    stop = threading.Event()
    threading.Thread(
        target=_keep_syncing, args=(sync, stop), name="tensorboard-sync", daemon=True
    ).start()

    from tensorboard import program  # heavy: imported once the inputs are known to be sound

    def server(app: WsgiApp, flags: argparse.Namespace) -> Any:
        return program.WerkzeugServer(TokenGate(app, token), flags)

    board = program.TensorBoard(server_class=server)
    board.configure(
        logdir=str(args.logdir),
        host=args.address,
        port=args.port,
        path_prefix=args.prefix.rstrip("/"),
        load_fast="false",  # the Python reader: it follows every file of a run as it grows
        reload_multifile=True,
        reload_interval=RELOAD_SECONDS,
    )
    try:
        return int(board.main() or 0)
    finally:
        stop.set()


if __name__ == "__main__":
    sys.exit(main())
