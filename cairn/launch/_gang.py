"""What the agent tells a launcher about its part of the gang, and the launchers' shared parts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from events import settings


class LaunchError(Exception):
    """The launcher cannot start the ranks (bad arguments, missing framework)."""


@dataclass(frozen=True)
class Gang:
    """This agent's part of a trial's gang.

    Attributes:
        nnodes: agents in the gang.
        node_rank: this agent's index among them (0 is the chief's).
        nproc_per_node: ranks (slots) on this agent.
        world_size: ranks in the gang.
        rank_offset: global rank of this agent's first rank.
        master_addr: the chief agent's address.
        master_port: the port the chief's rendezvous store listens on.
    """

    nnodes: int
    node_rank: int
    nproc_per_node: int
    world_size: int
    rank_offset: int
    master_addr: str
    master_port: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Gang:
        """Reads the gang from the agent's variables (one rank on one node when unset).

        Raises:
            LaunchError: a variable is not an integer.
        """
        env = os.environ if environ is None else environ

        def number(name: str, default: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                return int(raw)
            except ValueError:
                raise LaunchError(f"{name}={raw!r} is not an integer") from None

        try:
            nnodes = max(settings.NUM_NODES.get(env) or 1, 1)
            node_rank = settings.NODE_RANK.get(env)
            rank_offset = settings.RANK_OFFSET.get(env)
        except settings.SettingError as exc:
            raise LaunchError(str(exc)) from None
        nproc = max(number("LOCAL_WORLD_SIZE", 1), 1)
        return cls(
            nnodes=nnodes,
            node_rank=node_rank,
            nproc_per_node=nproc,
            world_size=max(number("WORLD_SIZE", nproc * nnodes), 1),
            rank_offset=rank_offset,
            master_addr=env.get("MASTER_ADDR") or "127.0.0.1",
            master_port=number("MASTER_PORT", 29400),
        )


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(launcher_overrides, command)``: with ``--`` the words before it override the
    launcher's own options (as in Determined), without it every word is the command.

    Raises:
        LaunchError: no command.
    """
    words = list(argv)
    if "--" in words:
        cut = words.index("--")
        overrides, command = words[:cut], words[cut + 1 :]
    else:
        overrides, command = [], words
    if not command:
        raise LaunchError(
            "no training command given (e.g. `... torch_distributed python3 train.py`)"
        )
    return overrides, command


def script_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """:func:`split_command` for a launcher that runs a Core API script, not a Trial class.

    Raises:
        LaunchError: no command, or ``--trial``.
    """
    overrides, command = split_command(argv)
    if command[0] == "--trial":
        raise LaunchError("--trial (a Trial class) is not supported; give a Core API script")
    return overrides, command


def one_agent_gang(framework: str, runner: Callable[[], str | None], missing: str) -> Gang:
    """This agent's part of the gang, for a launcher whose ``framework`` runs on one agent only.

    Args:
        framework: the framework's name, as the error says it.
        runner: finds the framework's runner (``None`` when it is not installed).
        missing: the error when it is not.

    Raises:
        LaunchError: the runner is missing, or the gang spans several agents.
    """
    gang = Gang.from_env()
    if runner() is None:
        raise LaunchError(missing)
    if gang.nnodes > 1:
        raise LaunchError(
            f"{framework} runs on one agent here (slots_per_trial at most one agent's slots); "
            "use cairn.launch.torch_distributed across agents"
        )
    return gang


def one_agent_main(
    name: str,
    framework: str,
    runner: Callable[[], str | None],
    missing: str,
    split: Callable[[Sequence[str]], tuple[list[str], list[str]]],
    runner_argv: Callable[[Gang, Sequence[str], Sequence[str]], list[str]],
    argv: Sequence[str] | None,
) -> int:
    """The entry point of a launcher whose ``framework`` runs on one agent only.

    Args:
        name: the launcher's module, as its usage errors begin.
        framework: the framework's name (see :func:`one_agent_gang`).
        runner: finds the framework's runner (``None`` when it is not installed).
        missing: the error when it is not.
        split: splits the launcher's arguments into the runner's overrides and the command.
        runner_argv: the runner's command line for this agent's part of the gang.
        argv: the launcher's arguments (``None``: ``sys.argv[1:]``).

    Returns:
        The runner's exit status (2: a usage error, or the framework is not installed).
    """
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides, command = split(words)
        gang = one_agent_gang(framework, runner, missing)
    except LaunchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    return run_child(runner_argv(gang, overrides, command), gang.rank_offset)


_PREFIX = re.compile(r"^\[[A-Za-z_]+(\d+)\]:")
_HOROVOD_PREFIX = re.compile(r"^\[(?:\d+,)?(\d+)\]<std(?:out|err)>:")


def relabel(line: str, rank_offset: int) -> str:
    """Rewrites ``torchrun``'s local prefix ``[default3]:`` as the global ``[rank=N] `` (and
    ``horovodrun``'s ``[3]<stdout>:`` or ``[1,3]<stdout>:``, whose rank is global already)."""
    match = _PREFIX.match(line)
    if match is not None:
        return f"[rank={rank_offset + int(match.group(1))}] {line[match.end() :]}"
    match = _HOROVOD_PREFIX.match(line)
    if match is not None:
        return f"[rank={int(match.group(1))}] {line[match.end() :]}"
    return line


def _pump(src: IO[str], dst: IO[str], rank_offset: int) -> None:
    for line in src:
        dst.write(relabel(line, rank_offset))
        dst.flush()


def run_child(argv: list[str], rank_offset: int) -> int:
    """Runs ``argv`` with relabelled output; SIGTERM/SIGINT are passed on to it.

    Returns:
        Its exit status (``128 + N`` when signal N ended it).
    """
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    assert proc.stdout is not None and proc.stderr is not None
    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, rank_offset), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, rank_offset), daemon=True),
    ]
    for pump in pumps:
        pump.start()

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = proc.wait()
    for pump in pumps:
        pump.join(timeout=5.0)
    return 128 - code if code < 0 else code
