"""Custom search methods: write a searcher in Python, ship it with the experiment's code.

A custom searcher is a subclass of :class:`SearchMethod` named by the experiment config::

    searcher:
      name: custom
      searcher_class: my_search:GreedySearch   # module:Class in the experiment's code
      metric: validation_loss
      max_trials: 20
      searcher_args: {patience: 3}             # passed to __init__ as keyword arguments

The searcher service runs it in a separate process, feeds it what happens to the trials and
records what it answers (:class:`Create` and :class:`Stop` operations) in the log. The search ends
when no trial is live and the method creates no more. See ``docs/search-methods.md``.

Determinism is required: the service rebuilds a search after a restart by feeding a fresh instance
the same calls again, so the method may draw randomness only from :attr:`SearcherContext.rng` and
must not read clocks, files or the network to decide.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Create:
    """Start a trial with ``hparams`` (made by :meth:`SearcherContext.create`)."""

    request_id: str
    hparams: dict[str, Any] = field(hash=False)


@dataclass(frozen=True)
class Stop:
    """Stop trial ``request_id`` at its next checkpoint boundary (it is not restarted)."""

    request_id: str


Operation = Create | Stop


class SearcherContext:
    """What a custom searcher may use: its seeded generator, the search space, new requests.

    Attributes:
        rng: The only source of randomness a searcher may use (seeded from the experiment).
        hyperparameters: The experiment's ``hyperparameters`` section, as written.
        metric: The searcher metric's name.
        smaller_is_better: The metric's direction.
        max_trials: The most trials the search may create (a create beyond it fails the
            experiment).
    """

    def __init__(
        self,
        *,
        seed: int,
        hyperparameters: Mapping[str, Any],
        metric: str,
        smaller_is_better: bool,
        max_trials: int,
        sampler: Any = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.hyperparameters = dict(hyperparameters)
        self.metric = metric
        self.smaller_is_better = smaller_is_better
        self.max_trials = max_trials
        self._sampler = sampler
        self._next = 1

    def sample(self) -> dict[str, Any]:
        """A random point of the search space, drawn from :attr:`rng`."""
        if self._sampler is None:
            raise RuntimeError("this context has no search space to sample")
        return dict(self._sampler(self.rng))

    def create(self, hparams: Mapping[str, Any] | None = None) -> Create:
        """A new trial request (sampled hyperparameters unless given); return it as an operation.

        Request ids are ``r0001``, ``r0002``, ... in the order of these calls.
        """
        values = self.sample() if hparams is None else dict(hparams)
        request_id = f"r{self._next:04d}"
        self._next += 1
        return Create(request_id, values)


class SearchMethod:
    """Base class of custom searchers; override the hooks you need.

    Args:
        context: The search's :class:`SearcherContext`.
        **searcher_args: The config's ``searcher.searcher_args``.
    """

    def __init__(self, context: SearcherContext, **searcher_args: Any) -> None:
        self.context = context
        self.searcher_args = searcher_args

    def initial_operations(self) -> list[Operation]:
        """Operations to start with (called once)."""
        return []

    def on_trial_created(self, request_id: str) -> list[Operation]:
        """The trial for ``request_id`` exists."""
        return []

    def on_validation(
        self, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """A live trial reported ``metric`` (as reported: apply ``smaller_is_better`` yourself)
        at ``time_value`` on the time axis (batches, or the legacy ``max_length`` unit)."""
        return []

    def on_trial_exited(self, request_id: str, reason: str | None) -> list[Operation]:
        """The trial ended for good; ``reason`` is ``None`` for a normal end, else ``errored``,
        ``user_canceled`` or ``invalid_hp``."""
        return []
