"""``cairn preview-search CONFIG``: show what a hyperparameter search would run, offline."""

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
    parser.add_argument("config_file", metavar="CONFIG", help="experiment config (YAML)")
    parser.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. searcher.max_trials=8 (repeatable)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Handles ``preview-search``; returns 1 (errors on stderr) for an invalid config."""
    path = Path(args.config_file)
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
    try:
        result = preview_search(config)
    except SearcherError as exc:
        print(f"error: cannot preview {path}: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_preview(result))
    return 0
