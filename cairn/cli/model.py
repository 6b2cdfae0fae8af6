"""``cairn model`` (alias ``m``): the model registry, with Determined's verbs and flags.

A model is a named collection of numbered versions, each a completed checkpoint; a checkpoint
registered as a version is kept until the version (or its model) is deleted.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import (
    add_json_flag,
    confirmed,
    fields,
    print_json,
    print_result,
    table,
    wants_json,
    when,
)
from cairn.errors import UsageError


def register(sub: Any) -> None:
    """Adds the ``model`` verb group."""
    group = sub.add_parser("model", aliases=["m"], help="manage the model registry")
    verbs = verb_group(group, default_verb="list")

    ls = verbs.add_parser("list", aliases=["ls"], help="list models")
    ls.add_argument("-w", "--workspace-names", help="only these workspaces (comma-separated)")
    ls.add_argument(
        "--sort-by",
        choices=("name", "description", "creation_time", "last_updated_time"),
        default="last_updated_time",
        help="the field to sort by",
    )
    ls.add_argument("--order-by", choices=("asc", "desc"), default="asc", help="the order")
    add_json_flag(ls)
    ls.set_defaults(handler=cmd_list)

    create = verbs.add_parser("create", help="create a model")
    create.add_argument("name")
    create.add_argument("-w", "--workspace-name", help="its workspace (default: Uncategorized)")
    create.add_argument("--description", default="", help="what the model is")
    add_json_flag(create)
    create.set_defaults(handler=cmd_create)

    describe = verbs.add_parser("describe", help="show a model and one of its versions")
    describe.add_argument("name")
    describe.add_argument(
        "--version", type=int, default=-1, help="the version to show (-1, the default: latest)"
    )
    add_json_flag(describe)
    describe.set_defaults(handler=cmd_describe)

    versions = verbs.add_parser("list-versions", help="list a model's versions")
    versions.add_argument("name")
    add_json_flag(versions)
    versions.set_defaults(handler=cmd_list_versions)

    reg = verbs.add_parser("register-version", help="register a checkpoint as a new version")
    reg.add_argument("name")
    reg.add_argument("uuid", metavar="checkpoint_uuid")
    add_json_flag(reg)
    reg.set_defaults(handler=cmd_register_version)

    edit = verbs.add_parser("edit", help="change a model's name, description, labels or notes")
    edit.add_argument("name")
    edit.add_argument("--new-name", help="rename it")
    edit.add_argument("--description", help="a new description")
    edit.add_argument("--notes", help="new notes")
    edit.add_argument("--labels", help="comma-separated labels (replaces them; '' clears)")
    edit.add_argument("--metadata", help="a JSON object (replaces the metadata)")
    add_json_flag(edit)
    edit.set_defaults(handler=cmd_edit)

    for verb, archived in (("archive", True), ("unarchive", False)):
        action = verbs.add_parser(verb, help=f"{verb} a model")
        action.add_argument("name")
        add_json_flag(action)
        action.set_defaults(handler=cmd_archive, archived=archived)

    move = verbs.add_parser("move", help="move a model and its versions to another workspace")
    move.add_argument("name")
    move.add_argument("-w", "--workspace-name", required=True, help="the workspace it goes to")
    add_json_flag(move)
    move.set_defaults(handler=cmd_move)

    delete = verbs.add_parser("delete", help="delete a model and all its versions")
    delete.add_argument("name")
    delete.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    add_json_flag(delete)
    delete.set_defaults(handler=cmd_delete)


def _model_fields(model: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        ("id", model.get("id")),
        ("name", model.get("name")),
        ("description", model.get("description")),
        ("owner", model.get("username")),
        ("workspace", model.get("workspace")),
        ("archived", model.get("archived")),
        ("labels", ", ".join(model.get("labels") or [])),
        ("metadata", model.get("metadata") or {}),
        ("notes", model.get("notes")),
        ("versions", model.get("num_versions")),
        ("created", when(model.get("creation_time"))),
        ("updated", when(model.get("last_updated_time"))),
    ]


def _version_rows(versions: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for v in versions:
        ckpt = v.get("checkpoint") or {}
        rows.append(
            [
                v.get("version"),
                v.get("name"),
                ckpt.get("uuid"),
                ckpt.get("experiment_id"),
                ckpt.get("trial_id"),
                ckpt.get("state"),
                v.get("username"),
                when(v.get("creation_time")),
            ]
        )
    return rows


VERSION_HEADERS = ["VERSION", "NAME", "CHECKPOINT", "EXPERIMENT", "TRIAL", "STATE", "BY", "CREATED"]


def cmd_list(args: argparse.Namespace) -> int:
    """Lists models."""
    data = auth_store.connect(args).list_models(
        workspace_names=args.workspace_names, sort_by=args.sort_by, order_by=args.order_by
    )
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["ID", "NAME", "DESCRIPTION", "OWNER", "WORKSPACE", "VERSIONS", "ARCHIVED", "UPDATED"],
        [
            [
                m.get("id"),
                m.get("name"),
                m.get("description"),
                m.get("username"),
                m.get("workspace"),
                m.get("num_versions"),
                m.get("archived"),
                when(m.get("last_updated_time")),
            ]
            for m in data.get("models") or []
        ],
    )
    return 0


def cmd_create(args: argparse.Namespace) -> int:
    """Creates a model."""
    model = auth_store.connect(args).create_model(
        args.name, description=args.description, workspace_name=args.workspace_name
    )
    return print_result(args, model, f"model {model.get('name')!r} created (id {model.get('id')})")


def cmd_describe(args: argparse.Namespace) -> int:
    """Shows a model and one version (the latest unless ``--version``)."""
    client = auth_store.connect(args)
    model = client.get_model(args.name)
    version = None
    if model.get("num_versions") or args.version != -1:
        version = client.get_model_version(args.name, args.version)
    if wants_json(args):
        print_json({"model": model, "model_version": version})
        return 0
    fields(_model_fields(model))
    if version is not None:
        print()
        table(VERSION_HEADERS, _version_rows([version]))
    return 0


def cmd_list_versions(args: argparse.Namespace) -> int:
    """Lists a model's versions."""
    data = auth_store.connect(args).list_model_versions(args.name)
    if wants_json(args):
        print_json(data)
        return 0
    fields(_model_fields(data.get("model") or {}))
    print()
    table(VERSION_HEADERS, _version_rows(data.get("model_versions") or []))
    return 0


