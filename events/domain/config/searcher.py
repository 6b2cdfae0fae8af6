"""Searcher configs, one model per ``name``: single, random, grid, async_halving, adaptive_asha,
tpe, pbt, custom."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from events.domain.config.common import (
    ConfigModel,
    Length,
    PositiveInt,
    field_error,
    length_from_int,
)
from events.domain.config.limits import (
    MAX_DIVISOR,
    MAX_ID,
    MAX_PBT_ROUNDS,
    MAX_RUNGS,
    MAX_TPE_TRIALS,
    MAX_TRIALS,
)

LegacyLength = Annotated[Length, BeforeValidator(length_from_int)]
"""Deprecated ``max_length``: ``{batches|records|epochs: N}`` or a bare integer of batches."""

SEARCHER_NAMES = (
    "single",
    "random",
    "grid",
    "async_halving",
    "adaptive_asha",
    "tpe",
    "pbt",
    "custom",
)

MaxTrials = Annotated[int, Field(ge=1, le=MAX_TRIALS)]
MaxConcurrentTrials = Annotated[int, Field(ge=0, le=MAX_TRIALS)]
Rungs = Annotated[int, Field(ge=1, le=MAX_RUNGS)]


class _SearcherBase(ConfigModel):
    name: str
    metric: str = Field(min_length=1)
    smaller_is_better: bool = True
    source_trial_id: Annotated[int, Field(ge=1, le=MAX_ID)] | None = None
    source_checkpoint_uuid: str | None = None
    max_length: LegacyLength | None = None


class SingleSearcher(_SearcherBase):
    """One trial with the hyperparameters as given (random draws for non-const ones)."""

    name: Literal["single"]


class RandomSearcher(_SearcherBase):
    """``max_trials`` trials with independently sampled hyperparameters."""

    name: Literal["random"]
    max_trials: MaxTrials
    max_concurrent_trials: MaxConcurrentTrials = 16


class GridSearcher(_SearcherBase):
    """One trial per point of the hyperparameter grid."""

    name: Literal["grid"]
    max_concurrent_trials: MaxConcurrentTrials = 16


class _HalvingBase(_SearcherBase):
    max_trials: MaxTrials
    max_concurrent_trials: MaxConcurrentTrials = 16
    divisor: float = Field(4.0, gt=1, le=MAX_DIVISOR)
    time_metric: str | None = Field(None, min_length=1)
    max_time: PositiveInt | None = None
    stop_once: bool | None = None

    @model_validator(mode="after")
    def _has_length(self) -> _HalvingBase:
        if self.time_metric is not None and self.max_time is None:
            raise field_error("max_time", "required when time_metric is set")
        if self.max_time is not None and self.time_metric is None:
            raise field_error("time_metric", "required when max_time is set")
        if self.time_metric is None:
            if self.max_length is None:
                name = getattr(self, "name", "asha")
                raise field_error(
                    "time_metric", f"{name} needs time_metric and max_time (or legacy max_length)"
                )
            if self.max_length.units < 1:
                raise field_error("max_length", f"must be at least 1 {self.max_length.unit}, got 0")
        return self

    def length(self) -> tuple[str, int]:
        """The time axis of the rungs: ``(metric name, max value)``.

        ``time_metric``/``max_time`` win; the legacy ``max_length`` gives its unit's name
        (``batches``, ``records`` or ``epochs``) and its count.
        """
        if self.time_metric is not None and self.max_time is not None:
            return self.time_metric, self.max_time
        assert self.max_length is not None
        return self.max_length.unit, self.max_length.units


class AsyncHalvingSearcher(_HalvingBase):
    """Asynchronous successive halving (stop-based ASHA) with a fixed number of rungs."""

    name: Literal["async_halving"]
    num_rungs: Rungs


class AdaptiveASHASearcher(_HalvingBase):
    """Several ASHA brackets with different early-stopping aggressiveness."""

    name: Literal["adaptive_asha"]
    mode: Literal["aggressive", "standard", "conservative"] = "standard"
    max_rungs: Rungs = 5
    bracket_rungs: list[Rungs] = Field(default_factory=list, max_length=MAX_RUNGS)


class TPESearcher(_SearcherBase):
    """Tree-structured Parzen estimator search: each new trial's hyperparameters are suggested
    from the searcher metric of the trials closed so far (random for the first
    ``n_startup_trials``)."""

    name: Literal["tpe"]
    max_trials: Annotated[int, Field(ge=1, le=MAX_TPE_TRIALS)]
    max_concurrent_trials: MaxConcurrentTrials = 16
    n_startup_trials: Annotated[int, Field(ge=1, le=MAX_TPE_TRIALS)] = 10

    @model_validator(mode="after")
    def _startup_fits(self) -> TPESearcher:
        if self.n_startup_trials > self.max_trials:
            raise field_error(
                "n_startup_trials",
                f"must be at most max_trials ({self.max_trials}), got {self.n_startup_trials}",
            )
        return self


class PBTReplaceFunction(ConfigModel):
    """Which trials a round closes: the worst ``truncate_fraction`` of the population."""

    truncate_fraction: float = Field(gt=0, le=0.5)


class PBTExploreFunction(ConfigModel):
    """How a clone's hyperparameters differ from its parent's: each is drawn anew with
    ``resample_probability``, else scaled up or down by ``perturb_factor`` (numeric ones) or
    kept (categorical ones)."""

    resample_probability: float = Field(ge=0, le=1)
    perturb_factor: float = Field(ge=0, le=1)


class PBTSearcher(_SearcherBase):
    """Population-based training: ``population_size`` trials train ``length_per_round`` per
    round; after each round the worst ``truncate_fraction`` are closed and replaced by clones of
    the best, warm-started from their checkpoints with explored hyperparameters."""

    name: Literal["pbt"]
    population_size: Annotated[int, Field(ge=2, le=MAX_TRIALS)]
    num_rounds: Annotated[int, Field(ge=1, le=MAX_PBT_ROUNDS)]
    length_per_round: LegacyLength
    replace_function: PBTReplaceFunction
    explore_function: PBTExploreFunction

    @model_validator(mode="after")
    def _round_has_length(self) -> PBTSearcher:
        if self.length_per_round.units < 1:
            raise field_error(
                "length_per_round", f"must be at least 1 {self.length_per_round.unit}, got 0"
            )
        if self.population_size * self.num_rounds > MAX_TRIALS:
            raise field_error(
                "num_rounds",
                f"population_size * num_rounds must be at most {MAX_TRIALS}, got "
                f"{self.population_size * self.num_rounds}",
            )
        return self


class CustomSearcher(_SearcherBase):
    """A search method written by the user: ``searcher_class`` (``module:Class``) is loaded from
    the experiment's code and run by the searcher service in a sandboxed process (see
    docs/search-methods.md)."""

    name: Literal["custom"]
    searcher_class: str = Field(
        min_length=3, max_length=200, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
    )
    max_trials: MaxTrials
    max_concurrent_trials: MaxConcurrentTrials = 16
    searcher_args: dict[str, Any] = Field(default_factory=dict)


SearcherConfig = Annotated[
    SingleSearcher
    | RandomSearcher
    | GridSearcher
    | AsyncHalvingSearcher
    | AdaptiveASHASearcher
    | TPESearcher
    | PBTSearcher
    | CustomSearcher,
    Field(discriminator="name"),
]
"""Any searcher config, chosen by its ``name``."""

HalvingSearcher = AsyncHalvingSearcher | AdaptiveASHASearcher
