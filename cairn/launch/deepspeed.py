"""``python3 -m cairn.launch.deepspeed [DEEPSPEED_OPTIONS... --] COMMAND...``.

Runs DeepSpeed's own launcher (``deepspeed``) over this agent's slots: one process per slot,
``--master_addr``/``--master_port`` from the agent, each worker started through
:mod:`cairn.launch.wrap_rank` (``RANK`` as DeepSpeed sets it) so its lines carry its rank, as
Determined's ``determined.launch.deepspeed`` does. Workers build their context with
``det.core.DistributedContext.from_deepspeed()`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...).

A gang spanning several agents is refused (exit 2): DeepSpeed reaches its other hosts with
``pdsh``/SSH, which a cairn agent does not provide; ``cairn.launch.torch_distributed`` spans
agents. DeepSpeed is an opt-in extra (``make deepspeed``; ``make test-deepspeed`` runs a trial
through this launcher on two CPU slots): without it this launcher exits 2 and says so.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from cairn.launch._gang import Gang, one_agent_main, script_command

MISSING = (
    "deepspeed is not installed (an opt-in extra: `make deepspeed` installs it), "
    "or use cairn.launch.torch_distributed"
)


def deepspeed_runner() -> str | None:
    """The ``deepspeed`` command beside this Python, else on ``PATH`` (``None`` without it)."""
    if importlib.util.find_spec("deepspeed") is None:
        return None
    sibling = Path(sys.executable).parent / "deepspeed"
    return str(sibling) if sibling.exists() else shutil.which("deepspeed")


def worker_command(command: Sequence[str]) -> list[str]:
    """``command`` wrapped so each of its lines is prefixed with the worker's ``RANK``
    (a bare ``train.py`` runs with this Python)."""
    words = list(command)
    if words[0].endswith(".py"):
        words = [sys.executable, *words]
    return [sys.executable, "-m", "cairn.launch.wrap_rank", "RANK", "--", *words]


def deepspeed_argv(gang: Gang, overrides: Sequence[str], command: Sequence[str]) -> list[str]:
    """The ``deepspeed`` command line for this agent's ranks."""
    return [
        deepspeed_runner() or "deepspeed",
        "--num_nodes",
        "1",
        "--num_gpus",
        str(gang.nproc_per_node),
        "--master_addr",
        gang.master_addr,
        "--master_port",
        str(gang.master_port),
        "--no_python",
        "--no_local_rank",
        *overrides,
        *worker_command(command),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns ``deepspeed``'s exit status (2: usage error or no DeepSpeed)."""
    return one_agent_main(
        "cairn.launch.deepspeed",
        "DeepSpeed",
        deepspeed_runner,
        MISSING,
        script_command,
        deepspeed_argv,
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
