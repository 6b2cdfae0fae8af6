"""The search-method interface: operations out, trial events in, snapshot/restore.

A :class:`SearchMethod` is a pure, deterministic state machine. The searcher service feeds it
the trial events it folds from the log and records the operations it returns as events:

* ``initial_operations()`` once, when the experiment starts;
* ``on_trial_created(request_id)`` when a requested trial exists (informational);
* ``on_validation(request_id, metric, time_value)`` for every validation report; ``metric`` is
  the searcher metric as reported (the method applies ``smaller_is_better``), ``time_value`` the
  trial's position on the time axis (see :func:`read_validation`);
* ``on_checkpoint(request_id, uuid, steps_completed)`` for every checkpoint a trial saves;
* ``on_trial_exited_early(request_id, reason)`` when a trial ends abnormally (``errored`` after
  its restarts are spent, ``user_canceled``, ``invalid_hp``), always followed by
* ``on_trial_closed(request_id)`` when the trial has exited for good, for whatever reason;
* ``on_answer(call, ops)`` / ``on_call_failed(call, reason)`` only for a strategy that asks its
  decisions elsewhere (a custom searcher, :mod:`.custom`): the recorded answer to one of its
  calls. Such a strategy returns nothing from the calls above, and the search does not end
  while it is :attr:`SearchStrategy.answers_due` for an answer.

It answers with :class:`Create`, :class:`Stop` and, once every requested trial is closed and
nothing more will be requested, a single :class:`Shutdown`.

Determinism: all randomness (hyperparameters and trial seeds) comes from one ``random.Random``
seeded with ``experiment_seed`` and kept in the method's state; request ids are ``r0001``,
``r0002``, ... in request order. The same config and the same sequence of calls give the same
operations and the same :meth:`SearchMethod.snapshot`; ``restore(snapshot())`` on a fresh method
built from the same config continues exactly as the original would have.

``max_concurrent_trials`` (when > 0) is enforced here for every method: a ``Create`` that would
exceed it is held and returned by the call that closes a trial.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from events.domain.config import HalvingSearcher, PBTSearcher, SearcherConfig
from events.domain.search.sampling import sample_hparams

ExitReason = Literal["errored", "user_canceled", "invalid_hp"]
EXIT_REASONS: tuple[str, ...] = get_args(ExitReason)

SNAPSHOT_VERSION = 1
TRIAL_SEED_BOUND = 2**31


class SearcherError(Exception):
    """The method was driven wrongly (unknown request id, missing time value, bad snapshot)."""


@dataclass(frozen=True)
class Create:
    """Start a new trial with these hyperparameters and this seed.

    A clone (population-based training) also names its ``parent`` request, the ``round`` that
    cloned it, the hyperparameter ``change`` from the parent's and the parent's checkpoint it
    starts from (``warm_start``, trained ``warm_start_steps``).
    """

    request_id: str
    hparams: dict[str, Any] = field(hash=False)
    trial_seed: int
    parent: str | None = None
    round: int | None = None
    change: dict[str, Any] = field(default_factory=dict, hash=False)
    warm_start: str | None = None
    warm_start_steps: int = 0


@dataclass(frozen=True)
class Stop:
    """Stop this trial gracefully (it checkpoints and exits; it is not restarted)."""

    request_id: str


@dataclass(frozen=True)
class Shutdown:
    """The search is over. ``cancel``: every trial was canceled; ``failure``: every one errored."""

    cancel: bool = False
    failure: bool = False


Operation = Create | Stop | Shutdown


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _set_rng_state(rng: random.Random, state: list[Any]) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class SearchContext:
    """The generator and request-id counter shared by a search and all its sub-searches."""

    def __init__(self, seed: int, hparams: Mapping[str, Any]) -> None:
        self.rng = random.Random(seed)
        self.hparams = hparams
        self.next_request = 1

    def create(self, hparams: dict[str, Any] | None = None) -> Create:
        """A new ``Create``: sampled hyperparameters (unless given), then a trial seed."""
        values = sample_hparams(self.hparams, self.rng) if hparams is None else hparams
        seed = self.rng.randrange(TRIAL_SEED_BOUND)
        request_id = f"r{self.next_request:04d}"
        self.next_request += 1
        return Create(request_id=request_id, hparams=values, trial_seed=seed)

    def state(self) -> dict[str, Any]:
        """JSON-able state (the full generator state included)."""
        return {"rng": _rng_state(self.rng), "next_request": self.next_request}

    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`."""
        _set_rng_state(self.rng, state["rng"])
        self.next_request = int(state["next_request"])


