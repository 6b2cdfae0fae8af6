"""``preview-search``: run a search method against simulated trials, no cluster involved.

Every trial trains at the same speed and reports a validation at each rung of its bracket (ASHA),
at each round's end (PBT, then checkpoints there; a clone starts at its parent's checkpoint with
about its parent's quality) or once at its full length (other methods); no trial fails or exits
on its own. Each trial has a
fixed simulated quality drawn from a generator seeded with the experiment seed, so the searcher's
stop decisions look like a real search's and the preview is reproducible.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from events.domain.config import (
    CustomSearcher,
    ExperimentConfig,
    HalvingSearcher,
    PBTSearcher,
    ReproducibilityConfig,
    TPESearcher,
)
from events.domain.search import make_method
from events.domain.search.adaptive_asha import AdaptiveASHAStrategy
from events.domain.search.asha import ASHAStrategy
from events.domain.search.base import (
    Create,
    Operation,
    SearcherError,
    SearchMethod,
    Shutdown,
    Stop,
)
from events.domain.search.custom import CustomStrategy
from events.domain.search.pbt import PBTStrategy

MAX_EVENTS = 1_000_000
"""Most simulated validations of one preview; a bigger search is refused before it runs."""
DEFAULT_PREVIEW_SEED = 0


class PreviewTooLargeError(SearcherError):
    """The search would take more than :data:`MAX_EVENTS` simulated validations to preview."""


@dataclass(frozen=True)
class BracketRow:
    """One ASHA bracket: its depth, trial budget and concurrency."""

    bracket: int
    num_rungs: int
    max_trials: int
    max_concurrent_trials: int


@dataclass(frozen=True)
class RungRow:
    """One rung: where it is and how many trials reached it and were stopped there."""

    bracket: int
    rung: int
    units: int
    trials: int
    stopped: int


@dataclass(frozen=True)
class RoundRow:
    """One PBT round: where it ends, how many trials it ranked, stopped and cloned."""

    round: int
    units: int
    trials: int
    stopped: int
    cloned: int


@dataclass(frozen=True)
class LengthRow:
    """``trials`` trials train up to ``units`` (``None``: the training code decides)."""

    trials: int
    units: int | None


@dataclass(frozen=True)
class PreviewResult:
    """What a search would do, as :func:`preview_search` simulated it."""

    searcher: str
    metric: str
    smaller_is_better: bool
    seed: int
    unit: str | None
    max_time: int | None
    total_trials: int
    total_units: int | None
    lengths: tuple[LengthRow, ...]
    brackets: tuple[BracketRow, ...]
    rungs: tuple[RungRow, ...]
    rounds: tuple[RoundRow, ...] = ()
    startup_trials: int | None = None
    """TPE: how many of the first trials are sampled at random before TPE suggests."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


def _brackets(method: SearchMethod) -> list[ASHAStrategy]:
    strategy = method.strategy
    if isinstance(strategy, AdaptiveASHAStrategy):
        return strategy.brackets
    if isinstance(strategy, ASHAStrategy):
        return [strategy]
    return []


def _bracket_of(method: SearchMethod, request_id: str) -> int:
    strategy = method.strategy
    return strategy.bracket_of(request_id) if isinstance(strategy, AdaptiveASHAStrategy) else 0


class CustomAnswers(Protocol):
    """Runs a custom search's user class somewhere and answers its due calls (see
    :class:`services.searcher.local_preview.LocalAnswers`, which runs it on this machine)."""

    def answer(self, method: SearchMethod) -> list[Operation]:
        """Asks every due call in order and returns what ``method`` decided from the answers."""
        ...

    def close(self) -> None:
        """Ends whatever runs the user's class."""
        ...


