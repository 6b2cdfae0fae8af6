"""The ``cairn`` command line.

Every module in this package that defines ``register(subparsers)`` contributes its verbs; modules
are discovered at start-up so that each verb group lives in a small file of its own.

Global options: ``-m/--master URL`` (default ``$CAIRN_MASTER``, else Determined's
``$DET_MASTER``, else the embedded cluster's API URL from ``$CAIRN_HOME/cluster.json``, else
``http://localhost:8080``), ``-u/--user NAME`` (run as that user), ``-v/--version`` and
``--json``. Determined's verbs, abbreviations and arguments are accepted where cairn has the verb
(``cairn e create CONFIG DIR -f``, ``cairn t logs 3 -f``), and a verb group given alone runs its
default verb as ``det`` does (``cairn e`` lists experiments). Shell completion:
``eval "$(cairn completion bash)"`` (or ``zsh``). Exit codes (``docs/tracking.md``, "CLI"):
0 success, 1 failure, 2 usage error, 3 authentication required, 4 not found, 5 not allowed,
6 master unreachable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

import cairn
from cairn.cli import output
from cairn.errors import CairnError


def build_parser() -> argparse.ArgumentParser:
    """Builds the argument parser with every registered verb group."""
    parser = argparse.ArgumentParser(prog="cairn", description="cairn: train, search, track.")
    parser.add_argument(
        "-m",
        "--master",
        default=None,
        help="API address (default: env CAIRN_MASTER, else DET_MASTER, else the embedded "
        "cluster's API from $CAIRN_HOME/cluster.json, else http://localhost:8080)",
    )
    parser.add_argument(
        "-u",
        "--user",
        dest="as_user",
        default=None,
        metavar="username",
        help="run as this user (logs in with CAIRN_PASSWORD or DET_PASS, else asks)",
    )
    parser.add_argument(
        "-v",
        "--version",
        action="version",
        version=f"%(prog)s {cairn.__version__}",
        help="print the CLI's version and exit",
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


def verb_group(
    group: argparse.ArgumentParser, *, default_verb: str | None = None, metavar: str = "VERB"
) -> Any:
    """Makes ``group`` a verb group and returns its subparsers: given alone, the group runs
    ``default_verb`` (``cairn e`` lists), or prints its own help when it has none."""
    group.set_defaults(group_parser=group, default_verb=default_verb)
    return group.add_subparsers(metavar=metavar)


def add_verb(
    verbs: Any,
    name: str,
    handler: Any,
    text: str,
    *positionals: str,
    aliases: Sequence[str] = (),
) -> argparse.ArgumentParser:
    """Adds verb ``name`` (run by ``handler``, taking ``positionals`` and ``--json``) to a
    group's ``verbs``; returns its parser for more flags."""
    from cairn.cli.output import add_json_flag

    verb: argparse.ArgumentParser = verbs.add_parser(name, help=text, aliases=list(aliases))
    for positional in positionals:
        verb.add_argument(positional)
    add_json_flag(verb)
    verb.set_defaults(handler=handler)
    return verb


def _report(exc: CairnError) -> None:
    print(f"error: {exc}", file=sys.stderr)
    errors: list[tuple[str, str]] = getattr(exc, "errors", None) or []
    if len(errors) > 1:
        for path, message in errors:
            print(f"  {path}: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the CLI and returns its exit code (see the module docstring for their meaning)."""
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:
        import argcomplete

        argcomplete.autocomplete(parser)
    words = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None and getattr(args, "default_verb", None):
        args = parser.parse_args([*words, args.default_verb])  # ``cairn e`` lists, as ``det e``
        handler = getattr(args, "handler", None)
    if handler is None:
        sub_parser = getattr(args, "group_parser", None)
        (sub_parser or parser).print_help()
        return 2
    output.use_csv(args)
    try:
        code = handler(args)
    except CairnError as exc:
        _report(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``cairn status | head``); stop quietly like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(code or 0)
