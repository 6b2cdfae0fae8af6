"""Population-based training (PBT), with Determined's configuration fields.

``population_size`` trials start together. Round ``k`` (0-based) ends, for the trials in the
population, at ``(k + 1) * length_per_round`` on the time axis (the unit of ``length_per_round``,
read from each validation's metrics). A trial's first validation at or past a round's end is its
result for that round. Once every member has a result for the current round:

* in the last round, every member still live is stopped and the search ends;
* otherwise the worst ``max(floor(truncate_fraction * population_size), 1)`` members are stopped,
  and each of the same number of best members is cloned: the clone's hyperparameters are the
  parent's, explored (each one drawn anew with ``resample_probability``, else numeric ones
  multiplied by ``1 + perturb_factor`` or ``1 - perturb_factor`` and clipped to their range,
  categorical and constant ones kept), and it starts from the parent's checkpoint. The survivors
  and the clones form the next round's population.

A clone starts from its parent's first checkpoint at or past the round's end (digits and most
training code checkpoint right after validating), so from the parent's state at the round's end
even when the parent trained on while slower members finished the round. It is created once
that checkpoint exists, or at once if the parent is closed without one: it then starts from the
parent's latest checkpoint, whatever its age (or from scratch if there is none). Its hyperparameters and seed
are drawn when the round is decided, in rank order, so the generator's sequence does not depend
on when checkpoints arrive. Members that close before reporting the current round leave the
population; the round is decided over the rest.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from events.domain.config import CategoricalHP, ConstHP, DoubleHP, IntHP, LeafHP
from events.domain.config.hyperparameters import iter_leaves
from events.domain.search.asha import WORST
from events.domain.search.base import (
    Create,
    Operation,
    SearchContext,
    SearcherError,
    SearchStrategy,
    Stop,
)
from events.domain.search.sampling import sample_one


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _get(hparams: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = hparams
    for part in path:
        node = node[part]
    return node


def _set(hparams: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = hparams
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def truncate_count(population_size: int, truncate_fraction: float) -> int:
    """How many members each round closes (and clones): at least one."""
    return max(int(population_size * truncate_fraction), 1)


class PBTStrategy(SearchStrategy):
    """Population-based training (see the module docstring).

    Args:
        population_size: Trials in each round.
        num_rounds: Rounds to run.
        length_per_round: Length of a round on the time axis.
        truncate_fraction: Share of the population replaced each round.
        resample_probability: Chance a clone's hyperparameter is drawn anew.
        perturb_factor: Relative change of a numeric hyperparameter that is not redrawn.
        smaller_is_better: Direction of the searcher metric.
    """

    def __init__(
        self,
        population_size: int,
        num_rounds: int,
        length_per_round: int,
        truncate_fraction: float,
        resample_probability: float,
        perturb_factor: float,
        smaller_is_better: bool = True,
    ) -> None:
        self.population_size = population_size
        self.num_rounds = num_rounds
        self.length = length_per_round
        self.truncate = truncate_count(population_size, truncate_fraction)
        self.resample_probability = resample_probability
        self.perturb_factor = perturb_factor
        self.smaller_is_better = smaller_is_better
        self.round = 0
        self.members: list[str] = []
        self.hparams: dict[str, dict[str, Any]] = {}
        self.joined: dict[str, int] = {}
        # Per trial: round -> signed metric (smaller is better).
        self.results: dict[str, dict[int, float]] = {}
        # Per trial: its checkpoints as [uuid, steps], in increasing steps.
        self.checkpoints: dict[str, list[list[Any]]] = {}
        self.closed_ids: set[str] = set()
        self.stopped: set[str] = set()
        self.waiting: list[Create] = []
        self.lineage: list[dict[str, Any]] = []
        # Per decided round: how many were ranked, which were stopped, which were cloned.
        self.rounds: list[dict[str, Any]] = []
        self.finished = False

    # -- helpers ----------------------------------------------------------------------------

    def boundary(self, round_no: int) -> int:
        """Where round ``round_no`` ends on the time axis."""
        return (round_no + 1) * self.length

    def _signed(self, metric: float) -> float:
        if math.isnan(metric):
            return WORST
        value = metric if self.smaller_is_better else -metric
        return min(max(value, -WORST), WORST)

    def _explore(
        self, ctx: SearchContext, parent: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        hparams = copy.deepcopy(dict(parent))
        change: dict[str, Any] = {}
        for path, hp in iter_leaves(ctx.hparams):
            old = _get(parent, path)
            new = self._explore_one(ctx, hp, old)
            if new != old:
                _set(hparams, path, new)
                change[_dotted(path)] = {"from": old, "to": new}
        return hparams, change

    def _explore_one(self, ctx: SearchContext, hp: LeafHP, old: Any) -> Any:
        if isinstance(hp, ConstHP):
            return copy.deepcopy(old)
        if ctx.rng.random() < self.resample_probability:
            return sample_one(hp, ctx.rng)
        if isinstance(hp, CategoricalHP):
            return copy.deepcopy(old)
        factor = 1 + self.perturb_factor if ctx.rng.random() < 0.5 else 1 - self.perturb_factor
        if isinstance(hp, IntHP):
            return min(max(round(old * factor), hp.minval), hp.maxval)
        if isinstance(hp, DoubleHP):
            return min(max(float(old) * factor, hp.minval), hp.maxval)
        lo, hi = hp.base**hp.minval, hp.base**hp.maxval
        return min(max(float(old) * factor, min(lo, hi)), max(lo, hi))

    def _warm_start(self, parent: str, round_end: int) -> tuple[str | None, int] | None:
        """The parent's first checkpoint at or past ``round_end``; its latest one if it is
        closed and has none there; ``None`` while it is live and has none there yet."""
        saved = self.checkpoints.get(parent, [])
        for uuid, steps in saved:
            if steps >= round_end:
                return str(uuid), int(steps)
        if parent not in self.closed_ids:
            return None
        if saved:
            return str(saved[-1][0]), int(saved[-1][1])
        return None, 0

    def _release(self, *, parent_closed: str | None = None) -> list[Operation]:
        """Clones whose parent now has a checkpoint past the round's end (or has closed)."""
        ops: list[Operation] = []
        still: list[Create] = []
        for clone in self.waiting:
            assert clone.parent is not None and clone.round is not None
            found = self._warm_start(clone.parent, self.boundary(clone.round - 1))
            if found is None:
                still.append(clone)
                continue
            uuid, steps = found
            made = Create(
                request_id=clone.request_id,
                hparams=clone.hparams,
                trial_seed=clone.trial_seed,
                parent=clone.parent,
                round=clone.round,
                change=clone.change,
                warm_start=uuid,
                warm_start_steps=steps,
            )
            self.lineage.append(
                {
                    "request_id": made.request_id,
                    "parent": made.parent,
                    "round": made.round,
                    "change": copy.deepcopy(made.change),
                    "warm_start": uuid,
                    "warm_start_steps": steps,
                }
            )
            ops.append(made)
        self.waiting = still
        return ops

    def _decide(self, ctx: SearchContext) -> list[Operation]:
        """Decides every round whose results are all in (usually at most one)."""
        ops: list[Operation] = []
        while not self.finished and self.members:
            if any(self.round not in self.results.get(r, {}) for r in self.members):
                break
            order = {r: i for i, r in enumerate(self.members)}
            ranked = sorted(self.members, key=lambda r: (self.results[r][self.round], order[r]))
            if self.round == self.num_rounds - 1:
                self.finished = True
                ops += [self._stop(r) for r in ranked if r not in self.closed_ids]
                self.members = []
                self.rounds.append(
                    {"round": self.round, "ranked": ranked, "stopped": [], "cloned": []}
                )
                break
            count = min(self.truncate, len(ranked) // 2)
            worst = ranked[len(ranked) - count :] if count else []
            best = ranked[:count]
            ops += [self._stop(r) for r in worst if r not in self.closed_ids]
            survivors = [r for r in self.members if r not in worst and r not in self.closed_ids]
            clones: list[str] = []
            for parent in best:
                hparams, change = self._explore(ctx, self.hparams[parent])
                create = ctx.create(hparams)
                clone = Create(
                    request_id=create.request_id,
                    hparams=hparams,
                    trial_seed=create.trial_seed,
                    parent=parent,
                    round=self.round + 1,
                    change=change,
                )
                self.hparams[clone.request_id] = hparams
                self.joined[clone.request_id] = self.round + 1
                self.waiting.append(clone)
                clones.append(clone.request_id)
            self.rounds.append(
                {
                    "round": self.round,
                    "ranked": ranked,
                    "stopped": list(worst),
                    "cloned": [[p, c] for p, c in zip(best, clones, strict=True)],
                }
            )
            self.round += 1
            self.members = survivors + clones
            ops += self._release()
        return ops

    def _stop(self, request_id: str) -> Stop:
        self.stopped.add(request_id)
        return Stop(request_id)

    # -- strategy ---------------------------------------------------------------------------

    def initial(self, ctx: SearchContext) -> list[Operation]:
        """Starts the population."""
        ops: list[Operation] = []
        for _ in range(self.population_size):
            create = ctx.create()
            self.members.append(create.request_id)
            self.hparams[create.request_id] = create.hparams
            self.joined[create.request_id] = 0
            ops.append(create)
        return ops

    def validation(
        self, ctx: SearchContext, request_id: str, metric: float, time_value: float | None
    ) -> list[Operation]:
        """Records the trial's result for every round end it has now passed; may end a round."""
        if request_id not in self.joined:
            raise SearcherError(f"{request_id!r} was not created by this search")
        if time_value is None:
            raise SearcherError(f"PBT needs a time value with each validation ({request_id})")
        if request_id in self.stopped:
            return []
        results = self.results.setdefault(request_id, {})
        for round_no in range(self.joined[request_id], self.num_rounds):
            if time_value < self.boundary(round_no):
                break
            results.setdefault(round_no, self._signed(metric))
        return self._decide(ctx)

    def checkpoint(
        self, ctx: SearchContext, request_id: str, uuid: str, steps_completed: int
    ) -> list[Operation]:
        """Keeps the trial's latest checkpoint; a clone waiting for it is created."""
        saved = self.checkpoints.setdefault(request_id, [])
        if not saved or steps_completed > saved[-1][1]:
            saved.append([uuid, steps_completed])
        return self._release() if self.waiting else []

    def exited_early(self, ctx: SearchContext, request_id: str, reason: str) -> list[Operation]:
        """Nothing beyond what closing the trial does."""
        return []

    def closed(self, ctx: SearchContext, request_id: str) -> list[Operation]:
        """A member closed without the current round's result leaves the population."""
        self.closed_ids.add(request_id)
        if request_id in self.members and self.round not in self.results.get(request_id, {}):
            self.members.remove(request_id)
        return self._release() + self._decide(ctx)

    def progress(self) -> float:
        """Rounds decided over ``num_rounds``, plus the current round's reported share."""
        if self.finished:
            return 1.0
        reported = sum(1 for r in self.members if self.round in self.results.get(r, {}))
        share = reported / len(self.members) if self.members else 0.0
        return (self.round + share) / self.num_rounds

    # -- state ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "round": self.round,
            "members": list(self.members),
            "hparams": copy.deepcopy(self.hparams),
            "joined": dict(self.joined),
            "results": {r: {str(k): v for k, v in m.items()} for r, m in self.results.items()},
            "checkpoints": copy.deepcopy(self.checkpoints),
            "closed": sorted(self.closed_ids),
            "stopped": sorted(self.stopped),
            "waiting": [asdict(c) for c in self.waiting],
            "lineage": copy.deepcopy(self.lineage),
            "rounds": copy.deepcopy(self.rounds),
            "finished": self.finished,
        }

    def load(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`state`."""
        self.round = int(state["round"])
        self.members = list(state["members"])
        self.hparams = copy.deepcopy(dict(state["hparams"]))
        self.joined = {str(k): int(v) for k, v in state["joined"].items()}
        self.results = {
            str(r): {int(k): float(v) for k, v in m.items()} for r, m in state["results"].items()
        }
        self.checkpoints = {
            str(k): [[str(u), int(n)] for u, n in v] for k, v in state["checkpoints"].items()
        }
        self.closed_ids = set(state["closed"])
        self.stopped = set(state["stopped"])
        self.waiting = [Create(**c) for c in state["waiting"]]
        self.lineage = copy.deepcopy(list(state["lineage"]))
        self.rounds = copy.deepcopy(list(state["rounds"]))
        self.finished = bool(state["finished"])
