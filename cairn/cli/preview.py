"""``cairn preview-search CONFIG``: show what a hyperparameter search would run, offline.

Given a directory, it checks every ``*.yaml``/``*.yml`` config under it instead and prints one
line per file: accepted, accepted with warnings (the ignored paths), or refused (the path and
what is wrong), each accepted one with what its search would run (searcher, trials, training
length), then the totals.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cairn.errors import UsageError
from events.domain.config import ConfigError, ExperimentConfig, parse_config
from events.domain.search.base import SearcherError
from events.domain.search.preview import DEFAULT_PREVIEW_SEED, preview_search, render_preview
from services.searcher.local_preview import LocalAnswers


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


@dataclass(frozen=True)
class FileCheck:
    """What ``preview-search DIR`` found for one file.

    Attributes:
        verdict: ``accepted``, ``warnings`` or ``refused``.
        detail: the ignored paths (``warnings``) or the first problem (``refused``).
        search: one line on what the search would run (accepted configs; empty otherwise).
        trials: the trials the search would create (0 when unknown).
    """

    verdict: str
    detail: str = ""
    search: str = ""
    trials: int = 0


_SINGULAR = {"batches": "batch", "epochs": "epoch", "records": "record"}


def _search_summary(config: ExperimentConfig) -> tuple[str, int]:
    """``("grid: 2 trials, 8 batches in all", 2)``, or why there is no preview."""
    try:
        result = preview_search(config)
    except SearcherError as exc:
        return f"{config.searcher.name}: no preview ({exc})", 0
    plural = "" if result.total_trials == 1 else "s"
    line = f"{result.searcher}: {result.total_trials} trial{plural}"
    if result.total_units is not None and result.unit:
        unit = _SINGULAR.get(result.unit, result.unit) if result.total_units == 1 else result.unit
        line += f", {result.total_units} {unit} in all"
    return line, result.total_trials


def check_file(path: Path, overrides: list[str]) -> FileCheck:
    """Parses one config file and previews its search.

    Returns:
        Its verdict: ``accepted``, ``warnings`` (the ignored paths) or ``refused`` (the first
        problem's path and message; a file that cannot be read too).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return FileCheck("refused", f"cannot read: {getattr(exc, 'strerror', None) or exc}")
    try:
        config = parse_config(text, overrides, default_seed=DEFAULT_PREVIEW_SEED)
    except ConfigError as exc:
        where, message = exc.errors[0] if exc.errors else ("<config>", "invalid config")
        more = f" (+{len(exc.errors) - 1} more)" if len(exc.errors) > 1 else ""
        return FileCheck("refused", f"{where}: {message}{more}")
    search, trials = _search_summary(config)
    if config.warnings:
        return FileCheck("warnings", ", ".join(w.path for w in config.warnings), search, trials)
    return FileCheck("accepted", "", search, trials)


def run_directory(directory: Path, overrides: list[str], as_json: bool) -> int:
    """Checks every config under ``directory``; returns 1 when any is refused."""
    files = sorted(
        p for p in directory.rglob("*") if p.is_file() and p.suffix.lower() in CONFIG_SUFFIXES
    )
    if not files:
        raise UsageError(f"{directory}: no *.yaml or *.yml files")
    results = [(p, check_file(p, overrides)) for p in files]
    if as_json:
        rows = [{"file": str(p.relative_to(directory)), **asdict(check)} for p, check in results]
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(str(p.relative_to(directory))) for p in files)
        for path, check in results:
            name = str(path.relative_to(directory)).ljust(width)
            if check.verdict == "accepted":
                print(f"{name}  accepted ({check.search})")
            elif check.verdict == "warnings":
                print(f"{name}  accepted ({check.search}) with warnings: ignored {check.detail}")
            else:
                print(f"{name}  refused: {check.detail}")
        counts = {v: sum(1 for _, c in results if c.verdict == v) for v in _VERDICTS}
        trials = sum(c.trials for _, c in results)
        print(
            f"{len(results)} configs: {counts['accepted']} accepted, "
            f"{counts['warnings']} accepted with warnings, {counts['refused']} refused; "
            f"{trials} trials in all"
        )
    return 1 if any(c.verdict == "refused" for _, c in results) else 0


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
        result = preview_search(config, code_dir=path.resolve().parent, answers=LocalAnswers)
    except SearcherError as exc:
        print(f"error: cannot preview {path}: {exc}", file=sys.stderr)
        return 1
    if getattr(args, "json", False):
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render_preview(result))
    return 0
