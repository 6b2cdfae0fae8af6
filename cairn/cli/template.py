"""``cairn template``: list, describe, set and remove config templates.

A template is a partial experiment config; ``cairn experiment create --template NAME`` merges
the experiment's config over it (the experiment's values win).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import add_json_flag, print_json, print_result, table, wants_json, when
from cairn.errors import UsageError


def register(sub: Any) -> None:
    """Adds the ``template`` verb group."""
    group = sub.add_parser("template", aliases=["tpl"], help="manage config templates")
    verbs = verb_group(group, default_verb="list")

    ls = verbs.add_parser("list", aliases=["ls"], help="list templates")
    ls.add_argument("-d", "--details", action="store_true", help="show each template's config")
    add_json_flag(ls)
    ls.set_defaults(handler=cmd_list)

    describe = verbs.add_parser("describe", help="print a template's config as YAML")
    describe.add_argument("name")
    add_json_flag(describe)
    describe.set_defaults(handler=cmd_describe)

    setter = verbs.add_parser("set", help="create or replace a template from a YAML file")
    setter.add_argument("name")
    setter.add_argument("template_file", metavar="FILE", type=Path, help="partial config YAML")
    add_json_flag(setter)
    setter.set_defaults(handler=cmd_set)

    create = verbs.add_parser("create", help="create a template from a YAML file (not replace)")
    create.add_argument("name", metavar="template_name")
    create.add_argument("template_file", metavar="FILE", type=Path, help="partial config YAML")
    create.add_argument(
        "--workspace", "-w", help="accepted; templates are shared by the whole cluster"
    )
    add_json_flag(create)
    create.set_defaults(handler=cmd_set, must_be="new")

    set_value = verbs.add_parser("set-value", help="change a template's attributes")
    value_verbs = verb_group(set_value, metavar="ATTRIBUTE")
    value_config = value_verbs.add_parser("config", help="replace an existing template's config")
    value_config.add_argument("name", metavar="template_name")
    value_config.add_argument("template_file", metavar="FILE", type=Path, help="config YAML")
    add_json_flag(value_config)
    value_config.set_defaults(handler=cmd_set, must_be="existing")

    remove = verbs.add_parser("remove", aliases=["rm"], help="remove a template")
    remove.add_argument("name")
    add_json_flag(remove)
    remove.set_defaults(handler=cmd_remove)


def cmd_list(args: argparse.Namespace) -> int:
    """Lists templates (``-d``: with their configs)."""
    from events.domain.config import dump_yaml

    data = auth_store.connect(args).list_templates()
    if wants_json(args):
        print_json(data)
        return 0
    templates = data.get("templates") or []
    if args.details:
        for tpl in templates:
            print(f"{tpl.get('name')} (owner {tpl.get('owner')}):")
            for line in dump_yaml(tpl.get("config") or {}).splitlines():
                print(f"  {line}")
        return 0
    table(
        ["NAME", "OWNER", "UPDATED"],
        [[t.get("name"), t.get("owner"), when(t.get("updated_at"))] for t in templates],
    )
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    """Prints one template's config as YAML."""
    from events.domain.config import dump_yaml

    template = auth_store.connect(args).get_template(args.name)
    if wants_json(args):
        print_json(template)
    else:
        print(dump_yaml(template.get("config") or {}), end="")
    return 0


def cmd_set(args: argparse.Namespace) -> int:
    """Creates or replaces a template from a YAML file (validated by the master)."""
    try:
        text = args.template_file.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {args.template_file}: {exc.strerror or exc}") from None
    client = auth_store.connect(args)
    must_be = getattr(args, "must_be", None)
    if must_be is not None:
        names = {t.get("name") for t in client.list_templates().get("templates") or []}
        if must_be == "new" and args.name in names:
            raise UsageError(f"template {args.name} exists: `template set-value config` changes it")
        if must_be == "existing" and args.name not in names:
            raise UsageError(f"no template {args.name}: `template create` makes one")
    result = client.set_template(args.name, text)
    verb = "created" if result.get("created") else "replaced"
    return print_result(args, result, f"template {args.name} {verb}")


def cmd_remove(args: argparse.Namespace) -> int:
    """Removes a template."""
    result = auth_store.connect(args).remove_template(args.name)
    return print_result(args, result, f"template {args.name} removed")
