"""The ``cairn`` command line.

Every module in this package that defines ``register(subparsers)`` contributes its verbs; modules
are discovered at start-up so that each verb group lives in a small file of its own.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

from cairn.errors import CairnError


def build_parser() -> argparse.ArgumentParser:
    """Builds the argument parser with every registered verb group."""
    parser = argparse.ArgumentParser(prog="cairn", description="cairn: train, search, track.")
    parser.add_argument(
        "-m",
        "--master",
        default=os.environ.get("CAIRN_MASTER", "http://127.0.0.1:8080"),
        help="API address (env CAIRN_MASTER; default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI and returns its exit code (0 ok, 1 failure, 2 usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code = handler(args)
    except CairnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``cairn status | head``); stop quietly like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(code or 0)
