"""``cairn checkpoint`` (alias ``c``): describe, download and delete checkpoints."""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import add_json_flag, confirmed, fields, print_json, wants_json, when
from cairn.errors import CairnError
from events.domain.archive import CHECKPOINT_LIMITS, extract_tar


def register(sub: Any) -> None:
    """Adds the ``checkpoint`` verb group."""
    group = sub.add_parser("checkpoint", aliases=["c"], help="inspect and download checkpoints")
    verbs = verb_group(group)

    describe = verbs.add_parser("describe", help="show a checkpoint")
    describe.add_argument("uuid")
    add_json_flag(describe)
    describe.set_defaults(handler=cmd_describe)

    download = verbs.add_parser("download", help="download and unpack a checkpoint")
    download.add_argument("uuid")
    download.add_argument(
        "-o", "--output-dir", type=Path, help="where to unpack it (default ./checkpoints/<uuid>)"
    )
    download.add_argument(
        "-q", "--quiet", action="store_true", help="only print the checkpoint's path"
    )
    download.add_argument(
        "--mode",
        choices=("auto", "direct", "master"),
        default="auto",
        help="accepted for Determined's CLI: cairn always downloads through the master",
    )
    add_json_flag(download)
    download.set_defaults(handler=cmd_download)

    delete = verbs.add_parser("delete", help="delete checkpoints of ended experiments")
    delete.add_argument(
        "uuids", nargs="+", metavar="UUID", help="one or more, also comma-separated"
    )
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_json_flag(delete)
    delete.set_defaults(handler=cmd_delete)


def cmd_describe(args: argparse.Namespace) -> int:
    """Shows one checkpoint."""
    ckpt = auth_store.connect(args).get_checkpoint(args.uuid)
    if wants_json(args):
        print_json(ckpt)
        return 0
    fields(
        [
            ("uuid", ckpt.get("uuid")),
            ("experiment", ckpt.get("experiment_id")),
            ("trial", ckpt.get("trial_id")),
            ("run", ckpt.get("run_id")),
            ("steps", ckpt.get("steps_completed")),
            ("state", ckpt.get("state")),
            ("searcher metric", ckpt.get("searcher_metric")),
            ("validation", ckpt.get("validation")),
            ("metadata", ckpt.get("metadata")),
            ("resources", ckpt.get("resources")),
            ("reported", when(ckpt.get("reported_at"))),
        ]
    )
    return 0


def extract(data: bytes, target: Path) -> list[str]:
    """Unpacks a tar.gz into ``target`` (nothing may land outside it, within the limits of a
    checkpoint); returns the files."""
    try:
        return extract_tar(data, target, limits=CHECKPOINT_LIMITS)
    except (tarfile.TarError, OSError) as exc:
        raise CairnError(f"cannot unpack the checkpoint into {target}: {exc}") from None


def cmd_download(args: argparse.Namespace) -> int:
    """Downloads a checkpoint and unpacks it."""
    target: Path = args.output_dir or Path("checkpoints") / args.uuid
    data = auth_store.connect(args).download_checkpoint(args.uuid)
    files = extract(data, target)
    if args.quiet:
        print(target.resolve())
    elif wants_json(args):
        print_json({"uuid": args.uuid, "path": str(target.resolve()), "files": files})
    else:
        print(f"checkpoint {args.uuid} downloaded to {target} ({len(files)} files)")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    """Asks the tracker to delete checkpoints (asks first unless ``--yes``)."""
    uuids = [part.strip() for given in args.uuids for part in given.split(",") if part.strip()]
    if not confirmed(args, f"delete {len(uuids)} checkpoint(s) and their files?"):
        return 1
    result = auth_store.connect(args).delete_checkpoints(uuids)
    if wants_json(args):
        print_json(result)
        return 0
    for uuid in result.get("deleting") or []:
        print(f"checkpoint {uuid}: deleting")
    for uuid in result.get("already_deleted") or []:
        print(f"checkpoint {uuid}: already deleted")
    return 0
