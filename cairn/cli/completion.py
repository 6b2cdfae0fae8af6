"""``cairn completion bash|zsh``: the shell code that completes ``cairn``'s verbs and flags.

Add ``eval "$(cairn completion bash)"`` to ``~/.bashrc`` (``zsh`` likewise, to ``~/.zshrc``).
The completions come from the CLI's own parser through argcomplete, so every verb, alias and
flag completes as it parses.
"""

from __future__ import annotations

import argparse
from typing import Any

SHELLS = ("bash", "zsh")


def register(sub: Any) -> None:
    """Adds the ``completion`` verb."""
    completion = sub.add_parser("completion", help="print shell completion code (bash, zsh)")
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    completion.add_argument(
        "--prog", default="cairn", help="the command's name (default %(default)s)"
    )
    completion.set_defaults(handler=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    """Prints the completion code for ``args.shell``."""
    from argcomplete.shell_integration import shellcode

    print(shellcode([args.prog], shell=args.shell))
    return 0