class SearchStrategy(ABC):
    """One search algorithm; :class:`SearchMethod` does the bookkeeping around it.

    ``failure`` is set (with the reason) by a strategy that can no longer search, such as a
    user's method that raised: the service then ends the experiment with an error.
    """

    failure: str | None = None

    @property
    def answers_due(self) -> bool:
        """Whether the strategy still owes answers it will be given later (a custom searcher's
        unanswered calls): the search cannot end before they are folded."""
        return False

    def answer(
        self, ctx: SearchContext, call: int, ops: Sequence[Mapping[str, Any]]
    ) -> list[Operation]:
        """Folds a recorded answer to call ``call`` (only strategies that ask elsewhere have any).

        Raises:
            SearcherError: the strategy asks nothing elsewhere, or ``call`` is out of order.
        """
        raise SearcherError(f"{type(self).__name__} records no answers")

    def fail_call(self, call: int, reason: str) -> None:
        """Folds a recorded failure of call ``call``; the search fails with ``reason``.

        Raises:
            SearcherError: the strategy asks nothing elsewhere, or ``call`` is out of order.
        """
        raise SearcherError(f"{type(self).__name__} records no answers")

    @abstractmethod
    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Operations to start the search with."""

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """A validation report of a live trial."""
        return []

    def checkpoint(
        self, ctx: SearchContext, request_id: str, uuid: str, steps_completed: int
    ) -> list[Operation]:
        """A live trial saved a checkpoint."""
        return []

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """A trial ended abnormally (called at most once per trial)."""
        return []

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """A trial exited for good (called once per trial)."""
        return []

    def reopened(self, ctx: SearchContext, request_id: str) -> None:
        """A closed trial was continued by a user and is live again (see
        :meth:`SearchMethod.on_trial_continued`)."""
        raise SearcherError(f"{type(self).__name__} cannot continue a closed trial")

    @abstractmethod
    def progress(self) -> float:
        """Fraction of the search done, in ``[0, 1]``."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """JSON-able state."""

    @abstractmethod
    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`."""


