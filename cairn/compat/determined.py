"""``python -m cairn.compat.determined``: the opt-in to ``import determined`` outside a cluster.

``--install-path`` prints the directory holding cairn's ``determined`` package, for
``PYTHONPATH``::

    export PYTHONPATH="$PYTHONPATH:$(python -m cairn.compat.determined --install-path)"
    python3 train.py            # a Determined script, unchanged

It prints nothing and exits 1 when a real ``determined`` is importable (then that one is used,
and cairn's must stay off the path). ``--check`` says which ``determined`` an ``import`` would
load.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cairn.compat import install_path, real_determined_spec


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 done, 1 a real ``determined`` is installed)."""
    parser = argparse.ArgumentParser(
        prog="python -m cairn.compat.determined",
        description="Make `import determined` load cairn's mapping of Determined's API.",
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--install-path",
        action="store_true",
        help="print the directory to add to PYTHONPATH (exit 1 if a real determined is installed)",
    )
    what.add_argument(
        "--check", action="store_true", help="say which determined `import determined` would load"
    )
    args = parser.parse_args(argv)
    real = real_determined_spec()
    if args.check:
        if real is not None:
            print(f"determined: the real package at {real.origin}")
        else:
            print(f"determined: not installed; cairn's mapping is at {install_path()}")
        return 0
    if real is not None:
        print(
            f"a real determined is installed ({real.origin}); cairn's mapping stays off the path",
            file=sys.stderr,
        )
        return 1
    print(install_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())
