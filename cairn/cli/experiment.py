"""``cairn experiment`` (alias ``e``): create, list, describe, control, wait for experiments."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, experiment_changes, verb_group
from cairn.cli.output import (
    Progress,
    add_at_flag,
    add_csv_flag,
    add_json_flag,
    cell,
    confirmed,
    fields,
    print_json,
    print_result,
    table,
    wants_json,
    when,
)
from cairn.cli.trial import add_log_args, add_pagination_args, print_logs, trial_rows
from cairn.client import ApiError, Client
from cairn.errors import CairnError, UnreachableError, UsageError
from events.domain import lifecycle

FOLLOW_INTERVAL = 1.0
UNREACHABLE_GRACE = 60.0


def register(sub: Any) -> None:
    """Adds the ``experiment`` verb group."""
    group = sub.add_parser("experiment", aliases=["e"], help="create and manage experiments")
    verbs = verb_group(group, default_verb="list")

    create = verbs.add_parser("create", help="submit an experiment (config + code directory)")
    create.add_argument("config_file", metavar="CONFIG", type=Path, help="experiment config YAML")
    create.add_argument(
        "model_dir",
        metavar="DIR",
        type=Path,
        nargs="?",
        help="code directory to upload (none: the entrypoint is in the image)",
    )
    create.add_argument(
        "-i",
        "--include",
        dest="includes",
        action="append",
        default=[],
        type=Path,
        metavar="PATH",
        help="a file or directory to add to the code, under its own name (repeatable)",
    )
    create.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field by dotted path, e.g. searcher.max_trials=8 (repeatable)",
    )
    create.add_argument(
        "-f",
        "--follow",
        "--follow-first-trial",
        dest="follow",
        action="store_true",
        help="follow the experiment until it ends (exit 0 only if it COMPLETED)",
    )
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument(
        "--template", metavar="NAME", help="merge the config over this template (see `template`)"
    )
    create.add_argument(
        "--project_id", "--project-id", type=int, help="accepted; cairn has no projects"
    )
    for flag, short in (("--test-mode", "-t"), ("--local", None)):
        names = [flag] if short is None else [short, flag]
        create.add_argument(*names, action="store_true", help=argparse.SUPPRESS)
    create.add_argument(
        "-p", "--publish", action="append", default=[], help=argparse.SUPPRESS
    )  # Determined's task ports: refused below
    add_json_flag(create)
    create.set_defaults(handler=cmd_create)

    ls = verbs.add_parser("list", aliases=["ls"], help="list experiments")
    ls.add_argument(
        "-a", "--all", action="store_true", help="every user's experiments, archived ones too"
    )
    ls.add_argument("--state", help="only these states (comma-separated)")
    ls.add_argument("--owner", help="only this user's experiments")
    ls.add_argument("--limit", type=int, help="at most N (default: all)")
    ls.add_argument("--offset", type=int, default=0, help="skip the first N")
    ls.add_argument(
        "--pages", choices=("all", "1"), default="all", help="'1': one page (--limit, or 200)"
    )
    ls.add_argument("--show_project", action="store_true", help="accepted; cairn has no projects")
    add_csv_flag(ls)
    add_json_flag(ls)
    ls.set_defaults(handler=cmd_list)

    describe = verbs.add_parser("describe", help="show experiments and their trials")
    describe.add_argument(
        "ids", type=id_list, metavar="experiment_ids", help="an id, or a comma-separated list"
    )
    describe.add_argument(
        "--metrics", action="store_true", help="also list each trial's latest metrics"
    )
    describe.add_argument(
        "--outdir", type=Path, help="also write the JSON of each to DIR/experiment-<id>.json"
    )
    add_at_flag(describe)
    add_csv_flag(describe)
    add_json_flag(describe)
    describe.set_defaults(handler=cmd_describe)

    for action, help_text, aliases in (
        ("pause", "pause an active experiment", []),
        ("activate", "resume a paused experiment", ["unpause"]),
        ("cancel", "stop an experiment, checkpointing its trials", []),
        ("kill", "stop an experiment now", []),
        ("archive", "hide a finished experiment from lists", []),
        ("unarchive", "show an archived experiment in lists again", []),
    ):
        p = verbs.add_parser(action, aliases=aliases, help=help_text)
        p.add_argument("id", type=int)
        add_json_flag(p)
        p.set_defaults(handler=cmd_action, action=action)

    delete = verbs.add_parser("delete", help="delete a finished experiment and its checkpoints")
    delete.add_argument("id", type=int)
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_json_flag(delete)
    delete.set_defaults(handler=cmd_delete)

    wait = verbs.add_parser("wait", help="wait until an experiment ends (exit 0 iff COMPLETED)")
    wait.add_argument("id", type=int)
    wait.add_argument(
        "--polling-interval", type=float, default=5.0, help="seconds between checks (%(default)s)"
    )
    add_json_flag(wait)
    wait.set_defaults(handler=cmd_wait)

    logs = verbs.add_parser("logs", help="the logs of the experiment's first trial")
    logs.add_argument("id", type=int)
    add_log_args(logs)
    add_json_flag(logs)
    logs.set_defaults(handler=cmd_logs)

    lt = verbs.add_parser("list-trials", aliases=["lt"], help="list an experiment's trials")
    lt.add_argument("id", type=int)
    add_pagination_args(lt)
    add_at_flag(lt)
    add_csv_flag(lt)
    add_json_flag(lt)
    lt.set_defaults(handler=cmd_list_trials)

    lc = verbs.add_parser(
        "list-checkpoints", aliases=["lc"], help="list an experiment's checkpoints, best first"
    )
    lc.add_argument("id", type=int)
    lc.add_argument("--best", type=int, metavar="N", help="only the N best")
    add_csv_flag(lc)
    add_json_flag(lc)
    lc.set_defaults(handler=cmd_list_checkpoints)

    experiment_changes.add_verbs(verbs)


def id_list(text: str) -> list[int]:
    """An argparse type: ``3`` or ``3,4,5``."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ids such as 3 or 3,4, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("expected at least one experiment id")
    return ids