class SearchMethod:
    """A search as the searcher service sees it (see the module docstring for the protocol)."""

    def __init__(
        self,
        kind: str,
        strategy: SearchStrategy,
        *,
        seed: int,
        hparams: Mapping[str, Any],
        max_concurrent_trials: int = 0,
    ) -> None:
        self.kind = kind
        self._strategy = strategy
        self._ctx = SearchContext(seed, hparams)
        self._cap = max_concurrent_trials
        self._started = False
        self._requested: list[str] = []
        self._held: list[Create] = []
        self._created: set[str] = set()
        self._closed: list[str] = []
        self._requested_set: set[str] = set()
        self._closed_set: set[str] = set()
        self._exits: dict[str, str] = {}
        self._shutdown = False

    # -- events -----------------------------------------------------------------------------

    def initial_operations(self) -> list[Operation]:
        """The first operations; call exactly once."""
        if self._started:
            raise SearcherError("initial_operations() was already called")
        self._started = True
        return self._finish(self._strategy.initial(self._ctx))

    def on_trial_created(self, request_id: str) -> list[Operation]:
        """Notes that the trial for ``request_id`` exists."""
        self._known(request_id)
        self._created.add(request_id)
        return []

    def on_validation(
        self, request_id: str, metric: float, time_value: float | None = None
    ) -> list[Operation]:
        """Feeds one validation report; reports of exited or closed trials are ignored."""
        self._known(request_id)
        if self._shutdown or request_id in self._exits or request_id in self._closed_set:
            return []
        return self._finish(
            self._strategy.validation(self._ctx, request_id, float(metric), time_value)
        )

    def on_checkpoint(self, request_id: str, uuid: str, steps_completed: int) -> list[Operation]:
        """Feeds a saved checkpoint; checkpoints of exited or closed trials are ignored."""
        self._known(request_id)
        if self._shutdown or request_id in self._exits or request_id in self._closed_set:
            return []
        return self._finish(
            self._strategy.checkpoint(self._ctx, request_id, uuid, int(steps_completed))
        )

    def on_trial_exited_early(self, request_id: str, reason: str) -> list[Operation]:
        """Feeds an abnormal end; a repeat for the same trial is ignored."""
        self._known(request_id)
        if reason not in EXIT_REASONS:
            raise SearcherError(f"unknown exit reason {reason!r}; expected one of {EXIT_REASONS}")
        if self._shutdown or request_id in self._exits or request_id in self._closed_set:
            return []
        self._exits[request_id] = reason
        return self._finish(self._strategy.exited_early(self._ctx, request_id, reason))

    def on_trial_closed(self, request_id: str) -> list[Operation]:
        """Feeds a trial's final exit; may release held creates or end the search."""
        self._known(request_id)
        if self._shutdown or request_id in self._closed_set:
            return []
        self._closed.append(request_id)
        self._closed_set.add(request_id)
        return self._finish(self._strategy.closed(self._ctx, request_id))

    def on_answer(self, call: int, ops: Sequence[Mapping[str, Any]]) -> list[Operation]:
        """Feeds the recorded answer to call ``call`` of a strategy that asks elsewhere (a custom
        searcher); may create, stop, or end the search once nothing is owed any more.

        Raises:
            SearcherError: the strategy records no answers, or ``call`` is out of order.
        """
        decided = self._strategy.answer(self._ctx, call, ops)
        return [] if self._shutdown else self._finish(decided)

    def on_call_failed(self, call: int, reason: str) -> None:
        """Feeds the recorded failure of call ``call``: the strategy's
        :attr:`SearchStrategy.failure` is set.

        Raises:
            SearcherError: the strategy records no answers, or ``call`` is out of order.
        """
        self._strategy.fail_call(call, reason)

    def on_trial_continued(self, request_id: str) -> None:
        """A user continued the ended search's closed trial ``request_id``: it is live again and
        the search is open until it closes once more (then ``Shutdown`` follows again).

        Raises:
            SearcherError: the trial is not closed, or the strategy cannot take it back.
        """
        self._known(request_id)
        if request_id not in self._closed_set:
            raise SearcherError(f"trial {request_id!r} is not closed")
        self._strategy.reopened(self._ctx, request_id)
        self._closed.remove(request_id)
        self._closed_set.discard(request_id)
        self._exits.pop(request_id, None)
        self._shutdown = False

    # -- queries ----------------------------------------------------------------------------

    def progress(self) -> float:
        """Fraction of the search done, in ``[0, 1]`` (1 once shut down)."""
        if self._shutdown:
            return 1.0
        value = self._strategy.progress()
        if math.isnan(value) or math.isinf(value):
            return 0.0
        return min(max(value, 0.0), 1.0)

    @property
    def strategy(self) -> SearchStrategy:
        """The algorithm behind this method (read it, do not drive it directly)."""
        return self._strategy

    @property
    def is_shutdown(self) -> bool:
        """Whether ``Shutdown`` has been returned."""
        return self._shutdown

    @property
    def requested(self) -> list[str]:
        """Request ids of every trial requested so far, in order."""
        return list(self._requested)

    @property
    def running(self) -> int:
        """Requested trials not closed yet."""
        return len(self._requested) - len(self._closed)

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-able data (generator state included)."""
        return {
            "version": SNAPSHOT_VERSION,
            "kind": self.kind,
            "context": self._ctx.state(),
            "started": self._started,
            "requested": list(self._requested),
            "held": [asdict(c) for c in self._held],
            "created": sorted(self._created),
            "closed": list(self._closed),
            "exits": dict(self._exits),
            "shutdown": self._shutdown,
            "strategy": self._strategy.state(),
        }

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Loads a :meth:`snapshot` taken from a method built from the same config."""
        if snapshot.get("version") != SNAPSHOT_VERSION or snapshot.get("kind") != self.kind:
            raise SearcherError(
                f"snapshot is {snapshot.get('kind')!r} v{snapshot.get('version')}, "
                f"expected {self.kind!r} v{SNAPSHOT_VERSION}"
            )
        self._ctx.load(snapshot["context"])
        self._started = bool(snapshot["started"])
        self._requested = list(snapshot["requested"])
        self._held = [Create(**c) for c in snapshot["held"]]
        self._created = set(snapshot["created"])
        self._closed = list(snapshot["closed"])
        self._requested_set = set(self._requested)
        self._closed_set = set(self._closed)
        self._exits = dict(snapshot["exits"])
        self._shutdown = bool(snapshot["shutdown"])
        self._strategy.load(snapshot["strategy"])

    # -- internals --------------------------------------------------------------------------

    def _known(self, request_id: str) -> None:
        if request_id not in self._requested_set:
            raise SearcherError(f"unknown request id {request_id!r}")

    def _finish(self, ops: list[Operation]) -> list[Operation]:
        out: list[Operation] = []
        for op in ops:
            if isinstance(op, Create):
                self._held.append(op)
            elif isinstance(op, Stop):
                out.append(op)
        while self._held and (self._cap <= 0 or self.running < self._cap):
            create = self._held.pop(0)
            self._requested.append(create.request_id)
            self._requested_set.add(create.request_id)
            out.append(create)
        # Invariant: Shutdown is emitted once, when nothing is running or held any more.
        if (
            self._started
            and not self._shutdown
            and not self._held
            and self.running == 0
            and not self._strategy.answers_due
        ):
            self._shutdown = True
            reasons = [self._exits.get(r) for r in self._requested]
            out.append(
                Shutdown(
                    cancel=bool(reasons) and all(r == "user_canceled" for r in reasons),
                    failure=bool(reasons) and all(r == "errored" for r in reasons),
                )
            )
        return out


