"""``python3 -m cairn.launch.torch_distributed [TORCHRUN_OPTIONS... --] COMMAND...``.

Runs ``torchrun`` once on this agent with ``--nnodes``/``--node_rank``/``--nproc_per_node``/
``--master_addr``/``--master_port`` from the gang the agent agreed on with the others (see
:mod:`cairn.launch`), so the trial's ranks span every agent of its gang. Each output line is
prefixed with its global rank (``[rank=3] ...``). ``torchrun`` does not restart ranks
(``--max_restarts 0``): one failing rank stops the others here and the launcher exits non-zero, and
the platform stops the gang's other agents and restarts the trial from its latest checkpoint.

``COMMAND`` is a Python script (``train.py``) or a full command (``python3 train.py``).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cairn.launch._gang import Gang, LaunchError, run_child, script_command


def torchrun_argv(
    gang: Gang, overrides: Sequence[str], command: Sequence[str], log_dir: str | None = None
) -> list[str]:
    """The ``torchrun`` command line for this agent's part of ``gang`` (its per-rank log files
    in ``log_dir``; the ranks' output also goes to the console, prefixed)."""
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(gang.nnodes),
        "--node_rank",
        str(gang.node_rank),
        "--nproc_per_node",
        str(gang.nproc_per_node),
        "--master_addr",
        gang.master_addr,
        "--master_port",
        str(gang.master_port),
        "--max_restarts",
        "0",
        "--monitor_interval",
        "0.2",
        "--tee",
        "3",
        *(["--log_dir", log_dir] if log_dir else []),
        *overrides,
    ]
    if not command[0].endswith(".py"):
        argv.append("--no_python")  # a full command such as ``python3 train.py``
    return [*argv, *command]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns ``torchrun``'s exit status (2 for a usage error)."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, command = script_command(words)
        gang = Gang.from_env()
    except LaunchError as exc:
        print(f"cairn.launch.torch_distributed: {exc}", file=sys.stderr)
        return 2
    if command[0].endswith(".py") and not Path(command[0]).exists():
        print(f"cairn.launch.torch_distributed: no script {command[0]}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cairn-torchrun-") as logs:
        return run_child(torchrun_argv(gang, overrides, command, logs), gang.rank_offset)


if __name__ == "__main__":
    sys.exit(main())