# --------------------------------------------------------------------------- create


def load_config(path: Path, overrides: list[str]) -> dict[str, Any]:
    """Reads the YAML config and applies ``key.path=value`` overrides (values read as YAML).

    The server validates the result; only unreadable YAML or malformed overrides fail here.
    """
    from events.domain.config import ConfigError, apply_overrides, load_yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        doc = load_yaml(text, source=str(path))
        if not isinstance(doc, dict):
            raise UsageError(f"{path}: an experiment config must be a mapping")
        return apply_overrides(doc, overrides)
    except ConfigError as exc:
        problems = "; ".join(f"{where}: {message}" for where, message in exc.errors)
        raise UsageError(f"invalid experiment config {path}: {problems}") from None


def cmd_create(args: argparse.Namespace) -> int:
    """Submits the experiment; with ``-f`` follows it and exits 0 only if it COMPLETED."""
    if args.test_mode or args.local or args.publish:
        given = "--test-mode" if args.test_mode else "--local" if args.local else "--publish"
        raise UsageError(f"{given} is Determined's and not supported by cairn")
    config = load_config(args.config_file, args.overrides)
    if args.model_dir is not None and not args.model_dir.is_dir():
        raise UsageError(f"{args.model_dir}: not a directory")
    if args.project_id is not None:
        print("warning: --project_id ignored: cairn has no projects", file=sys.stderr)
    client = auth_store.connect(args)
    try:
        answer = client.submit_experiment(
            config,
            args.model_dir,
            activate=not args.paused,
            template=args.template,
            includes=args.includes,
        )
    except ApiError as exc:
        if exc.status in (400, 413) and exc.path not in ("code", "template"):
            print(f"error: invalid experiment config {args.config_file}:", file=sys.stderr)
            errors = exc.errors or [(exc.path or "<config>", str(exc))]
            for where, message in errors:
                print(f"  {where or '<config>'}: {message}", file=sys.stderr)
            return 1
        raise
    exp_id = int(answer["id"])
    warnings = answer.get("warnings") or []
    for warning in warnings:
        print(f"warning: {warning.get('path')}: {warning.get('message')}", file=sys.stderr)
    if not args.follow:
        return print_result(
            args, {"id": exp_id, "warnings": warnings}, f"created experiment {exp_id}"
        )
    if not wants_json(args):
        print(f"created experiment {exp_id}; following it", flush=True)
    final = follow(client, exp_id, FOLLOW_INTERVAL, progress=True)
    return finish(args, final)


def _max_trials(exp: dict[str, Any]) -> int:
    given = exp.get("max_trials")
    if given is None:
        searcher = (exp.get("config") or {}).get("searcher") or {}
        given = searcher.get("max_trials")
        if given is None and searcher.get("name") == "single":
            given = 1
    return max(int(given or 0), len(exp.get("trials") or []))


def _best_note(exp: dict[str, Any]) -> str:
    metric = exp.get("searcher_metric") or (
        ((exp.get("config") or {}).get("searcher") or {}).get("metric")
    )
    best = exp.get("best_metric")
    if best is None:
        return ""
    return f"best {metric or 'metric'} {cell(best)}"


