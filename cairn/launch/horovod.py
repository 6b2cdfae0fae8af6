"""``python3 -m cairn.launch.horovod [HOROVODRUN_OPTIONS... --] COMMAND...``.

Runs ``horovodrun -np N -H localhost:N`` over this agent's slots, each output line prefixed
with its rank. A gang spanning several agents is refused (exit 2): Horovod reaches its other
hosts over SSH, which a cairn agent does not provide; ``cairn.launch.torch_distributed`` spans
agents. Horovod is an opt-in extra: 0.28.1 does not build against torch 2.13 as released (it
compiles as C++14 and torch's headers need C++17); ``make horovod`` builds it with the standard
raised (see the Makefile). Without Horovod installed this launcher exits 2 and says so.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from cairn.launch._gang import Gang, one_agent_main, split_command

MISSING = (
    "horovod is not installed: `make horovod` builds Horovod 0.28.1 for this torch "
    "(an opt-in extra); or use cairn.launch.torch_distributed"
)


def horovodrun() -> str | None:
    """The ``horovodrun`` beside this Python, else on ``PATH`` (``None`` without Horovod)."""
    if importlib.util.find_spec("horovod") is None:
        return None
    sibling = Path(sys.executable).parent / "horovodrun"
    return str(sibling) if sibling.exists() else shutil.which("horovodrun")


def horovodrun_argv(gang: Gang, overrides: Sequence[str], command: Sequence[str]) -> list[str]:
    """The ``horovodrun`` command line for a gang on one agent (several agents: one host per
    agent, reached over SSH by Horovod itself, which a cairn agent does not provide)."""
    hosts = f"localhost:{gang.nproc_per_node}"
    return [
        horovodrun() or "horovodrun",
        "-np",
        str(gang.world_size),
        "-H",
        hosts,
        *overrides,
        *command,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns ``horovodrun``'s exit status (2: usage error or no Horovod)."""
    return one_agent_main(
        "cairn.launch.horovod", "Horovod", horovodrun, MISSING, split_command, horovodrun_argv, argv
    )


if __name__ == "__main__":
    sys.exit(main())
