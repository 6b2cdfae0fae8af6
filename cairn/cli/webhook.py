"""``cairn webhook``: HTTP endpoints told when experiments, trials and tasks change state.

``webhook list|create NAME URL|edit ID --url URL|delete ID|test ID|signing-key ID``. A trigger
is ``experiment:STATE``, ``trial:STATE``, ``task:STATE`` or ``custom`` (the training code's
``ctx.alert``, for ``--mode specific`` webhooks); without ``--trigger`` a webhook fires when an
experiment completes or errors. See ``docs/webhooks.md``.
"""

from __future__ import annotations

import argparse
from typing import Any

from cairn.cli import add_verb, auth_store, verb_group
from cairn.cli.output import confirmed, print_json, print_result, table, wants_json, when
from cairn.errors import UsageError

KINDS = {
    "experiment": "EXPERIMENT_STATE_CHANGE",
    "trial": "TRIAL_STATE_CHANGE",
    "task": "TASK_STATE_CHANGE",
}
DEFAULT_TRIGGERS = ("experiment:COMPLETED", "experiment:ERROR")


def register(sub: Any) -> None:
    """Adds the ``webhook`` verb group."""
    group = sub.add_parser("webhook", help="webhooks: HTTP endpoints told what happens")
    verbs = verb_group(group, default_verb="list")
    add_verb(verbs, "list", wh_list, "list the webhooks you can see", aliases=("ls",))
    create = add_verb(verbs, "create", wh_create, "create a webhook", "name", "url")
    create.add_argument(
        "--trigger",
        action="append",
        metavar="KIND:STATE",
        help="experiment:STATE, trial:STATE, task:STATE or custom (repeatable; default: "
        + ", ".join(DEFAULT_TRIGGERS)
        + ")",
    )
    create.add_argument("--type", choices=("default", "slack"), default="default")
    create.add_argument(
        "--workspace", help="the workspace it belongs to (default: global, admins only)"
    )
    create.add_argument(
        "--mode",
        choices=("workspace", "specific"),
        default="workspace",
        help="specific: only experiments whose config names it (integrations.webhooks)",
    )
    edit = add_verb(verbs, "edit", wh_edit, "point a webhook at another URL", "id")
    edit.add_argument("--url", required=True)
    delete = add_verb(verbs, "delete", wh_delete, "delete a webhook", "id")
    delete.add_argument("--yes", action="store_true", help="do not ask")
    add_verb(verbs, "test", wh_test, "send a webhook a test delivery now", "id")
    add_verb(
        verbs, "signing-key", wh_key, "show the key a webhook's deliveries are signed with", "id"
    )


def parse_trigger(text: str) -> dict[str, Any]:
    """``experiment:COMPLETED`` as the API's trigger (``custom``: an alert).

    Raises:
        UsageError: not one of the forms above.
    """
    if text.strip().lower() == "custom":
        return {"trigger_type": "CUSTOM", "condition": {}}
    kind, sep, state = text.partition(":")
    if not sep or kind.strip().lower() not in KINDS or not state.strip():
        raise UsageError(
            f"--trigger {text!r}: write experiment:STATE, trial:STATE, task:STATE or custom"
        )
    return {
        "trigger_type": KINDS[kind.strip().lower()],
        "condition": {"state": state.strip().upper()},
    }


def _trigger_text(trigger: dict[str, Any]) -> str:
    kind = str(trigger.get("trigger_type", ""))
    if kind == "CUSTOM":
        return "custom"
    short = next((k for k, v in KINDS.items() if v == kind), kind.lower())
    return f"{short}:{(trigger.get('condition') or {}).get('state', '')}"


def _id(args: argparse.Namespace) -> int:
    if not str(args.id).isdigit():
        raise UsageError(f"a webhook is named by its id (a number), got {args.id!r}")
    return int(args.id)


def wh_list(args: argparse.Namespace) -> int:
    """Lists the webhooks the caller may see, with how their deliveries went."""
    data = auth_store.connect(args).get("/webhooks")
    if wants_json(args):
        print_json(data)
        return 0
    rows = []
    for hook in data.get("webhooks") or []:
        record = hook.get("delivery") or {}
        last = record.get("last_status") or record.get("last_error") or ""
        rows.append(
            [
                hook.get("id"),
                hook.get("name"),
                hook.get("workspace") or "(global)",
                hook.get("webhook_type"),
                hook.get("mode"),
                ", ".join(_trigger_text(t) for t in hook.get("triggers") or []),
                hook.get("url"),
                f"{record.get('delivered', 0)}/{record.get('failed', 0)}/"
                f"{record.get('pending', 0)}",
                str(last)[:60],
                when(record.get("last_attempt_at")),
            ]
        )
    table(
        ["ID", "NAME", "WORKSPACE", "TYPE", "MODE", "TRIGGERS", "URL", "OK/FAILED/PENDING",
         "LAST", "LAST ATTEMPT"],
        rows,
    )  # fmt: skip
    return 0


def wh_create(args: argparse.Namespace) -> int:
    """Creates a webhook and prints its signing key."""
    body: dict[str, Any] = {
        "name": args.name,
        "url": args.url,
        "webhook_type": args.type,
        "mode": args.mode,
        "triggers": [parse_trigger(t) for t in args.trigger or DEFAULT_TRIGGERS],
    }
    if args.workspace:
        body["workspace"] = args.workspace
    made = auth_store.connect(args).post("/webhooks", body)
    return print_result(
        args,
        made,
        f"webhook {made.get('name')} created (id {made.get('id')}); "
        f"its deliveries are signed with key {made.get('signing_key')}",
    )


def wh_edit(args: argparse.Namespace) -> int:
    """Points a webhook at another URL."""
    done = auth_store.connect(args).call("PATCH", f"/webhooks/{_id(args)}", {"url": args.url})
    return print_result(args, done, f"webhook {done.get('id')} now posts to {done.get('url')}")


def wh_delete(args: argparse.Namespace) -> int:
    """Deletes a webhook (its pending deliveries are canceled)."""
    webhook_id = _id(args)
    if not confirmed(args, f"delete webhook {webhook_id}?"):
        return 1
    done = auth_store.connect(args).call("DELETE", f"/webhooks/{webhook_id}")
    return print_result(args, done, f"webhook {webhook_id} deleted")


def wh_test(args: argparse.Namespace) -> int:
    """Sends a test delivery; exits 1 when the receiver did not answer 2xx."""
    done = auth_store.connect(args).post(f"/webhooks/{_id(args)}/test", {})
    if done.get("ok"):
        print_result(
            args, done, f"webhook {done.get('id')}: the receiver answered {done.get('status')}"
        )
        return 0
    print_result(args, done, f"webhook {done.get('id')}: test delivery failed: {done.get('error')}")
    return 1


def wh_key(args: argparse.Namespace) -> int:
    """Prints a webhook's signing key."""
    done = auth_store.connect(args).get(f"/webhooks/{_id(args)}/signing-key")
    return print_result(args, done, str(done.get("signing_key")))
