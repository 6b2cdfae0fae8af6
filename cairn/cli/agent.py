"""``cairn agent`` (alias ``a``) and ``cairn slot`` (alias ``s``): list, enable, disable; and
admins' ``cairn agent credentials`` / ``cairn agent revoke``."""

from __future__ import annotations

import argparse
from typing import Any

from cairn.cli import auth_store, verb_group
from cairn.cli.output import (
    add_at_flag,
    add_csv_flag,
    add_json_flag,
    print_json,
    print_result,
    table,
    wants_json,
    when,
)
from cairn.client import Client


def register(sub: Any) -> None:
    """Adds the ``agent`` and ``slot`` verb groups."""
    group = sub.add_parser("agent", aliases=["a"], help="list, enable and disable agents")
    verbs = verb_group(group, default_verb="list")
    ls = verbs.add_parser("list", aliases=["ls"], help="list agents and their slots")
    add_at_flag(ls)
    add_csv_flag(ls)
    add_json_flag(ls)
    ls.set_defaults(handler=cmd_agent_list)
    enable = verbs.add_parser("enable", help="let an agent take work again (admin)")
    add_agent_choice(enable)
    add_json_flag(enable)
    enable.set_defaults(handler=cmd_agent_enable, enabled=True)
    disable = verbs.add_parser("disable", help="stop scheduling on an agent (admin)")
    add_agent_choice(disable)
    add_csv_flag(disable)
    disable.add_argument(
        "--drain", action="store_true", help="let running work finish instead of preempting it"
    )
    add_json_flag(disable)
    disable.set_defaults(handler=cmd_agent_enable, enabled=False)
    creds = verbs.add_parser(
        "credentials", help="list the agents' credentials, live and revoked (admin)"
    )
    add_json_flag(creds)
    creds.set_defaults(handler=cmd_agent_credentials)
    revoke = verbs.add_parser(
        "revoke",
        help="revoke an agent's credential: it is refused and declared lost, and its id "
        "cannot join again (admin)",
    )
    revoke.add_argument("agent_id")
    add_json_flag(revoke)
    revoke.set_defaults(handler=cmd_agent_revoke)

    slots = sub.add_parser("slot", aliases=["s"], help="list, enable and disable slots")
    slot_verbs = verb_group(slots, default_verb="list")
    sls = slot_verbs.add_parser("list", aliases=["ls"], help="list every agent's slots")
    add_csv_flag(sls)
    add_json_flag(sls)
    sls.set_defaults(handler=cmd_slot_list)
    for action, help_text in (
        ("enable", "let a slot take work again (admin)"),
        ("disable", "stop scheduling on a slot (admin)"),
    ):
        p = slot_verbs.add_parser(action, help=help_text)
        p.add_argument("agent_id")
        p.add_argument("slot_id", help="the slot's id or name (see `cairn slot list`)")
        add_json_flag(p)
        p.set_defaults(handler=cmd_slot_enable, enabled=action == "enable")


def add_agent_choice(parser: argparse.ArgumentParser) -> None:
    """An agent id, or Determined's ``--all``."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("agent_id", nargs="?", help="the agent")
    which.add_argument("--all", action="store_true", help="every agent")


def cmd_agent_list(args: argparse.Namespace) -> int:
    """Lists the agents with their slot counts."""
    data = auth_store.connect(args).list_agents(at=args.at)
    if wants_json(args):
        print_json(data)
        return 0
    rows = []
    for agent in data["agents"]:
        slots = agent.get("slots") or []
        busy = sum(1 for s in slots if s.get("allocation_id"))
        enabled = sum(1 for s in slots if s.get("enabled"))
        rows.append(
            [
                agent.get("agent_id"),
                agent.get("resource_pool"),
                agent.get("hostname"),
                agent.get("state"),
                agent.get("enabled"),
                f"{busy}/{enabled}/{len(slots)}",
                when(agent.get("last_heartbeat")),
            ]
        )
    table(["AGENT", "POOL", "HOST", "STATE", "ENABLED", "SLOTS(busy/on/all)", "HEARTBEAT"], rows)
    return 0


def cmd_agent_enable(args: argparse.Namespace) -> int:
    """Enables or disables an agent (``--all``: every agent)."""
    client = auth_store.connect(args)
    ids = (
        [str(a["agent_id"]) for a in client.list_agents()["agents"]]
        if args.all
        else [args.agent_id]
    )
    results = []
    for agent_id in ids:
        result = client.set_agent_enabled(
            agent_id, args.enabled, drain=getattr(args, "drain", False)
        )
        results.append(result)
        if not wants_json(args):
            state = "enabled" if result.get("enabled", args.enabled) else "disabled"
            print(f"agent {agent_id} {state}")
    if wants_json(args):
        print_json(results[0] if len(results) == 1 and not args.all else results)
    return 0


def cmd_agent_credentials(args: argparse.Namespace) -> int:
    """Lists every agent credential (never the tokens themselves)."""
    data = auth_store.connect(args).list_agent_credentials()
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["AGENT", "ISSUED", "INCARNATION", "NATS USER", "REVOKED", "BY"],
        [
            [
                c.get("agent_id"),
                when(c.get("issued_at")),
                c.get("incarnation"),
                c.get("nats_user") or "-",
                when(c.get("revoked_at")) if c.get("revoked_at") else "-",
                c.get("revoked_by") or "-",
            ]
            for c in data["credentials"]
        ],
    )
    return 0


def cmd_agent_revoke(args: argparse.Namespace) -> int:
    """Revokes an agent's credential."""
    result = auth_store.connect(args).revoke_agent(args.agent_id)
    return print_result(
        args,
        result,
        f"agent {args.agent_id}'s credential revoked; it is declared lost once its "
        "heartbeats stop counting",
    )


def cmd_slot_list(args: argparse.Namespace) -> int:
    """Lists every agent's slots."""
    data = auth_store.connect(args).list_slots()
    if wants_json(args):
        print_json(data)
        return 0
    table(
        ["AGENT", "SLOT", "DEVICE", "NAME", "ENABLED", "DRAINING", "ALLOCATION"],
        [
            [
                s.get("agent_id"),
                s.get("slot_id"),
                s.get("device"),
                s.get("name"),
                s.get("enabled"),
                s.get("draining"),
                s.get("allocation_id"),
            ]
            for s in data["slots"]
        ],
    )
    return 0


def _slot_id(client: Client, agent_id: str, given: str) -> str:
    """The slot's id; a slot's name (``cpu-0``) is accepted too. Unknown ones pass through."""
    slots = [s for s in client.list_slots()["slots"] if s.get("agent_id") == agent_id]
    if any(s.get("slot_id") == given for s in slots):
        return given
    named = [s for s in slots if s.get("name") == given]
    return str(named[0]["slot_id"]) if len(named) == 1 else given


def cmd_slot_enable(args: argparse.Namespace) -> int:
    """Enables or disables one slot."""
    client = auth_store.connect(args)
    slot_id = _slot_id(client, args.agent_id, args.slot_id)
    result = client.set_slot_enabled(args.agent_id, slot_id, args.enabled)
    state = "enabled" if result.get("enabled", args.enabled) else "disabled"
    return print_result(args, result, f"slot {slot_id} of agent {args.agent_id} {state}")
