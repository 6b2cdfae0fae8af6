"""The process a custom searcher runs in:
``python -P -m services.searcher.custom_host [--limits JSON] CODE_DIR``.

Before it imports anything of the user's, it applies ``--limits`` to itself (rlimits ``as``,
``cpu``, ``nofile``, ``nproc``, ``fsize``, ``core`` and a ``nice`` increment; see
:class:`services.searcher.sandbox.SandboxSettings`), then works in ``CODE_DIR``.
It reads one JSON request per line on stdin and answers one JSON line on stdout. The first
request is ``{"call": "init", "config": {...}, "seed": N}`` (the experiment's config and the
searcher's seed); then ``initial``, ``created``, ``validation`` and ``exited`` calls. Answers are
``{"ops": [{"op": "create", "request_id": ..., "hparams": ...} | {"op": "stop", ...}]}`` or
``{"error": "..."}``. The user's own prints go to stderr, never into the protocol.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import traceback
from typing import Any, TextIO

from cairn.searcher import Create, SearcherContext, SearchMethod, Stop
from events.domain.config import CustomSearcher, parse_config
from events.domain.search.sampling import sample_hparams


def _load(spec: str) -> type[SearchMethod]:
    module_name, _, class_name = spec.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not isinstance(cls, type) or not issubclass(cls, SearchMethod):
        raise TypeError(f"{spec} is not a subclass of cairn.searcher.SearchMethod")
    return cls


def _ops(result: Any) -> list[dict[str, Any]]:
    if result is None:
        return []
    out: list[dict[str, Any]] = []
    for op in list(result):
        if isinstance(op, Create):
            out.append({"op": "create", "request_id": op.request_id, "hparams": op.hparams})
        elif isinstance(op, Stop):
            out.append({"op": "stop", "request_id": op.request_id})
        else:
            raise TypeError(f"operations must be cairn.searcher.Create or Stop, got {op!r}")
    return out


def _init(msg: dict[str, Any]) -> SearchMethod:
    config = parse_config(msg["config"])
    searcher = config.searcher
    if not isinstance(searcher, CustomSearcher):
        raise TypeError(f"searcher.name is {searcher.name!r}, not 'custom'")
    space = config.hyperparameters
    context = SearcherContext(
        seed=int(msg["seed"]),
        hyperparameters=msg["config"].get("hyperparameters") or {},
        metric=searcher.metric,
        smaller_is_better=searcher.smaller_is_better,
        max_trials=searcher.max_trials,
        sampler=lambda rng: sample_hparams(space, rng),
    )
    cls = _load(searcher.searcher_class)
    return cls(context, **searcher.searcher_args)


def _call(method: SearchMethod, msg: dict[str, Any]) -> Any:
    call = msg["call"]
    if call == "initial":
        return method.initial_operations()
    if call == "created":
        return method.on_trial_created(str(msg["request_id"]))
    if call == "validation":
        return method.on_validation(str(msg["request_id"]), msg["metric"], msg["time_value"])
    if call == "exited":
        return method.on_trial_exited(str(msg["request_id"]), msg.get("reason"))
    raise ValueError(f"unknown call {call!r}")


def serve(code_dir: str, inp: TextIO, out: TextIO) -> None:
    """Answers requests until stdin closes."""
    sys.path.insert(0, code_dir)
    method: SearchMethod | None = None
    for line in inp:
        try:
            msg = json.loads(line)
            if msg["call"] == "init":
                method = _init(msg)
                answer: dict[str, Any] = {"ops": []}
            elif method is None:
                raise RuntimeError("the searcher was not initialised")
            else:
                answer = {"ops": _ops(_call(method, msg))}
            text = json.dumps(answer, allow_nan=False)
        except Exception as exc:  # the user's code failed: report it, the service decides
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            tb = traceback.format_exc(limit=-3)
            text = json.dumps({"error": detail, "traceback": tb[-4000:]})
        out.write(text + "\n")
        out.flush()


_RLIMITS = {
    "as": resource.RLIMIT_AS,
    "cpu": resource.RLIMIT_CPU,
    "nofile": resource.RLIMIT_NOFILE,
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "core": resource.RLIMIT_CORE,
}


def confine_self(limits: dict[str, int]) -> None:
    """Lowers this process's rlimits and CPU priority (an unprivileged process may always lower
    them, and never raise them again).

    Raises:
        OSError, ValueError: a limit cannot be set (the host then refuses to serve).
    """
    for name, value in limits.items():
        if name == "nice":
            os.nice(int(value))
            continue
        which = _RLIMITS[name]
        _, hard = resource.getrlimit(which)
        value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
        resource.setrlimit(which, (value, value))


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m services.searcher.custom_host")
    parser.add_argument("--limits", default="{}", help="JSON object of limits")
    parser.add_argument("code_dir")
    args = parser.parse_args(argv)
    confine_self(json.loads(args.limits))
    os.chdir(args.code_dir)
    protocol = sys.stdout
    sys.stdout = sys.stderr  # the user's prints must not corrupt the protocol
    serve(args.code_dir, sys.stdin, protocol)
    return 0


if __name__ == "__main__":
    sys.exit(main())