def cmd_register_version(args: argparse.Namespace) -> int:
    """Registers a checkpoint as a model's next version."""
    version = auth_store.connect(args).register_model_version(args.name, args.uuid)
    line = f"checkpoint {args.uuid} registered as version {version.get('version')} of {args.name!r}"
    return print_result(args, version, line)


def cmd_edit(args: argparse.Namespace) -> int:
    """Changes a model's fields."""
    changes: dict[str, Any] = {}
    if args.new_name is not None:
        changes["name"] = args.new_name
    if args.description is not None:
        changes["description"] = args.description
    if args.notes is not None:
        changes["notes"] = args.notes
    if args.labels is not None:
        changes["labels"] = [part.strip() for part in args.labels.split(",") if part.strip()]
    if args.metadata is not None:
        try:
            changes["metadata"] = json.loads(args.metadata)
        except ValueError as exc:
            raise UsageError(f"--metadata is not JSON: {exc}") from None
    if not changes:
        raise UsageError("nothing to change: give --new-name, --description, --notes, ...")
    model = auth_store.connect(args).patch_model(args.name, changes)
    return print_result(args, model, f"model {model.get('name')!r} changed")


def cmd_archive(args: argparse.Namespace) -> int:
    """Archives or unarchives a model."""
    model = auth_store.connect(args).set_model_archived(args.name, args.archived)
    state = "archived" if model.get("archived") else "unarchived"
    return print_result(args, model, f"model {model.get('name')!r} {state}")


def cmd_move(args: argparse.Namespace) -> int:
    """Moves a model to another workspace (Determined's ``det model move``)."""
    model = auth_store.connect(args).move_model(args.name, workspace_name=args.workspace_name)
    line = f"model {model.get('name')!r} is in workspace {model.get('workspace')!r}"
    return print_result(args, model, line)


def cmd_delete(args: argparse.Namespace) -> int:
    """Deletes a model and its versions (asks first unless ``--yes``)."""
    if not confirmed(args, f"delete model {args.name!r} and all its versions?"):
        return 1
    result = auth_store.connect(args).delete_model(args.name)
    return print_result(args, result, f"model {args.name!r} deleted")