def follow(client: Client, exp_id: int, interval: float, *, progress: bool) -> dict[str, Any]:
    """Polls the experiment until it is terminal, drawing trial progress on stderr."""
    bar = Progress("trials") if progress else None
    misses = 0
    try:
        while True:
            try:
                exp = client.get_experiment(exp_id)
            except UnreachableError:
                misses += 1  # ride out a master restart for a while
                if misses * interval > UNREACHABLE_GRACE:
                    raise
                time.sleep(interval)
                continue
            misses = 0
            state = str(exp.get("state"))
            if bar is not None:
                trials = exp.get("trials") or []
                done = sum(1 for t in trials if t.get("state") in lifecycle.TERMINAL)
                note = "  ".join(p for p in (state, _best_note(exp)) if p)
                total = _max_trials(exp)
                fraction = None
                if isinstance(exp.get("progress"), int | float) and total:
                    fraction = float(exp["progress"]) * len(trials) / total
                bar.update(done, total, note, fraction)
            if state in lifecycle.ENDED:
                return exp
            time.sleep(interval)
    finally:
        if bar is not None:
            bar.close()


def finish(args: argparse.Namespace, exp: dict[str, Any]) -> int:
    """Prints the summary of an ended experiment; 0 iff it COMPLETED."""
    state = exp.get("state")
    if wants_json(args):
        print_json(exp)
    else:
        trials = exp.get("trials") or []
        completed = sum(1 for t in trials if t.get("state") == "COMPLETED")
        line = f"experiment {exp.get('id')} {state}: {completed}/{len(trials)} trials completed"
        best = _best_note(exp)
        if best:
            line += f", {best}"
            if exp.get("best_trial_id"):
                line += f" (trial {exp['best_trial_id']})"
        print(line)
    return 0 if state == "COMPLETED" else 1


# --------------------------------------------------------------------------- reads


def cmd_list(args: argparse.Namespace) -> int:
    """Lists experiments (the caller's unarchived ones unless ``--all`` or ``--owner``)."""
    client = auth_store.connect(args)
    owner = args.owner
    if owner is None and not args.all:
        me = client.me()
        owner = me.get("username") if me.get("kind") == "user" else None
    if args.pages == "1" and args.limit is None:
        args.limit = 200
    data = client.list_experiments(
        limit=args.limit,
        offset=args.offset,
        state=args.state,
        owner=owner,
        archived="all" if args.all else None,
    )
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["ID", "NAME", "OWNER", "STATE", "TRIALS", "BEST", "PROGRESS", "SUBMITTED", "ARCHIVED"],
        [
            [
                e.get("id"),
                _name(e),
                e.get("owner"),
                e.get("state"),
                _trial_count(e),
                e.get("best_metric"),
                _percent(e.get("progress")),
                when(e.get("submitted_at")),
                e.get("archived"),
            ]
            for e in data["experiments"]
        ],
    )
    return 0


UNMANAGED_MARK = "[unmanaged]"
"""After the name of an experiment a script outside the cluster reports to (core_v2)."""


def _name(exp: dict[str, Any]) -> str:
    name = str(exp.get("name") or "")
    return f"{name} {UNMANAGED_MARK}".strip() if exp.get("unmanaged") else name


def _trial_count(exp: dict[str, Any]) -> str:
    started, limit = exp.get("num_trials") or 0, exp.get("max_trials")
    return f"{started}/{limit}" if limit else str(started)


def _percent(value: Any) -> str:
    return f"{float(value) * 100:.0f}%" if isinstance(value, int | float) else "-"


def cmd_describe(args: argparse.Namespace) -> int:
    """Shows each experiment of ``args.ids`` and its trials (as one JSON list with ``--json``
    and several ids)."""
    client = auth_store.connect(args)
    exps = [client.get_experiment(exp_id, at=args.at) for exp_id in args.ids]
    if args.outdir is not None:
        args.outdir.mkdir(parents=True, exist_ok=True)
        for exp in exps:
            path = args.outdir / f"experiment-{exp.get('id')}.json"
            path.write_text(json.dumps(exp, indent=2, default=str) + "\n")
    if wants_json(args):
        print_json(exps[0] if len(exps) == 1 else exps)
        return 0
    for index, exp in enumerate(exps):
        if index:
            print()
        describe_one(exp, metrics=args.metrics)
    return 0


def describe_one(exp: dict[str, Any], *, metrics: bool = False) -> None:
    """Prints one experiment's fields, trials and lineage."""
    searcher = (exp.get("config") or {}).get("searcher") or {}
    fields(
        [
            ("id", exp.get("id")),
            ("name", exp.get("name") or (exp.get("config") or {}).get("name")),
            ("description", exp.get("description")),
            ("owner", exp.get("owner")),
            ("state", exp.get("state")),
            ("archived", exp.get("archived")),
            *(
                [("unmanaged", f"yes (external id {exp.get('external_id')})")]
                if exp.get("unmanaged")
                else []
            ),
            ("searcher", searcher.get("name")),
            ("metric", exp.get("searcher_metric") or searcher.get("metric")),
            ("trials", exp.get("num_trials", len(exp.get("trials") or []))),
            ("best trial", exp.get("best_trial_id")),
            ("best metric", exp.get("best_metric")),
            ("submitted", when(exp.get("submitted_at"))),
            ("ended", when(exp.get("ended_at"))),
            *([("as of position", exp["at"])] if exp.get("at") is not None else []),
        ]
    )
    trials = exp.get("trials") or []
    if trials:
        print()
        trial_rows(trials)
    if metrics and trials:
        print()
        table(
            ["TRIAL", "STEPS", "LATEST VALIDATION"],
            [
                [t.get("trial_id"), t.get("steps_completed"), t.get("latest_validation")]
                for t in trials
            ],
        )
    lineage = exp.get("lineage") or []
    if lineage:
        print()
        lineage_rows(lineage)