class _Simulation:
    def __init__(
        self,
        config: ExperimentConfig,
        seed: int,
        code_dir: Path | None = None,
        answers: Callable[[CustomStrategy, Path], CustomAnswers] | None = None,
    ) -> None:
        strategy = None
        self.local: CustomAnswers | None = None
        if isinstance(config.searcher, CustomSearcher):
            if code_dir is None:
                raise SearcherError("a custom searcher is previewed with its code directory")
            if answers is None:
                raise SearcherError(
                    "a custom searcher is previewed by running its class: pass ``answers``"
                )
            raw = config.model_dump(mode="json", exclude_none=True)
            strategy = CustomStrategy(raw, seed, None, config.searcher.max_trials)
            self.local = answers(strategy, code_dir.resolve())
        self.custom = strategy
        self.method = make_method(config, strategy)
        self.brackets = _brackets(self.method)
        self.quality = random.Random(seed)
        searcher = config.searcher
        self.pbt = self.method.strategy if isinstance(self.method.strategy, PBTStrategy) else None
        self.offset: dict[str, int] = {}
        if isinstance(searcher, HalvingSearcher):
            self.target: int | None = searcher.length()[1]
        elif isinstance(searcher, PBTSearcher):
            self.target = searcher.num_rounds * searcher.length_per_round.units
        else:
            self.target = searcher.max_length.units if searcher.max_length is not None else None
        self.clock = 0.0
        self.seq = 0
        self.queue: list[tuple[float, int, str, int]] = []
        self.metric: dict[str, float] = {}
        self.start: dict[str, float] = {}
        self.trained: dict[str, int | None] = {}
        self.done = False

    def _checkpoints(self, request_id: str) -> list[int | None]:
        if self.pbt is not None:
            joined = self.pbt.joined[request_id]
            return [self.pbt.boundary(k) for k in range(joined, self.pbt.num_rounds)]
        if self.brackets:
            return list(self.brackets[_bracket_of(self.method, request_id)].units)
        return [self.target]

    def _schedule(self, request_id: str, step: int) -> None:
        points = self._checkpoints(request_id)
        if step >= len(points):
            return
        at = points[step]
        self.seq += 1
        when = self.start[request_id] + (at if at is not None else 1)
        heapq.heappush(self.queue, (when, self.seq, request_id, step))

    def _apply(self, ops: list[Operation]) -> None:
        for op in ops:
            if isinstance(op, Create):
                quality = self.quality.random()
                if op.parent is not None:
                    quality = self.metric[op.parent] * (0.9 + 0.2 * quality)
                self.metric[op.request_id] = quality
                self.offset[op.request_id] = op.warm_start_steps
                self.start[op.request_id] = self.clock - op.warm_start_steps
                self.trained[op.request_id] = 0
                self.method.on_trial_created(op.request_id)
                self._schedule(op.request_id, 0)
            elif isinstance(op, Stop):
                self._close(op.request_id)
            elif isinstance(op, Shutdown):
                self.done = True
        if self.local is not None and not self.done:
            more = self.local.answer(self.method)
            if self.custom is not None and self.custom.failure is not None:
                self.done = True
            elif more:
                self._apply(more)

    def _close(self, request_id: str) -> None:
        if self.start.pop(request_id, None) is not None:
            self._apply(self.method.on_trial_closed(request_id))

    def run(self) -> None:
        self._apply(self.method.initial_operations())
        events = 0
        while self.queue and not self.done:
            events += 1
            if events > MAX_EVENTS:
                raise PreviewTooLargeError(
                    f"preview stopped after {MAX_EVENTS} simulated validations; the search "
                    "looks unbounded"
                )
            when, _, request_id, step = heapq.heappop(self.queue)
            if request_id not in self.start:
                continue
            self.clock = when
            at = self._checkpoints(request_id)[step]
            self.trained[request_id] = at - self.offset[request_id] if at is not None else None
            time_value = float(at) if at is not None else None
            ops = self.method.on_validation(request_id, self.metric[request_id], time_value)
            self._apply(ops)
            if self.pbt is not None and at is not None and request_id in self.start:
                self._apply(self.method.on_checkpoint(request_id, f"{request_id}@{at}", at))
            if request_id in self.start:
                if step + 1 < len(self._checkpoints(request_id)):
                    self._schedule(request_id, step + 1)
                else:
                    self._close(request_id)


def _validations_bound(sim: _Simulation) -> int:
    """Most validations the simulation can run: each trial validates once per rung at most."""
    if sim.brackets:
        return sum(b.max_trials * b.num_rungs for b in sim.brackets)
    return 0  # one validation per trial, and a search has at most MAX_TRIALS trials


