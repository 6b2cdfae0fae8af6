"""A user's search method (``searcher.name: custom``), run in a child process of the searcher.

The user's class (see :mod:`cairn.searcher`) lives in :mod:`services.searcher.custom_host`, a
separate Python process started with the experiment's code on its path, no database or bus
credentials in its environment and a memory limit. Each call waits at most ``call_timeout``
seconds for an answer of at most :data:`MAX_ANSWER` bytes. A call that raises, times out, answers
garbage or breaks the rules (a create beyond ``max_trials``, a request id out of order, a stop of
an unknown trial) fails the search: :attr:`CustomStrategy.failure` says why, the process is
killed, every later call is a no-op, and the searcher service records the experiment's
``STOPPING_ERROR``. One bad searcher thus ends its own experiment, never the service.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import select
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from services.searcher.methods.base import (
    Operation,
    SearchContext,
    SearcherError,
    SearchStrategy,
    Stop,
)

log = structlog.get_logger("searcher")

MAX_ANSWER = 4 * 1024 * 1024
"""Longest answer line (bytes) a custom searcher may write for one call."""
MEMORY_LIMIT = 2 * 1024**3
"""Address-space limit of the custom searcher's process (bytes)."""
DEFAULT_CALL_TIMEOUT = float(os.environ.get("CAIRN_CUSTOM_SEARCHER_TIMEOUT", "10"))
"""Seconds one call may take (environment ``CAIRN_CUSTOM_SEARCHER_TIMEOUT``)."""
STARTUP_TIMEOUT = 60.0
"""Seconds the process may take to start and load the user's class (its first call)."""
_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR", "SYSTEMROOT")


def _limit_memory() -> None:  # pragma: no cover - runs in the child
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


class CustomStrategy(SearchStrategy):
    """Drives a user's :class:`cairn.searcher.SearchMethod` in its own process.

    Args:
        config: The experiment's config as submitted (JSON).
        seed: Seed of the user's :attr:`cairn.searcher.SearcherContext.rng`.
        code_dir: The experiment's code, unpacked.
        max_trials: Most trials the user's method may create.
        call_timeout: Seconds one call may take (:data:`DEFAULT_CALL_TIMEOUT` when ``None``).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        seed: int,
        code_dir: Path,
        max_trials: int,
        call_timeout: float | None = None,
    ) -> None:
        self.config = dict(config)
        self.seed = seed
        self.code_dir = code_dir
        self.max_trials = max_trials
        self.call_timeout = DEFAULT_CALL_TIMEOUT if call_timeout is None else call_timeout
        self.failure: str | None = None
        self.created = 0
        self.live: set[str] = set()
        self.closed_count = 0
        self.reasons: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    # -- the child process ----------------------------------------------------------------

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
        env["PYTHONUNBUFFERED"] = "1"
        return subprocess.Popen(
            [sys.executable, "-m", "services.searcher.custom_host", str(self.code_dir)],
            cwd=self.code_dir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=_limit_memory,
        )

    def close(self) -> None:
        """Kills the child process (a later call starts nothing: see :attr:`failure`)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(5)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = f"custom searcher {self.config_class}: {reason}"
            log.warning("custom searcher failed", reason=self.failure)
        self.close()

    @property
    def config_class(self) -> str:
        """The user's ``module:Class``."""
        searcher = self.config.get("searcher") or {}
        return str(searcher.get("searcher_class"))

    def _ask(self, msg: dict[str, Any]) -> list[dict[str, Any]]:
        if self.failure is not None:
            return []
        try:
            if self._proc is None:
                self._proc = self._start()
                init = {"call": "init", "config": self.config, "seed": self.seed}
                self._exchange(init, max(self.call_timeout, STARTUP_TIMEOUT))
            return self._exchange(msg, self.call_timeout)
        except ValueError as exc:
            self._fail(str(exc))
            return []
        except OSError as exc:
            self._fail(f"its process broke ({exc})")
            return []

    def _exchange(self, msg: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
        line = self._read_line(proc.stdout.fileno(), str(msg["call"]), timeout)
        answer = json.loads(line)
        if not isinstance(answer, dict):
            raise ValueError("answer is not an object")
        if "error" in answer:
            raise ValueError(f"{msg['call']} raised {answer['error']}")
        ops = answer.get("ops")
        if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
            raise ValueError("answer has no list of operations")
        return ops

    def _read_line(self, fd: int, call: str, timeout: float) -> bytes:
        """One answer line, read from the raw pipe so that a child that writes half a line
        and stalls, or floods, cannot block the service past ``timeout``."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ValueError(f"{call} took more than {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ValueError(f"the process exited during {call}")
            self._buffer += chunk
            if len(self._buffer) > MAX_ANSWER:
                raise ValueError(f"{call} answered more than {MAX_ANSWER} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _operations(self, ctx: SearchContext, raw: list[dict[str, Any]]) -> list[Operation]:
        out: list[Operation] = []
        for op in raw:
            if self.failure is not None:
                return []
            kind = op.get("op")
            request_id = op.get("request_id")
            if kind == "create":
                expected = f"r{ctx.next_request:04d}"
                hparams = op.get("hparams")
                if self.created >= self.max_trials:
                    self._fail(f"created more than max_trials ({self.max_trials}) trials")
                elif request_id != expected:
                    self._fail(f"created {request_id!r} where {expected!r} was next")
                elif not isinstance(hparams, dict):
                    self._fail(f"create {request_id!r} has no hyperparameter mapping")
                else:
                    create = ctx.create(hparams)
                    self.created += 1
                    self.live.add(create.request_id)
                    out.append(create)
            elif kind == "stop":
                if request_id not in self.live:
                    self._fail(f"stopped {request_id!r}, which is no live trial")
                else:
                    out.append(Stop(str(request_id)))
            else:
                self._fail(f"unknown operation {kind!r}")
        return [] if self.failure is not None else out

    # -- strategy ---------------------------------------------------------------------------

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """The user's ``initial_operations``."""
        return self._operations(ctx, self._ask({"call": "initial"}))

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """The user's ``on_validation`` (a non-finite metric is passed as ``None``)."""
        value = metric if math.isfinite(metric) else None
        msg = {"call": "validation", "request_id": request_id, "metric": value}
        return self._operations(ctx, self._ask({**msg, "time_value": time_value}))

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Kept for the ``on_trial_exited`` call that follows when the trial closes."""
        self.reasons[request_id] = reason
        return []

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """The user's ``on_trial_exited``."""
        self.live.discard(request_id)
        self.closed_count += 1
        msg = {"call": "exited", "request_id": request_id, "reason": self.reasons.get(request_id)}
        return self._operations(ctx, self._ask(msg))

    def progress(self) -> float:
        """Closed trials over ``max_trials``."""
        return self.closed_count / self.max_trials

    def state(self) -> dict[str, Any]:
        """What the service knows (the user's own state lives in its process)."""
        return {
            "failure": self.failure,
            "created": self.created,
            "live": sorted(self.live),
            "closed": self.closed_count,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Not possible: a custom search is rebuilt by replaying its calls."""
        raise SearcherError("a custom search is rebuilt by replaying the log, not from a snapshot")
