"""``cairn experiment`` verbs that read the config or change an experiment after submission:
``config``, ``continue``, ``download``, ``label add|remove`` and ``set description|name|
max-slots|priority|weight`` (added to the group by :mod:`cairn.cli.experiment`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.checkpoint import extract
from cairn.cli.output import add_json_flag, print_json, print_result, wants_json
from cairn.cli.trial import add_sort_args, rank_checkpoints, sort_choice
from cairn.errors import CairnError, UsageError


def add_verbs(verbs: Any) -> None:
    """Adds the verbs to the ``experiment`` group's subparsers."""
    from cairn.cli.workspace import experiment_move

    move = verbs.add_parser("move", help="move an experiment to a project of a workspace")
    move.add_argument("id", type=int)
    move.add_argument("workspace")
    move.add_argument("project")
    add_json_flag(move)
    move.set_defaults(handler=experiment_move)

    config = verbs.add_parser("config", help="print an experiment's config as YAML")
    config.add_argument("id", type=int)
    add_json_flag(config)
    config.set_defaults(handler=cmd_config)

    cont = verbs.add_parser(
        "continue",
        help="continue an ended experiment: its single trial, or a search's unfinished "
        "trials, from their latest checkpoints",
    )
    cont.add_argument("id", type=int)
    cont.add_argument(
        "--config",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a config field, e.g. hyperparameters.steps=200 (repeatable; only "
        "hyperparameters, searcher.max_length and max_restarts may change, of a search only "
        "max_restarts)",
    )
    cont.add_argument(
        "--config-file", type=Path, help="a partial config YAML merged over the experiment's"
    )
    cont.add_argument(
        "-f",
        "--follow",
        "--follow-first-trial",
        dest="follow",
        action="store_true",
        help="follow it until it ends again",
    )
    add_json_flag(cont)
    cont.set_defaults(handler=cmd_continue)

    download = verbs.add_parser("download", help="download an experiment's best checkpoints")
    download.add_argument("id", type=int)
    download.add_argument(
        "--top-n", type=int, default=1, metavar="N", help="the N best (default %(default)s)"
    )
    download.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        default=Path("checkpoints"),
        help="each goes to DIR/<uuid> (default ./checkpoints)",
    )
    add_sort_args(download)
    download.add_argument(
        "-q", "--quiet", action="store_true", help="only print the checkpoints' paths"
    )
    add_json_flag(download)
    download.set_defaults(handler=cmd_download)

    label = verbs.add_parser("label", help="add or remove an experiment's labels")
    label_verbs = verb_group(label)
    for action, help_text in (("add", "add a label"), ("remove", "remove a label")):
        p = label_verbs.add_parser(action, help=help_text)
        p.add_argument("id", type=int)
        p.add_argument("label")
        add_json_flag(p)
        p.set_defaults(handler=cmd_label, label_action=action)

    setter = verbs.add_parser("set", help="change an experiment's name, description or resources")
    set_verbs = verb_group(setter, metavar="FIELD")
    for field, help_text in SETTABLE.items():
        p = set_verbs.add_parser(field, help=help_text)
        p.add_argument("id", type=int)
        p.add_argument("value", metavar=field.upper().replace("-", "_"))
        add_json_flag(p)
        p.set_defaults(handler=cmd_set, field=field)


SETTABLE = {
    "description": "set the description",
    "name": "set the name",
    "max-slots": "cap the slots its trials hold together (a number, or 'none' for no cap)",
    "priority": "set its scheduling priority (1 first .. 99 last)",
    "weight": "set its fair-share weight (a positive number)",
}


def cmd_config(args: argparse.Namespace) -> int:
    """Prints the experiment's config (with every later change applied) as YAML."""
    from events.domain.config import dump_yaml

    config = auth_store.connect(args).get_experiment(args.id).get("config") or {}
    if wants_json(args):
        print_json(config)
    else:
        print(dump_yaml(config), end="")
    return 0


