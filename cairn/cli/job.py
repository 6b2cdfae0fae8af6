"""``cairn job`` (alias ``j``): the job queue, trials and tasks in the scheduler's order.

``cairn job list [-p POOL]`` prints the jobs that hold slots (in the order they were placed)
and then the waiting ones, first to be placed first (Determined's ``det job list``). Another
user's job shows its owner, priority and slots, not its id or name (admins see everything).
"""

from __future__ import annotations

import argparse
from typing import Any

from cairn.cli import auth_store
from cairn.cli.output import add_json_flag, print_json, table, wants_json, when


def register(sub: Any) -> None:
    """Adds the ``job`` verb group."""
    group = sub.add_parser("job", aliases=["j"], help="show the job queue")
    group.set_defaults(group_parser=group, default_verb="list")
    verbs = group.add_subparsers(metavar="VERB")
    listing = verbs.add_parser("list", aliases=["ls"], help="list the queued and running jobs")
    listing.add_argument("-p", "--resource-pool", metavar="POOL", help="only this pool's jobs")
    add_json_flag(listing)
    listing.set_defaults(handler=job_list)


def job_list(args: argparse.Namespace) -> int:
    """Prints the queue (``--json``: the API's answer)."""
    query = {"resource_pool": args.resource_pool} if args.resource_pool else {}
    answer = auth_store.connect(args).get("/job-queues", **query)
    if wants_json(args):
        print_json(answer)
        return 0
    jobs = answer.get("jobs") or []
    slurm = any(j.get("slurm") for j in jobs)
    table(
        ["#", "id", "type", "name", "priority", "slots", "pool", "owner", "state", "submitted"]
        + (["slurm job"] if slurm else []),
        [
            [
                j["position"],
                j.get("job_id"),
                j["kind"],
                j.get("name"),
                j["priority"],
                j["slots"],
                j["resource_pool"],
                j["owner"],
                j["state"],
                when(j.get("submitted_at")),
            ]
            + ([_slurm_cell(j.get("slurm"))] if slurm else [])
            for j in jobs
        ],
    )
    return 0


def _slurm_cell(job: dict[str, str] | None) -> str:
    """``4021 PENDING (Resources)``, or empty for a job of no Slurm pool."""
    if not job:
        return ""
    reason = f" ({job['reason']})" if job.get("reason") else ""
    return f"{job['job_id']} {job['state']}{reason}"
