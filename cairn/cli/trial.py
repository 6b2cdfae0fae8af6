"""``cairn trial`` (alias ``t``): describe, logs (``-f`` follows the NDJSON stream), download,
kill."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from cairn.cli import auth_store
from cairn.cli.output import add_json_flag, fields, print_json, table, wants_json, when
from cairn.client import Client
from cairn.errors import CairnError, UnreachableError, UsageError
from events.names import TrialIdError, parse_trial_id

LOG_PAGE = 1000
RECONNECTS = 5


def register(sub: Any) -> None:
    """Adds the ``trial`` verb group."""
    group = sub.add_parser("trial", aliases=["t"], help="inspect and control trials")
    group.set_defaults(group_parser=group)
    verbs = group.add_subparsers(metavar="VERB")

    describe = verbs.add_parser("describe", help="show a trial, its runs and its checkpoints")
    describe.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    add_json_flag(describe)
    describe.set_defaults(handler=cmd_describe)

    logs = verbs.add_parser("logs", help="print a trial's logs")
    logs.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    logs.add_argument("-f", "--follow", action="store_true", help="stream until the trial ends")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
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
    add_json_flag(download)
    download.set_defaults(handler=cmd_download)

    kill = verbs.add_parser("kill", help="kill a trial (it ends CANCELED)")
    kill.add_argument("trial_id", type=trial_id_arg, help="the trial's id, e.g. 17")
    add_json_flag(kill)
    kill.set_defaults(handler=cmd_kill)


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
    """Shows a trial with its allocations, checkpoints and alerts."""
    trial = auth_store.connect(args).get_trial(args.trial_id)
    if wants_json(args):
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
    allocations = trial.get("allocations") or []
    if allocations:
        print()
        table(
            ["ALLOCATION", "RUN", "AGENT", "STATE", "OUTCOME", "EXIT", "STARTED", "ENDED"],
            [
                [
                    a.get("allocation_id"),
                    a.get("run_id"),
                    a.get("agent_id"),
                    a.get("state"),
                    a.get("outcome"),
                    a.get("exit_code"),
                    when(a.get("started_at")),
                    when(a.get("ended_at")),
                ]
                for a in allocations
            ],
        )
    checkpoints = trial.get("checkpoints") or []
    if checkpoints:
        print()
        table(
            ["CHECKPOINT", "STEPS", "STATE", "METRIC", "REPORTED"],
            [
                [
                    c.get("uuid"),
                    c.get("steps_completed"),
                    c.get("state"),
                    c.get("searcher_metric"),
                    when(c.get("reported_at")),
                ]
                for c in checkpoints
            ],
        )
    alerts = trial.get("alerts") or []
    if alerts:
        print()
        table(
            ["ALERT", "LEVEL", "DESCRIPTION", "RUN", "RECORDED"],
            [
                [
                    a.get("title"),
                    a.get("level"),
                    a.get("description"),
                    a.get("run_id"),
                    when(a.get("recorded_at")),
                ]
                for a in alerts
            ],
        )
    return 0


def _line(entry: dict[str, Any]) -> str:
    return str(entry.get("line", "")).rstrip("\n")


def _follow(client: Client, trial_id: int, args: argparse.Namespace) -> None:
    """Streams the NDJSON logs; after a dropped connection, resumes after the last id seen."""
    after_id: int | None = None
    failures = 0
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
                print(json.dumps(entry) if wants_json(args) else _line(entry), flush=True)
                failures = 0
            return
        except UnreachableError:
            failures += 1
            if failures > RECONNECTS:
                raise
            time.sleep(min(2.0**failures, 10.0))


def print_logs(client: Client, trial_id: int, args: argparse.Namespace) -> int:
    """Prints a trial's logs (``args.tail``, ``args.follow``, ``--json``); returns 0."""
    if args.tail is not None and args.tail < 0:
        raise UsageError("--tail must not be negative")
    if args.follow:
        _follow(client, trial_id, args)
        return 0
    if args.tail is not None:
        page = client.trial_logs(trial_id, tail=args.tail)
        logs = list(page.get("logs") or [])
    else:
        logs = []
        after_id = 0
        while True:
            page = client.trial_logs(trial_id, after_id=after_id, limit=LOG_PAGE)
            batch = page.get("logs") or []
            logs.extend(batch)
            next_id = page.get("next_after_id")
            if len(batch) < LOG_PAGE or not isinstance(next_id, int) or next_id <= after_id:
                break
            after_id = next_id
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
    if wants_json(args):
        print_json(result)
    else:
        already = "" if result.get("changed", True) else " (unchanged)"
        print(f"trial {args.trial_id}: {result.get('state')}{already}")
    return 0


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
    # --best: the experiment's checkpoints come best first; the first of this trial wins.
    ranked = client.list_checkpoints(int(trial["experiment_id"]), sort_by="metric")
    for ckpt in ranked.get("checkpoints") or []:
        if ckpt.get("trial_id") == args.trial_id:
            return dict(ckpt)
    return live[-1]


def cmd_download(args: argparse.Namespace) -> int:
    """Downloads and unpacks the trial's chosen checkpoint."""
    from cairn.cli.checkpoint import extract

    client = auth_store.connect(args)
    ckpt = _chosen_checkpoint(client, args)
    uuid = str(ckpt["uuid"])
    target: Path = args.output_dir or Path("checkpoints") / uuid
    files = extract(client.download_checkpoint(uuid), target)
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