def preview_search(
    config: ExperimentConfig,
    code_dir: Path | None = None,
    *,
    answers: Callable[[CustomStrategy, Path], CustomAnswers] | None = None,
) -> PreviewResult:
    """Simulates the whole search for ``config`` (see the module docstring for assumptions);
    a custom searcher's class runs from ``code_dir`` in what ``answers(strategy, code_dir)``
    starts (this module runs nothing itself).

    Raises:
        PreviewTooLargeError: The search needs more than :data:`MAX_EVENTS` simulated
            validations.
    """
    seed = config.reproducibility.experiment_seed
    if seed is None:
        seed = DEFAULT_PREVIEW_SEED
        repro = ReproducibilityConfig(experiment_seed=seed)
        config = config.model_copy(update={"reproducibility": repro})
    sim = _Simulation(config, seed, code_dir, answers)
    bound = _validations_bound(sim)
    if bound > MAX_EVENTS:
        raise PreviewTooLargeError(
            f"the search may need up to {bound} validations (trials x rungs), more than "
            f"preview-search simulates ({MAX_EVENTS}); preview a smaller searcher.max_trials "
            "or fewer rungs"
        )
    try:
        sim.run()
    finally:
        if sim.local is not None:
            sim.local.close()
    if sim.custom is not None and sim.custom.failure is not None:
        raise SearcherError(sim.custom.failure)
    searcher = config.searcher
    lengths = Counter(sim.trained.values())
    known = [u for u in sim.trained.values() if u is not None]
    rung_rows: list[RungRow] = []
    bracket_rows: list[BracketRow] = []
    for b, bracket in enumerate(sim.brackets):
        bracket_rows.append(
            BracketRow(b, bracket.num_rungs, bracket.max_trials, bracket.max_concurrent)
        )
        for r, units in enumerate(bracket.units):
            owners = bracket.owners[r]
            stopped = sum(1 for rid in owners if sim.trained.get(rid) == units)
            rung_rows.append(RungRow(b, r, units, len(owners), stopped))
    round_rows: list[RoundRow] = []
    if sim.pbt is not None:
        for decided in sim.pbt.rounds:
            round_rows.append(
                RoundRow(
                    round=int(decided["round"]),
                    units=sim.pbt.boundary(int(decided["round"])),
                    trials=len(decided["ranked"]),
                    stopped=len(decided["stopped"]),
                    cloned=len(decided["cloned"]),
                )
            )
    unit = searcher.length()[0] if isinstance(searcher, HalvingSearcher) else None
    if isinstance(searcher, PBTSearcher):
        unit = searcher.length_per_round.unit
    if unit is None and searcher.max_length is not None:
        unit = searcher.max_length.unit
    return PreviewResult(
        searcher=searcher.name,
        metric=searcher.metric,
        smaller_is_better=searcher.smaller_is_better,
        seed=seed,
        unit=unit,
        max_time=sim.target,
        total_trials=len(sim.trained),
        total_units=sum(known) if len(known) == len(sim.trained) else None,
        lengths=tuple(
            LengthRow(n, u) for u, n in sorted(lengths.items(), key=lambda kv: kv[0] or 0)
        ),
        brackets=tuple(bracket_rows),
        rungs=tuple(rung_rows),
        rounds=tuple(round_rows),
        startup_trials=(
            min(searcher.n_startup_trials, searcher.max_trials)
            if isinstance(searcher, TPESearcher)
            else None
        ),
    )


def render_preview(result: PreviewResult) -> str:
    """Human-readable text of a :class:`PreviewResult`."""
    unit = result.unit or "units"
    direction = "smaller" if result.smaller_is_better else "larger"
    lines = [
        f"Search: {result.searcher} on {result.metric!r} ({direction} is better), "
        f"seed {result.seed}",
    ]
    if result.max_time is not None:
        lines.append(f"Trains each trial for at most {result.max_time} {unit}.")
    lines.append(f"This search will create a total of {result.total_trials} trial(s).")
    for bracket in result.brackets:
        lines.append("")
        lines.append(
            f"Bracket {bracket.bracket + 1}: {bracket.num_rungs} rung(s), "
            f"{bracket.max_trials} trial(s), {bracket.max_concurrent_trials or 'any number'} "
            "at a time"
        )
        lines.append(f"  {'rung':>4}  {unit:>10}  {'trials':>6}  {'stopped':>7}")
        for row in (r for r in result.rungs if r.bracket == bracket.bracket):
            lines.append(f"  {row.rung + 1:>4}  {row.units:>10}  {row.trials:>6}  {row.stopped:>7}")
    if result.startup_trials is not None:
        rest = result.total_trials - result.startup_trials
        lines.append(
            f"TPE: the first {result.startup_trials} trial(s) are sampled at random (startup "
            f"phase); the other {max(rest, 0)} are suggested by TPE from the results so far."
        )
    if result.rounds:
        lines.append("")
        lines.append(
            "PBT rounds (each clone starts from its parent's checkpoint at the round end):"
        )
        lines.append(
            f"  {'round':>5}  {'ends at':>10}  {'ranked':>6}  {'stopped':>7}  {'cloned':>6}"
        )
        for rnd in result.rounds:
            lines.append(
                f"  {rnd.round + 1:>5}  {rnd.units:>10}  {rnd.trials:>6}  {rnd.stopped:>7}  "
                f"{rnd.cloned:>6}"
            )
    lines.append("")
    lines.append(f"  {'trials':>6} | training length")
    lines.append(f"  {'-' * 6}-+-{'-' * 16}")
    for length in result.lengths:
        amount = f"{length.units} {unit}" if length.units is not None else "chosen by the code"
        lines.append(f"  {length.trials:>6} | {amount}")
    if result.total_units is not None:
        lines.append(f"Total training: {result.total_units} {unit}.")
    return "\n".join(lines)
