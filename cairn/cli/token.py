"""``cairn token``: list and revoke user tokens (as Determined's ``det token``).

A token comes from ``cairn user login`` and expires after the cluster's token lifetime
(30 days by default); ``revoke`` ends one at once, wherever it is used.
"""

from __future__ import annotations

import argparse
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import add_json_flag, print_json, table, wants_json, when


def register(sub: Any) -> None:
    """Adds the ``token`` verb group."""
    group = sub.add_parser("token", help="list and revoke user tokens")
    verbs = verb_group(group)

    ls = verbs.add_parser("list", aliases=["ls"], help="list your tokens (admins: anyone's)")
    ls.add_argument("--user", help="whose tokens (admin)")
    ls.add_argument("--all", action="store_true", help="every user's tokens (admin)")
    add_json_flag(ls)
    ls.set_defaults(handler=cmd_list)

    revoke = verbs.add_parser("revoke", help="revoke tokens by id")
    revoke.add_argument("token_ids", metavar="ID", type=int, nargs="+")
    add_json_flag(revoke)
    revoke.set_defaults(handler=cmd_revoke)


def cmd_list(args: argparse.Namespace) -> int:
    """Lists tokens: id, user, created, expires, and which one this CLI uses."""
    data = auth_store.connect(args).list_tokens(username=args.user, everyone=args.all)
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["ID", "USER", "CREATED", "EXPIRES", "CURRENT"],
        [
            [
                t.get("id"),
                t.get("username"),
                when(t.get("created_at")),
                when(t.get("expires_at")),
                "*" if t.get("current") else "",
            ]
            for t in data["tokens"]
        ],
    )
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    """Revokes each token named."""
    client = auth_store.connect(args)
    revoked = [client.revoke_token(token_id) for token_id in args.token_ids]
    if wants_json(args):
        print_json({"revoked": revoked})
    else:
        for item in revoked:
            print(f"revoked token {item.get('id')} of {item.get('username')}")
    return 0