def _partial_config(args: argparse.Namespace) -> dict[str, Any]:
    from events.domain.config import ConfigError, apply_overrides, load_yaml

    doc: Any = {}
    try:
        if args.config_file is not None:
            try:
                text = args.config_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise UsageError(f"cannot read {args.config_file}: {exc.strerror or exc}") from None
            doc = load_yaml(text, source=str(args.config_file)) or {}
            if not isinstance(doc, dict):
                raise UsageError(f"{args.config_file}: a config must be a mapping")
        return apply_overrides(doc, args.overrides)
    except ConfigError as exc:
        problems = "; ".join(f"{where}: {message}" for where, message in exc.errors)
        raise UsageError(f"invalid config change: {problems}") from None


def cmd_continue(args: argparse.Namespace) -> int:
    """Continues an ended experiment; with ``-f`` follows it to its new end."""
    from cairn.cli.experiment import FOLLOW_INTERVAL, finish, follow

    client = auth_store.connect(args)
    result = client.continue_experiment(args.id, _partial_config(args))
    if args.follow:
        if not wants_json(args):
            print(f"continued experiment {args.id}; following it", flush=True)
        return finish(args, follow(client, args.id, FOLLOW_INTERVAL, progress=True))
    if wants_json(args):
        print_json(result)
    else:
        latest = result.get("latest_checkpoints") or {
            str(result.get("trial_id")): result.get("latest_checkpoint")
        }
        for trial_id, checkpoint in latest.items():
            start = checkpoint or "the start (no checkpoint)"
            print(f"continued experiment {args.id}: trial {trial_id} from {start}")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    """Downloads the experiment's N best checkpoints, each to ``DIR/<uuid>``."""
    if args.top_n < 1:
        raise UsageError("--top-n must be at least 1")
    client = auth_store.connect(args)
    sort_by, smaller = sort_choice(args)
    if sort_by is None:
        best = client.list_checkpoints(args.id, limit=args.top_n, sort_by="metric")["checkpoints"]
    else:
        every = client.list_checkpoints(args.id, sort_by="steps")["checkpoints"]
        best = rank_checkpoints(every, sort_by, bool(smaller))[: args.top_n]
    if not best:
        raise CairnError(f"experiment {args.id} has no checkpoints to download")
    done = []
    for ckpt in best:
        uuid = str(ckpt["uuid"])
        target = args.output_dir / uuid
        files = extract(client.download_checkpoint(uuid), target)
        done.append({"uuid": uuid, "path": str(target.resolve()), "files": files})
        if args.quiet:
            print(target.resolve())
        elif not wants_json(args):
            metric = ckpt.get("searcher_metric")
            print(f"checkpoint {uuid} (metric {metric}) downloaded to {target}")
    if wants_json(args):
        print_json({"experiment_id": args.id, "checkpoints": done})
    return 0


def cmd_label(args: argparse.Namespace) -> int:
    """Adds or removes one label."""
    key = "add_labels" if args.label_action == "add" else "remove_labels"
    result = auth_store.connect(args).patch_experiment(args.id, {key: [args.label]})
    labels = ", ".join(result.get("labels") or []) or "-"
    note = "" if result.get("changed") else " (unchanged)"
    return print_result(args, result, f"experiment {args.id} labels: {labels}{note}")


def _set_body(field: str, raw: str) -> dict[str, Any]:
    if field in ("name", "description"):
        return {field: raw}
    try:
        if field == "max-slots":
            value: int | float | None = None if raw.lower() == "none" else int(raw)
            return {"resources": {"max_slots": value}}
        if field == "priority":
            return {"resources": {"priority": int(raw)}}
        return {"resources": {"weight": float(raw)}}
    except ValueError:
        kind = "a number" if field == "weight" else "a whole number"
        extra = " or 'none'" if field == "max-slots" else ""
        raise UsageError(f"{field} must be {kind}{extra}, got {raw!r}") from None


def cmd_set(args: argparse.Namespace) -> int:
    """Sets one field of the experiment."""
    result = auth_store.connect(args).patch_experiment(args.id, _set_body(args.field, args.value))
    key = args.field.replace("-", "_")
    note = "" if result.get("changed") else " (unchanged)"
    return print_result(args, result, f"experiment {args.id} {args.field}: {result.get(key)}{note}")
