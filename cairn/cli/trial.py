"""``cairn trial`` (alias ``t``): describe, logs (``-f`` follows the NDJSON stream), download,
kill."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import (
    add_csv_flag,
    add_json_flag,
    fields,
    print_json,
    print_result,
    table,
    wants_json,
    when,
)
from cairn.client import Client
from cairn.errors import CairnError, UnreachableError, UsageError
from events.domain.names import TrialIdError, parse_trial_id

LOG_PAGE = 1000
RECONNECTS = 5


def register(sub: Any) -> None:
    """Adds the ``trial`` verb group."""
    group = sub.add_parser("trial", aliases=["t"], help="inspect and control trials")
    verbs = verb_group(group)

    describe = verbs.add_parser("describe", help="show a trial, its runs and its checkpoints")
    describe.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    describe.add_argument(
        "--metrics", action="store_true", help="also list every reported metric point"
    )
    describe.add_argument(
        "--metrics-summary", action="store_true", help="also list the latest point of each group"
    )
    add_pagination_args(describe)
    add_csv_flag(describe)
    add_json_flag(describe)
    describe.set_defaults(handler=cmd_describe)

    logs = verbs.add_parser("logs", help="print a trial's logs")
    logs.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    add_log_args(logs)
    add_json_flag(logs)
    logs.set_defaults(handler=cmd_logs)

    download = verbs.add_parser("download", help="download a trial's best or latest checkpoint")
    download.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    which = download.add_mutually_exclusive_group(required=True)
    which.add_argument("--best", action="store_true", help="the best by the searcher metric")
    which.add_argument("--latest", action="store_true", help="the one with the most steps")
    which.add_argument("--uuid", help="this checkpoint of the trial")
    download.add_argument(
        "-o", "--output-dir", type=Path, help="where to unpack it (default ./checkpoints/<uuid>)"
    )
    add_sort_args(download)
    download.add_argument(
        "-q", "--quiet", action="store_true", help="only print the checkpoint's path"
    )
    add_json_flag(download)
    download.set_defaults(handler=cmd_download)

    kill = verbs.add_parser("kill", help="kill a trial (it ends CANCELED)")
    kill.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    add_json_flag(kill)
    kill.set_defaults(handler=cmd_kill)


LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_LEVEL_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}
_RANK_PREFIX = re.compile(r"^\[rank=(\d+)\] ")


def add_log_args(parser: argparse.ArgumentParser) -> None:
    """Determined's log options: ``-f``, ``--head``/``--tail``, ``--rank-id``, ``--stdtype``,
    ``--level``, ``--timestamp-before``/``--timestamp-after``; ``--agent-id``,
    ``--container-id`` and ``--source`` are accepted and change nothing (every line of a cairn
    trial is its processes' output)."""
    parser.add_argument("-f", "--follow", action="store_true", help="stream until the trial ends")
    ends = parser.add_mutually_exclusive_group()
    ends.add_argument("--head", type=int, metavar="N", help="only the first N lines")
    ends.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    parser.add_argument(
        "--rank-id", dest="rank_ids", type=int, action="append", help="only these ranks"
    )
    parser.add_argument(
        "--stdtype",
        dest="stdtypes",
        action="append",
        choices=("stdout", "stderr"),
        help="only this output stream (repeatable)",
    )
    parser.add_argument(
        "--level",
        type=str.upper,
        choices=[*LEVELS, *_LEVEL_ALIASES],
        help="only lines logged at this level or higher (LOG_FORMAT lines)",
    )
    parser.add_argument("--timestamp-before", metavar="TIME", help="only lines before (RFC 3339)")
    parser.add_argument("--timestamp-after", metavar="TIME", help="only lines after (RFC 3339)")
    for flag, dest in (
        ("--agent-id", "agent_ids"),
        ("--container-id", "container_ids"),
        ("--source", "sources"),
    ):
        parser.add_argument(flag, dest=dest, action="append", help=argparse.SUPPRESS)


def add_pagination_args(parser: argparse.ArgumentParser) -> None:
    """Determined's ``--limit``/``--offset``/``--pages`` (``--pages 1``: one page only)."""
    parser.add_argument("--limit", type=int, help="at most N per page (default: all)")
    parser.add_argument("--offset", type=int, default=0, help="skip the first N")
    parser.add_argument(
        "--pages", choices=("all", "1"), default="all", help="'1': only the first page"
    )


def add_sort_args(parser: argparse.ArgumentParser) -> None:
    """Determined's ``--sort-by METRIC --smaller-is-better true|false`` for choosing the best
    checkpoints by a validation metric other than the searcher's."""
    parser.add_argument(
        "--sort-by", metavar="METRIC", help="the validation metric to rank checkpoints by"
    )
    parser.add_argument(
        "--smaller-is-better",
        type=yes_no,
        metavar="(true|false)",
        help="with --sort-by: whether smaller values of the metric are better",
    )


def yes_no(text: str) -> bool:
    """An argparse type: ``true``/``false`` (also yes/no, 1/0)."""
    value = text.strip().lower()
    if value in ("true", "yes", "y", "1", "t"):
        return True
    if value in ("false", "no", "n", "0", "f"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def sort_choice(args: argparse.Namespace) -> tuple[str | None, bool | None]:
    """``(--sort-by, --smaller-is-better)``, checked to come together.

    Raises:
        UsageError: one without the other.
    """
    sort_by, smaller = getattr(args, "sort_by", None), getattr(args, "smaller_is_better", None)
    if (sort_by is None) != (smaller is None):
        raise UsageError("--sort-by and --smaller-is-better go together")
    return sort_by, smaller


def line_level(line: str) -> str | None:
    """The level a ``LOG_FORMAT`` line starts with (``INFO: [12] name: ...``), if any."""
    head, sep, _ = _RANK_PREFIX.sub("", line, count=1).partition(":")
    word = head.strip().upper()
    word = _LEVEL_ALIASES.get(word, word)
    return word if sep and word in LEVELS else None


def line_rank(entry: dict[str, Any]) -> int | None:
    """The rank a log line came from: its ``[rank=N] `` prefix (a launcher's ranks share one
    process's output), else the rank of the process that wrote it."""
    match = _RANK_PREFIX.match(str(entry.get("line", "")))
    if match is not None:
        return int(match.group(1))
    rank = entry.get("rank")
    return rank if isinstance(rank, int) else None


def log_filter(args: argparse.Namespace) -> Callable[[dict[str, Any]], bool]:
    """Which log entries ``args`` keeps (ranks, streams, level, time window)."""
    ranks = set(getattr(args, "rank_ids", None) or [])
    streams = set(getattr(args, "stdtypes", None) or [])
    level = getattr(args, "level", None)
    floor = LEVELS.index(_LEVEL_ALIASES.get(level, level)) if level else 0
    before = getattr(args, "timestamp_before", None)
    after = getattr(args, "timestamp_after", None)

    def keep(entry: dict[str, Any]) -> bool:
        if ranks and line_rank(entry) not in ranks:
            return False
        if streams and entry.get("stream") not in streams:
            return False
        if floor:
            found = line_level(str(entry.get("line", "")))
            if found is not None and LEVELS.index(found) < floor:
                return False
        stamp = _stamp(entry.get("ts"))
        if before and stamp is not None and stamp >= _stamp_arg(before):
            return False
        return not (after and stamp is not None and stamp <= _stamp_arg(after))

    return keep


def _stamp(value: Any) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _stamp_arg(text: str) -> datetime:
    stamp = _stamp(text)
    if stamp is None:
        raise UsageError(f"not an RFC 3339 time: {text!r} (e.g. 2026-10-26T23:17:12Z)")
    return stamp


def trial_id_arg(text: str) -> int:
    """An argparse type: a trial id (an integer, e.g. ``17``; a legacy trial also ``9.1``)."""
    try:
        return parse_trial_id(text)
    except TrialIdError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def trial_rows(trials: list[dict[str, Any]]) -> None:
    """Prints trials as a table."""
    table(
        ["TRIAL", "STATE", "STEPS", "BEST", "RESTARTS", "CHECKPOINT", "HPARAMS"],
        [
            [
                t.get("trial_id"),
                t.get("state"),
                t.get("steps_completed"),
                t.get("best_metric"),
                t.get("restarts"),
                t.get("latest_checkpoint"),
                t.get("hparams"),
            ]
            for t in trials
        ],
    )


def cmd_describe(args: argparse.Namespace) -> int:
    """Shows a trial with its allocations, checkpoints and alerts (``--metrics``: and every
    metric point; ``--metrics-summary``: the latest point of each group)."""
    client = auth_store.connect(args)
    trial = client.get_trial(args.trial_id)
    if wants_json(args):
        if args.metrics or args.metrics_summary:
            trial = {**trial, "metrics": client.get(f"/trials/{args.trial_id}/metrics")["metrics"]}
        print_json(trial)
        return 0
    progress = trial.get("progress")
    if isinstance(progress, dict):
        progress = progress.get("progress", progress)
    fields(
        [
            ("trial", trial.get("trial_id")),
            ("experiment", trial.get("experiment_id")),
            ("state", trial.get("state")),
            ("hparams", trial.get("hparams")),
            ("seed", trial.get("trial_seed")),
            ("run", trial.get("run_id")),
            ("restarts", trial.get("restarts")),
            ("steps", trial.get("steps_completed")),
            ("progress", progress),
            ("status", trial.get("status")),
            ("best metric", trial.get("best_metric")),
            ("latest validation", trial.get("latest_validation")),
            ("latest checkpoint", trial.get("latest_checkpoint")),
            ("started", when(trial.get("started_at"))),
            ("ended", when(trial.get("ended_at"))),
        ]
    )
    _section(
        trial.get("allocations") or [],
        [
            ("ALLOCATION", "allocation_id"),
            ("RUN", "run_id"),
            ("AGENT", "agent_id"),
            ("STATE", "state"),
            ("OUTCOME", "outcome"),
            ("EXIT", "exit_code"),
            ("STARTED", "started_at"),
            ("ENDED", "ended_at"),
        ],
    )
    if args.metrics or args.metrics_summary:
        print()
        metric_rows(client, args.trial_id, summary=not args.metrics, args=args)
    _section(
        trial.get("checkpoints") or [],
        [
            ("CHECKPOINT", "uuid"),
            ("STEPS", "steps_completed"),
            ("STATE", "state"),
            ("METRIC", "searcher_metric"),
            ("REPORTED", "reported_at"),
        ],
    )
    _section(
        trial.get("alerts") or [],
        [
            ("ALERT", "title"),
            ("LEVEL", "level"),
            ("DESCRIPTION", "description"),
            ("RUN", "run_id"),
            ("RECORDED", "recorded_at"),
        ],
    )
    return 0


def _section(items: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> None:
    """After a blank line, ``items`` as a table of ``(header, key)`` columns (a key ending in
    ``_at`` shown as a time); nothing when there are none."""
    if not items:
        return
    print()
    table(
        [header for header, _ in columns],
        [
            [when(item.get(key)) if key.endswith("_at") else item.get(key) for _, key in columns]
            for item in items
        ],
    )


def metric_rows(client: Client, trial_id: int, *, summary: bool, args: argparse.Namespace) -> None:
    """Prints a trial's metric points (the last of each group and run with ``summary``),
    ``--offset``/``--limit`` of them."""
    rows: list[dict[str, Any]] = list(client.get(f"/trials/{trial_id}/metrics")["metrics"])
    if summary:
        latest: dict[tuple[str, int], dict[str, Any]] = {}
        for row in rows:
            latest[(str(row.get("group")), int(row.get("run_id") or 0))] = row
        rows = list(latest.values())
    start = getattr(args, "offset", 0) or 0
    limit = getattr(args, "limit", None)
    rows = rows[start : start + limit if limit is not None else None]
    table(
        ["GROUP", "RUN", "STEPS", "METRICS", "REPORTED"],
        [
            [
                r.get("group"),
                r.get("run_id"),
                r.get("steps_completed"),
                r.get("metrics"),
                when(r.get("reported_at")),
            ]
            for r in rows
        ],
    )


def _line(entry: dict[str, Any]) -> str:
    return str(entry.get("line", "")).rstrip("\n")


def _follow(client: Client, trial_id: int, args: argparse.Namespace) -> None:
    """Streams the NDJSON logs; after a dropped connection, resumes after the last id seen."""
    after_id: int | None = None
    failures = 0
    keep = log_filter(args)
    left = args.head
    while True:
        query: dict[str, Any] = {}
        if after_id is not None:
            query["after_id"] = after_id
        elif args.tail is not None:
            query["tail"] = args.tail
        try:
            for entry in client.follow_trial_logs(trial_id, **query):
                if isinstance(entry.get("id"), int):
                    after_id = entry["id"]
                failures = 0
                if not keep(entry):
                    continue
                if left is not None:
                    if left <= 0:
                        return
                    left -= 1
                print(json.dumps(entry) if wants_json(args) else _line(entry), flush=True)
            return
        except UnreachableError:
            failures += 1
            if failures > RECONNECTS:
                raise
            time.sleep(min(2.0**failures, 10.0))


def print_logs(client: Client, trial_id: int, args: argparse.Namespace) -> int:
    """Prints a trial's logs (``args.head``/``tail``/``follow`` and the filters of
    :func:`add_log_args`, ``--json``); returns 0."""
    for flag in ("head", "tail"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 0:
            raise UsageError(f"--{flag} must not be negative")
    args.head = getattr(args, "head", None)
    if args.follow:
        _follow(client, trial_id, args)
        return 0
    keep = log_filter(args)
    filtered = any(
        getattr(args, name, None)
        for name in ("rank_ids", "stdtypes", "level", "timestamp_before", "timestamp_after")
    )
    if args.tail is not None and not filtered:
        page = client.trial_logs(trial_id, tail=args.tail)
        logs = list(page.get("logs") or [])
    else:
        logs = []
        after_id = 0
        while True:
            page = client.trial_logs(trial_id, after_id=after_id, limit=LOG_PAGE)
            batch = page.get("logs") or []
            logs.extend(entry for entry in batch if keep(entry))
            next_id = page.get("next_after_id")
            if args.head is not None and len(logs) >= args.head:
                break
            if len(batch) < LOG_PAGE or not isinstance(next_id, int) or next_id <= after_id:
                break
            after_id = next_id
        if args.tail is not None:
            logs = logs[-args.tail :] if args.tail else []
    if args.head is not None:
        logs = logs[: args.head]
    if wants_json(args):
        print_json({**page, "logs": logs})
    else:
        for entry in logs:
            print(_line(entry))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    """Prints or follows a trial's logs."""
    return print_logs(auth_store.connect(args), args.trial_id, args)


def cmd_kill(args: argparse.Namespace) -> int:
    """Kills a trial."""
    result = auth_store.connect(args).kill_trial(args.trial_id)
    already = "" if result.get("changed", True) else " (unchanged)"
    return print_result(args, result, f"trial {args.trial_id}: {result.get('state')}{already}")


def _chosen_checkpoint(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    """The trial's checkpoint ``--best``, ``--latest`` or ``--uuid`` names (deleted ones never)."""
    trial = client.get_trial(args.trial_id)
    known: list[dict[str, Any]] = [dict(c) for c in trial.get("checkpoints") or []]
    live = [c for c in known if c.get("state") == "COMPLETED"]
    if args.uuid is not None:
        found = [c for c in known if c.get("uuid") == args.uuid]
        if not found:
            raise CairnError(f"trial {args.trial_id} has no checkpoint {args.uuid}")
        return found[0]
    if not live:
        raise CairnError(f"trial {args.trial_id} has no checkpoint to download")
    if args.latest:
        return max(live, key=lambda c: (c.get("steps_completed") or 0, str(c.get("uuid"))))
    sort_by, smaller = sort_choice(args)
    if sort_by is not None:
        return rank_checkpoints(live, sort_by, bool(smaller))[0]
    # --best: the experiment's checkpoints come best first; the first of this trial wins.
    ranked = client.list_checkpoints(int(trial["experiment_id"]), sort_by="metric")
    for ckpt in ranked.get("checkpoints") or []:
        if ckpt.get("trial_id") == args.trial_id:
            return dict(ckpt)
    return live[-1]


def rank_checkpoints(
    checkpoints: list[dict[str, Any]], metric: str, smaller_is_better: bool
) -> list[dict[str, Any]]:
    """Checkpoints best first by validation ``metric`` (those without it left out).

    Raises:
        CairnError: none of them has the metric.
    """
    scored = [
        (float(value), c)
        for c in checkpoints
        for value in [(c.get("validation") or {}).get("metrics", c.get("validation") or {})]
        for value in [value.get(metric) if isinstance(value, dict) else None]
        if isinstance(value, int | float)
    ]
    if not scored:
        raise CairnError(f"no checkpoint has a validation metric {metric!r}")
    scored.sort(key=lambda pair: pair[0] if smaller_is_better else -pair[0])
    return [c for _, c in scored]


def cmd_download(args: argparse.Namespace) -> int:
    """Downloads and unpacks the trial's chosen checkpoint."""
    from cairn.cli.checkpoint import extract

    client = auth_store.connect(args)
    ckpt = _chosen_checkpoint(client, args)
    uuid = str(ckpt["uuid"])
    target: Path = args.output_dir or Path("checkpoints") / uuid
    files = extract(client.download_checkpoint(uuid), target)
    if args.quiet:
        print(target.resolve())
        return 0
    if wants_json(args):
        print_json(
            {
                "trial_id": args.trial_id,
                "uuid": uuid,
                "steps_completed": ckpt.get("steps_completed"),
                "path": str(target.resolve()),
                "files": files,
            }
        )
    else:
        steps = ckpt.get("steps_completed")
        print(f"checkpoint {uuid} (steps {steps}) downloaded to {target} ({len(files)} files)")
    return 0
