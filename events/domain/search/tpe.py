"""TPE search: Optuna's tree-structured Parzen estimator suggests each new trial's hyperparameters.

The sampler lives in an in-memory Optuna study seeded from the search's generator. A trial's
hyperparameters are asked for when its ``Create`` is made; the trial's last reported searcher
metric is told when it closes (a trial that closes without a finite metric, or with invalid
hyperparameters, is told as failed). The strategy records every ask and tell in order; that
history is its state, and :meth:`TPEStrategy.load` rebuilds the study by repeating it against a
freshly seeded sampler. Because the sampler is deterministic for a given seed and call sequence,
the rebuilt study suggests exactly what the original would have next.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Literal

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import Trial, TrialState

from events.domain.config import CategoricalHP, ConstHP, DoubleHP, IntHP, LeafHP
from events.domain.config.hyperparameters import iter_leaves
from events.domain.search.base import (
    TRIAL_SEED_BOUND,
    Create,
    Operation,
    SearchContext,
    SearcherError,
)
from events.domain.search.random_search import RandomStrategy

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _param_name(path: tuple[str, ...]) -> str:
    return "/".join(path)


def distribution(hp: LeafHP) -> BaseDistribution | None:
    """The Optuna distribution for one hyperparameter (``None`` for a constant).

    ``int`` and ``double`` map to their ranges; ``log`` to its exponent range (the value is
    ``base ** exponent``, so the sampler models it on a log scale); ``categorical`` to the
    indices of its values, since those may be any JSON value and Optuna's choices may not.
    """
    if isinstance(hp, ConstHP):
        return None
    if isinstance(hp, IntHP):
        return IntDistribution(hp.minval, hp.maxval)
    if isinstance(hp, CategoricalHP):
        return CategoricalDistribution(list(range(len(hp.vals))))
    return FloatDistribution(float(hp.minval), float(hp.maxval))


def _value(hp: LeafHP, param: Any) -> Any:
    if isinstance(hp, ConstHP):
        return copy.deepcopy(hp.val)
    if isinstance(hp, IntHP):
        return int(param)
    if isinstance(hp, CategoricalHP):
        return copy.deepcopy(hp.vals[int(param)])
    if isinstance(hp, DoubleHP):
        return float(param)
    return float(hp.base ** float(param))


class TPEStrategy(RandomStrategy):
    """Random search's budget and concurrency rules, with TPE choosing the hyperparameters.

    Args:
        hparams: The experiment's hyperparameters.
        max_trials: Trials to run in all (``invalid_hp`` exits give their place back).
        max_concurrent_trials: Live trials at most (0: no limit).
        n_startup_trials: Trials sampled at random before TPE takes over.
        smaller_is_better: Direction of the searcher metric.
        target_units: Length a trial trains for when known, used only for progress.
    """

    def __init__(
        self,
        hparams: Mapping[str, Any],
        max_trials: int,
        max_concurrent_trials: int,
        n_startup_trials: int,
        smaller_is_better: bool,
        target_units: int | None = None,
    ) -> None:
        super().__init__(max_trials, max_concurrent_trials, target_units)
        self.leaves = list(iter_leaves(hparams))
        self.space: dict[str, BaseDistribution] = {}
        for path, hp in self.leaves:
            dist = distribution(hp)
            if dist is not None:
                self.space[_param_name(path)] = dist
        self.n_startup_trials = n_startup_trials
        self.direction: Literal["minimize", "maximize"] = (
            "minimize" if smaller_is_better else "maximize"
        )
        self.sampler_seed: int | None = None
        self.history: list[list[Any]] = []
        self.last_metric: dict[str, float] = {}
        self.exits: dict[str, str] = {}
        self.pending: dict[str, Trial] = {}
        self.told: set[str] = set()
        self.study: optuna.Study | None = None

    # -- the study --------------------------------------------------------------------------

    def _open(self, seed: int) -> optuna.Study:
        self.sampler_seed = seed
        sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.n_startup_trials)
        self.study = optuna.create_study(sampler=sampler, direction=self.direction)
        self.pending = {}
        return self.study

    def _ask(self, request_id: str) -> dict[str, Any]:
        assert self.study is not None
        trial = self.study.ask(self.space)
        self.pending[request_id] = trial
        return {name: trial.params[name] for name in sorted(self.space)}

    def _tell(self, request_id: str, value: float | None) -> None:
        assert self.study is not None
        trial = self.pending.pop(request_id)
        if value is None:
            self.study.tell(trial, state=TrialState.FAIL)
        else:
            self.study.tell(trial, value)

    def _hparams(self, params: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, hp in self.leaves:
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = _value(hp, params.get(_param_name(path)))
        return out

    # -- strategy ---------------------------------------------------------------------------

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Seeds the sampler from the search's generator, then fills the concurrency limit."""
        self._open(ctx.rng.randrange(TRIAL_SEED_BOUND))
        return super().initial(ctx)

    def _create(self, ctx: SearchContext) -> Create:
        request_id = f"r{ctx.next_request:04d}"
        params = self._ask(request_id)
        create = ctx.create(self._hparams(params))
        if create.request_id != request_id:
            raise SearcherError(f"expected request {request_id!r}, made {create.request_id!r}")
        self.history.append(["ask", request_id, params])
        return create

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """Keeps the trial's latest metric (told when it closes) and tracks progress."""
        self.last_metric[request_id] = metric
        return super().validation(ctx, request_id, metric, time_value)

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Notes the reason: a trial with invalid hyperparameters is told as failed."""
        self.exits[request_id] = reason
        return super().exited_early(ctx, request_id, reason)

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """Tells the trial's result to the sampler, then refills the freed place."""
        if request_id in self.pending and request_id not in self.told:
            metric = self.last_metric.get(request_id)
            value = None
            if (
                metric is not None
                and math.isfinite(metric)
                and self.exits.get(request_id) != "invalid_hp"
            ):
                value = metric
            self._tell(request_id, value)
            self.told.add(request_id)
            self.history.append(["tell", request_id, value])
        return super().closed(ctx, request_id)

    def reopened(self, ctx: SearchContext, request_id: str) -> None:
        """A continued trial is live again; its result was already told and stays as told."""
        self.exits.pop(request_id, None)
        super().reopened(ctx, request_id)

    def state(self) -> dict[str, Any]:
        """JSON-able state: the random-search bookkeeping plus the ask/tell history."""
        return {
            **super().state(),
            "sampler_seed": self.sampler_seed,
            "history": copy.deepcopy(self.history),
            "last_metric": dict(self.last_metric),
            "exits": dict(self.exits),
            "told": sorted(self.told),
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`, rebuilding the study by repeating its asks and tells.

        Raises:
            SearcherError: A repeated ask suggested something else than recorded (the sampler
                is not the one that made the history).
        """
        super().load(state)
        self.last_metric = {str(k): float(v) for k, v in state["last_metric"].items()}
        self.exits = {str(k): str(v) for k, v in state["exits"].items()}
        self.told = set(state["told"])
        self.history = []
        self.study = None
        seed = state["sampler_seed"]
        if seed is None:
            return
        self._open(int(seed))
        for kind, request_id, payload in state["history"]:
            if kind == "ask":
                params = self._ask(request_id)
                if params != payload:
                    raise SearcherError(
                        f"rebuilding the TPE study: request {request_id!r} got {params}, "
                        f"recorded {payload}"
                    )
            else:
                self._tell(request_id, None if payload is None else float(payload))
            self.history.append([kind, request_id, copy.deepcopy(payload)])