def read_validation(
    searcher: SearcherConfig, metrics: Mapping[str, Any], steps_completed: int | None = None
) -> tuple[float, float | None]:
    """Extracts ``(metric, time_value)`` for :meth:`SearchMethod.on_validation` from a report.

    The time axis is ``time_metric`` for ASHA searchers, the unit of ``length_per_round`` for
    PBT, else the unit of the legacy
    ``max_length`` (``batches``, ``records`` or ``epochs``); its value is read from the
    validation metrics. When that axis is ``batches`` and the metrics lack it,
    ``steps_completed`` (batches trained so far) is used instead.

    Raises:
        SearcherError: The searcher metric is missing or not a number, or the time value is
            missing for an ASHA searcher.
    """
    value = metrics.get(searcher.metric)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SearcherError(
            f"validation metrics lack a numeric {searcher.metric!r} (got {sorted(metrics)})"
        )
    if isinstance(searcher, HalvingSearcher):
        axis: str | None = searcher.length()[0]
    elif isinstance(searcher, PBTSearcher):
        axis = searcher.length_per_round.unit
    else:
        axis = searcher.max_length.unit if searcher.max_length is not None else "batches"
    raw = metrics.get(axis) if axis is not None else None
    if raw is None and axis == "batches":
        raw = steps_completed
    if isinstance(raw, bool) or not isinstance(raw, int | float | None):
        raise SearcherError(f"time metric {axis!r} must be a number, got {raw!r}")
    if raw is None and isinstance(searcher, HalvingSearcher | PBTSearcher):
        raise SearcherError(f"validation metrics lack the time metric {axis!r}")
    return float(value), (float(raw) if raw is not None else None)
