"""Search methods: pure, deterministic state machines that decide which trials to run.

Use :func:`make_method` to build the method for a config; see :mod:`.base` for the protocol.
"""

from __future__ import annotations

from events.domain.config import (
    AdaptiveASHASearcher,
    AsyncHalvingSearcher,
    ExperimentConfig,
    GridSearcher,
    PBTSearcher,
    RandomSearcher,
    SingleSearcher,
    TPESearcher,
)
from events.domain.search.adaptive_asha import (
    AdaptiveASHAStrategy,
    bracket_max_concurrent,
    bracket_max_trials,
    bracket_rungs_for,
    max_rungs_for,
)
from events.domain.search.asha import ASHAStrategy
from events.domain.search.base import (
    EXIT_REASONS,
    Create,
    ExitReason,
    Operation,
    SearchContext,
    SearcherError,
    SearchMethod,
    SearchStrategy,
    Shutdown,
    Stop,
    read_validation,
)
from events.domain.search.grid import GridStrategy
from events.domain.search.pbt import PBTStrategy
from events.domain.search.random_search import RandomStrategy
from events.domain.search.single import SingleStrategy
from events.domain.search.tpe import TPEStrategy

__all__ = [
    "EXIT_REASONS",
    "ASHAStrategy",
    "AdaptiveASHAStrategy",
    "Create",
    "ExitReason",
    "GridStrategy",
    "Operation",
    "PBTStrategy",
    "RandomStrategy",
    "SearchContext",
    "SearchMethod",
    "SearchStrategy",
    "SearcherError",
    "Shutdown",
    "SingleStrategy",
    "Stop",
    "TPEStrategy",
    "adaptive_brackets",
    "make_method",
    "make_strategy",
    "read_validation",
]


def adaptive_brackets(searcher: AdaptiveASHASearcher) -> list[ASHAStrategy]:
    """The ASHA brackets an adaptive search runs, deepest first."""
    _, max_time = searcher.length()
    rungs = sorted(searcher.bracket_rungs, reverse=True)
    if not rungs:
        depth = max_rungs_for(searcher.max_rungs, searcher.divisor, max_time, searcher.max_trials)
        rungs = bracket_rungs_for(searcher.mode, depth)
    trials = bracket_max_trials(searcher.max_trials, searcher.divisor, rungs)
    concurrency = bracket_max_concurrent(searcher.max_concurrent_trials, searcher.divisor, trials)
    return [
        ASHAStrategy(
            num_rungs=r,
            divisor=searcher.divisor,
            max_trials=t,
            max_concurrent_trials=c,
            max_time=max_time,
            smaller_is_better=searcher.smaller_is_better,
        )
        for r, t, c in zip(rungs, trials, concurrency, strict=True)
    ]


def make_strategy(config: ExperimentConfig) -> SearchStrategy:
    """The bare algorithm for ``config.searcher`` (without bookkeeping)."""
    searcher = config.searcher
    target = searcher.max_length.units if searcher.max_length is not None else None
    if isinstance(searcher, SingleSearcher):
        return SingleStrategy(target_units=target)
    if isinstance(searcher, RandomSearcher):
        return RandomStrategy(searcher.max_trials, searcher.max_concurrent_trials, target)
    if isinstance(searcher, TPESearcher):
        return TPEStrategy(
            config.hyperparameters,
            max_trials=searcher.max_trials,
            max_concurrent_trials=searcher.max_concurrent_trials,
            n_startup_trials=searcher.n_startup_trials,
            smaller_is_better=searcher.smaller_is_better,
            target_units=target,
        )
    if isinstance(searcher, PBTSearcher):
        return PBTStrategy(
            population_size=searcher.population_size,
            num_rounds=searcher.num_rounds,
            length_per_round=searcher.length_per_round.units,
            truncate_fraction=searcher.replace_function.truncate_fraction,
            resample_probability=searcher.explore_function.resample_probability,
            perturb_factor=searcher.explore_function.perturb_factor,
            smaller_is_better=searcher.smaller_is_better,
        )
    if isinstance(searcher, GridSearcher):
        return GridStrategy(config.hyperparameters, searcher.max_concurrent_trials, target)
    if isinstance(searcher, AsyncHalvingSearcher):
        _, max_time = searcher.length()
        return ASHAStrategy(
            num_rungs=searcher.num_rungs,
            divisor=searcher.divisor,
            max_trials=searcher.max_trials,
            max_concurrent_trials=searcher.max_concurrent_trials,
            max_time=max_time,
            smaller_is_better=searcher.smaller_is_better,
        )
    if isinstance(searcher, AdaptiveASHASearcher):
        return AdaptiveASHAStrategy(adaptive_brackets(searcher))
    raise SearcherError(f"searcher {searcher.name!r} is built from the experiment's code")


def make_method(config: ExperimentConfig, strategy: SearchStrategy | None = None) -> SearchMethod:
    """Builds the search method for a validated config (around ``strategy`` when given: a
    custom searcher's, which the service builds with the experiment's code).

    Raises:
        SearcherError: The config has no ``experiment_seed`` (``parse_config`` always sets one).
    """
    seed = config.reproducibility.experiment_seed
    if seed is None:
        raise SearcherError("config has no reproducibility.experiment_seed; use parse_config")
    searcher = config.searcher
    if isinstance(searcher, SingleSearcher):
        cap = 1
    elif isinstance(searcher, PBTSearcher):
        cap = 0  # the population is the limit
    else:
        cap = searcher.max_concurrent_trials
    return SearchMethod(
        searcher.name,
        strategy if strategy is not None else make_strategy(config),
        seed=seed,
        hparams=config.hyperparameters,
        max_concurrent_trials=cap,
    )