def _change_text(change: dict[str, Any]) -> str:
    parts = []
    for name, step in sorted(change.items()):
        old, new = (step.get("from"), step.get("to")) if isinstance(step, dict) else (None, step)
        parts.append(f"{name} {_short(old)}->{_short(new)}")
    return ", ".join(parts) or "(same hyperparameters)"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def lineage_rows(lineage: list[dict[str, Any]]) -> None:
    """Prints which trial each cloned trial came from, at which round, with which change."""
    table(
        ["trial", "parent", "round", "warm start", "change"],
        [
            [
                row.get("trial_id"),
                row.get("parent_trial_id") or "-",
                row.get("round") if row.get("round") is not None else "-",
                (
                    f"{row['warm_start_checkpoint'][:8]} @{row.get('warm_start_steps', 0)}"
                    if row.get("warm_start_checkpoint")
                    else "(none)"
                ),
                _change_text(row.get("change") or {}),
            ]
            for row in lineage
        ],
    )


def cmd_list_trials(args: argparse.Namespace) -> int:
    """Lists an experiment's trials."""
    limit = args.limit if args.limit is not None else (200 if args.pages == "1" else None)
    data = auth_store.connect(args).list_trials(args.id, at=args.at)
    data["trials"] = data["trials"][args.offset : None if limit is None else args.offset + limit]
    if wants_json(args):
        print_json(data)
    else:
        trial_rows(data["trials"])
    return 0


def cmd_list_checkpoints(args: argparse.Namespace) -> int:
    """Lists an experiment's checkpoints, best first (``--best N``: only N)."""
    if args.best is not None and args.best < 1:
        raise UsageError("--best must be at least 1")
    data = auth_store.connect(args).list_checkpoints(args.id, limit=args.best, sort_by="metric")
    if wants_json(args):
        print_json(data)
        return 0
    checkpoint_rows(data["checkpoints"])
    return 0


def checkpoint_rows(checkpoints: list[dict[str, Any]]) -> None:
    """Prints checkpoints as a table."""
    table(
        ["UUID", "TRIAL", "STEPS", "STATE", "METRIC", "REPORTED"],
        [
            [
                c.get("uuid"),
                c.get("trial_id"),
                c.get("steps_completed"),
                c.get("state"),
                c.get("searcher_metric"),
                when(c.get("reported_at")),
            ]
            for c in checkpoints
        ],
    )


def cmd_logs(args: argparse.Namespace) -> int:
    """Prints (or follows) the logs of the experiment's first trial."""
    client = auth_store.connect(args)
    exp = client.get_experiment(args.id)
    trials = sorted(exp.get("trials") or [], key=lambda t: (t.get("seq") or 0, t["trial_id"]))
    if not trials:
        raise CairnError(f"experiment {args.id} has no trials yet")
    return print_logs(client, int(trials[0]["trial_id"]), args)


# --------------------------------------------------------------------------- control


def cmd_action(args: argparse.Namespace) -> int:
    """pause / activate / cancel / kill / archive / unarchive."""
    result = auth_store.connect(args).experiment_action(args.id, args.action)
    if wants_json(args):
        print_json(result)
        return 0
    if "archived" in result:
        verb = "archived" if result.get("archived") else "unarchived"
        already = "" if result.get("changed", True) else " (already)"
        print(f"experiment {args.id} {verb}{already}")
    else:
        already = "" if result.get("changed", True) else " (unchanged)"
        print(f"experiment {args.id}: {result.get('state')}{already}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Deletes a finished experiment (asks first unless ``--yes``)."""
    if not confirmed(args, f"delete experiment {args.id} and all its checkpoints?"):
        return 1
    result = auth_store.connect(args).delete_experiment(args.id)
    return print_result(args, result, f"experiment {args.id}: {result.get('state')}")


def cmd_wait(args: argparse.Namespace) -> int:
    """Waits for the experiment to end; 0 iff it COMPLETED."""
    if args.polling_interval <= 0:
        raise UsageError("--polling-interval must be positive")
    client = auth_store.connect(args)
    final = follow(client, args.id, args.polling_interval, progress=False)
    return finish(args, final)
