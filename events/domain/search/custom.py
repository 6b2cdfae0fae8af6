"""A user's search method (``searcher.name: custom``), as the searcher's fold sees it: the calls
to ask, the answers recorded.

The user's class (see :mod:`cairn.searcher`) never runs here. This strategy is pure: each input
the search method is fed (the start, a validation, a trial's end) becomes a *call*, numbered
1, 2, ... in the order the fold makes them, and returns no operation. A worker outside the fold
(:mod:`services.searcher.custom_worker`) asks the calls, in order, of the user's method in a
sandboxed process and records each answer in the log (``CustomSearcherAnswered`` or
``CustomSearcherFailed``); folding that fact calls :meth:`CustomStrategy.answer` or
:meth:`CustomStrategy.fail_call`, which apply it.

Invariants:

- The calls are a function of the log: the same log asks the same calls with the same numbers,
  so a replay knows which ones were answered (the facts name their call) and which are still to
  ask.
- Answers are applied in call order, each once, and checked against the rules here, at fold
  time: a create beyond ``max_trials``, a request id out of order or the stop of a trial the
  method was already told had ended fails the search (:attr:`CustomStrategy.failure`). A stop
  of a trial that ended after the call was asked is a race, not an error, and is dropped.
- While a call is unanswered the search is not over (:attr:`CustomStrategy.answers_due`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from events.domain.search.base import (
    Operation,
    SearchContext,
    SearcherError,
    SearchStrategy,
    Stop,
)

HOOKS = {
    "init": "__init__",
    "initial": "initial_operations",
    "validation": "on_validation",
    "exited": "on_trial_exited",
}
"""The user's method that answers each kind of call (``init`` loads the class)."""


def hook_of(call: Mapping[str, Any]) -> str:
    """The name of the user's method that answers ``call``."""
    return HOOKS.get(str(call.get("call")), str(call.get("call")))


