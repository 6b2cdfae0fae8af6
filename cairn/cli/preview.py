"""``cairn preview-search CONFIG``: show what a hyperparameter search would run, offline.

Given a directory, it checks every ``*.yaml``/``*.yml`` config under it instead and prints one
line per file: accepted, accepted with warnings (the ignored paths), or refused (the path and
what is wrong).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cairn.errors import UsageError
from events.config import ConfigError, parse_config
from services.searcher.methods.base import SearcherError
from services.searcher.preview import DEFAULT_PREVIEW_SEED, preview_search, render_preview


def register(sub: Any) -> None:
    """Adds the ``preview-search`` verb."""
    parser = sub.add_parser(
        "preview-search",
        help="simulate an experiment's hyperparameter search without a cluster",
        description=(
            "Validate an experiment config and simulate its searcher: how many trials it "
            "creates and how long each trains (per rung for ASHA searchers)."
        ),
    )
    parser.add_argument(
        "config_file",
        metavar="CONFIG",
        help="experiment config (YAML), or a directory of configs to check one line per file",
    )
    parser.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. searcher.max_trials=8 (repeatable)",
    )
    parser.set_defaults(handler=run)


CONFIG_SUFFIXES = (".yaml", ".yml")


def check_file(path: Path, overrides: list[str]) -> tuple[str, str]:
    """Parses one config file.

    Returns:
        ``(verdict, detail)``: ``accepted`` (no detail), ``warnings`` (the ignored paths) or
        ``refused`` (the first problem's path and message; a file that cannot be read too).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return "refused", f"cannot read: {getattr(exc, 'strerror', None) or exc}"
    try:
        config = parse_config(text, overrides, default_seed=DEFAULT_PREVIEW_SEED)
    except ConfigError as exc:
        where, message = exc.errors[0] if exc.errors else ("<config>", "invalid config")
        more = f" (+{len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
        return "refused", f"{where}: {message}{more}"
    if config.warnings:
        return "warnings", ", ".join(w.path for w in config.warnings)
    return "accepted", ""


def run_directory(directory: Path, overrides: list[str], as_json: bool) -> int:
    """Checks every config under ``directory``; returns 1 when any is refused."""
    files = sorted(
        p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in CONFIG_SUFFIXES
    )
    if not files:
        raise UsageError(f"{directory}: no *.yaml or *.yml files")
    results = [(p, *check_file(p, overrides)) for p in files]
    if as_json:
        rows = [
            {"file": str(p.relative_to(directory)), "verdict": v, "detail": d}
            for p, v, d in results
        ]
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(str(p.relative_to(directory))) for p in files)
        for path, verdict, detail in results:
            name = str(path.relative_to(directory)).ljust(width)
            if verdict == "accepted":
                print(f"{name}  accepted")
            elif verdict == "warnings":
                print(f"{name}  accepted with warnings: ignored {detail}")
            else:
                print(f"{name}  refused: {detail}")
        counts = {v: sum(1 for _, got, _ in results if got == v) for v in _VERDICTS}
        print(
            f"{len(results)} configs: {counts['accepted']} accepted, "
            f"{counts['warnings']} accepted with warnings, {counts['refused']} refused"
        )
    return 1 if any(v == "refused" for _, v, _ in results) else 0


_VERDICTS = ("accepted", "warnings", "refused")


def run(args: argparse.Namespace) -> int:
    """Handles ``preview-search``; returns 1 (errors on stderr) for an invalid config."""
    path = Path(args.config_file)
    if path.is_dir():
        return run_directory(path, args.overrides, bool(getattr(args, "json", False)))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        config = parse_config(text, args.overrides, default_seed=DEFAULT_PREVIEW_SEED)
    except ConfigError as exc:
        print(f"error: invalid experiment config {path}:", file=sys.stderr)
        for where, message in exc.errors:
            print(f"  {where}: {message}", file=sys.stderr)
        return 1
    for warning in config.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    try:
        result = preview_search(config, code_dir=path.resolve().parent)
    except SearcherError as exc:
        print(f"error: cannot preview {path}: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_preview(result))
    return 0