def answer_digest(ops: Sequence[Mapping[str, Any]]) -> str:
    """A short digest of an answer's operations, to tell a replayed answer from the recorded
    one without keeping every answer."""
    text = json.dumps(list(ops), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class CustomStrategy(SearchStrategy):
    """The calls and recorded answers of a user's :class:`cairn.searcher.SearchMethod`.

    Args:
        config: The experiment's config as submitted (JSON), for the sandboxed process.
        seed: Seed of the user's :attr:`cairn.searcher.SearcherContext.rng`.
        code_ref: The experiment's code, by content address (``None``: none was submitted).
        max_trials: Most trials the user's method may create.

    Attributes:
        calls: Every call asked so far, in order (``calls[k - 1]`` is call ``k``), as the JSON
            message the sandboxed process receives. Entries are never changed once made.
        answered: How many calls have an answer (or a failure) folded.
        digests: The digest of each folded answer (:func:`answer_digest`), by call.
        failure: Why the search cannot go on, once it cannot.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        seed: int,
        code_ref: str | None,
        max_trials: int,
    ) -> None:
        self.config = dict(config)
        self.seed = seed
        self.code_ref = code_ref
        self.max_trials = max_trials
        self.failure: str | None = None
        self.calls: list[dict[str, Any]] = []
        self.answered = 0
        self.digests: list[str] = []
        self.created = 0
        self.created_ids: set[str] = set()
        self.ended = False
        self.exited_at: dict[str, int] = {}
        self.closed_count = 0
        self.reasons: dict[str, str] = {}

    @property
    def searcher_class(self) -> str:
        """The user's ``module:Class``."""
        searcher = self.config.get("searcher") or {}
        return str(searcher.get("searcher_class"))

    @property
    def answers_due(self) -> bool:
        """Whether a call is still unanswered (the search cannot end meanwhile)."""
        return self.failure is None and not self.ended and self.answered < len(self.calls)

    def init_message(self) -> dict[str, Any]:
        """The message that loads the user's class in a fresh process."""
        return {"call": "init", "config": self.config, "seed": self.seed}

    def release(self) -> None:
        """Forgets the history of calls: the search has ended and nothing is asked any more."""
        self.ended = True
        self.calls = []
        self.digests = []

    def _ask(self, message: dict[str, Any]) -> None:
        if self.failure is None and not self.ended:
            self.calls.append(message)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = f"custom searcher {self.searcher_class}: {reason}"

    # -- inputs: each becomes a call ----------------------------------------------------------

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Asks the user's ``initial_operations``."""
        self._ask({"call": "initial"})
        return []

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """Asks the user's ``on_validation`` (a non-finite metric is passed as ``None``)."""
        value = metric if math.isfinite(metric) else None
        self._ask(
            {
                "call": "validation",
                "request_id": request_id,
                "metric": value,
                "time_value": time_value,
            }
        )
        return []

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Kept for the ``on_trial_exited`` call that follows when the trial closes."""
        self.reasons[request_id] = reason
        return []

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """Asks the user's ``on_trial_exited``."""
        self.closed_count += 1
        self.exited_at[request_id] = len(self.calls) + 1
        reason = self.reasons.get(request_id)
        self._ask({"call": "exited", "request_id": request_id, "reason": reason})
        return []

    # -- recorded answers ---------------------------------------------------------------------

    def _settle(self, call: int) -> None:
        if call != self.answered + 1 or call > len(self.calls):
            raise SearcherError(
                f"answer to call {call} folded after {self.answered} of {len(self.calls)} calls"
            )
        self.answered = call

    def fail_call(self, call: int, reason: str) -> None:
        """Folds ``CustomSearcherFailed``: the call got no usable answer; the search fails.

        Raises:
            SearcherError: ``call`` is not the next unanswered call.
        """
        self._settle(call)
        self.digests.append("")
        if self.failure is None:
            self.failure = reason

    def answer(
        self, ctx: SearchContext, call: int, ops: Sequence[Mapping[str, Any]]
    ) -> list[Operation]:
        """Folds ``CustomSearcherAnswered``: the operations the user's method answered to
        ``call``, checked against the rules (see the module docstring).

        Raises:
            SearcherError: ``call`` is not the next unanswered call.
        """
        self._settle(call)
        self.digests.append(answer_digest(ops))
        hook = hook_of(self.calls[call - 1])
        out: list[Operation] = []
        for op in ops:
            if self.failure is not None:
                return []
            kind = op.get("op")
            request_id = str(op.get("request_id"))
            if kind == "create":
                expected = f"r{ctx.next_request:04d}"
                hparams = op.get("hparams")
                if self.created >= self.max_trials:
                    self._fail(f"{hook} created more than max_trials ({self.max_trials}) trials")
                elif request_id != expected:
                    self._fail(f"{hook} created {request_id!r} where {expected!r} was next")
                elif not isinstance(hparams, dict):
                    self._fail(f"{hook}: create {request_id!r} has no hyperparameter mapping")
                else:
                    out.append(ctx.create(dict(hparams)))
                    self.created += 1
                    self.created_ids.add(request_id)
            elif kind == "stop":
                exited = self.exited_at.get(request_id)
                if request_id not in self.created_ids:
                    self._fail(f"{hook} stopped {request_id!r}, which it never created")
                elif exited is not None and exited <= call:
                    self._fail(f"{hook} stopped {request_id!r}, which had exited")
                elif exited is None:
                    out.append(Stop(request_id))
                # else: the trial ended after the call was asked; nothing to stop
            else:
                self._fail(f"{hook} answered the unknown operation {kind!r}")
        return [] if self.failure is not None else out

    # -- strategy -----------------------------------------------------------------------------

    def progress(self) -> float:
        """Closed trials over ``max_trials``."""
        return self.closed_count / self.max_trials

    def state(self) -> dict[str, Any]:
        """What the fold knows (the user's own state lives in its process)."""
        return {
            "failure": self.failure,
            "calls": len(self.calls),
            "answered": self.answered,
            "created": self.created,
            "closed": self.closed_count,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Not possible: a custom search is rebuilt by folding its recorded answers.

        Raises:
            SearcherError: always.
        """
        raise SearcherError("a custom search is rebuilt by folding the log, not from a snapshot")
