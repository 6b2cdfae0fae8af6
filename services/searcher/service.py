"""The searcher service: runs each experiment's search method over the log.

The method is a deterministic state machine fed by log events (submission, validations, trial
closures) in position order; its operations are appended as events (``TrialRequested``,
``TrialStopRequested``, the experiment's stopping state) in the same transaction that moves the
searcher's checkpoint. On start the service replays the log up to its checkpoint with appends
switched off: the methods reach exactly the state they had, including their RNGs, and nothing
already decided is decided again.

Unlike the scheduler, the searcher does not plan over a folded state: each operation is the
method's answer to one input event, applied exactly once (its appends commit with the checkpoint
that passes the event), and the method's own state records every operation it produced. No later
decision can therefore miss an earlier one, whatever position a wake-up stops at. Its appends
carry no expected version on purpose: a decision is right as of its input's position, and the
experiment stream's version at that position is behind whenever a later event sits on the stream,
so the check would fail on every retry. The one decision that can be overtaken, the experiment's
stopping state, is checked at append time instead: under the store's append lock the experiment's
state is folded from its stream, and a change the state machine refuses (the user killed the
experiment after the input event) is dropped, not appended.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from events import lifecycle
from events.config import ConfigError, ExperimentConfig, parse_config
from events.consumer import Consumer
from events.envelope import Event, RecordedEvent
from events.store import EventStore, Transaction
from events.types import ExperimentStateChanged, TrialRequested, TrialStopRequested
from services.searcher.methods import (
    Create,
    Operation,
    SearcherError,
    SearchMethod,
    Shutdown,
    Stop,
    make_method,
    read_validation,
)

log = structlog.get_logger("searcher")

TYPES = frozenset(
    {
        "ExperimentSubmitted",
        "ExperimentStateChanged",
        "ExperimentContinued",
        "ValidationReported",
        "TrialEarlyExited",
        "TrialStateChanged",
    }
)
TERMINAL_TRIAL = frozenset({"COMPLETED", "CANCELED", "ERROR"})
_EARLY_REASON = {
    "invalid_hp": "invalid_hp",
    "user_requested_stop": "user_canceled",
    "errored": "errored",
}


@dataclass
class Search:
    """One experiment's search: its method and the trial <-> request mapping."""

    experiment_id: int
    config: ExperimentConfig
    method: SearchMethod
    state: str = "ACTIVE"
    trials: int = 0
    trial_of: dict[str, str] = field(default_factory=dict)
    request_of: dict[str, str] = field(default_factory=dict)
    early: dict[str, str] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    shut_down: bool = False


class SearcherConsumer(Consumer):
    """Feeds each experiment's search method and records its operations."""

    name = "searcher"
    types = TYPES

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.searches: dict[int, Search] = {}
        self.replaying = False
        self._pending: list[tuple[str, Event]] = []

    async def rebuild(self) -> None:
        """Replays the log up to the checkpoint, rebuilding every method without appending."""
        self.searches = {}
        checkpoint = await self.store.checkpoint(self.name)
        self.replaying = True
        try:
            async for event in self.store.iter_all(0, types=TYPES):
                if event.position > checkpoint:
                    break
                self.apply(event)
        finally:
            self.replaying = False
            self._pending = []

    async def on_rollback(self) -> None:
        await self.rebuild()

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        self.apply(event)
        pending, self._pending = self._pending, []
        for stream_id, fact in pending:
            if isinstance(fact, ExperimentStateChanged) and not await _still_legal(
                tx, stream_id, fact
            ):
                continue
            await tx.append(stream_id, [fact])

    def apply(self, event: RecordedEvent) -> None:
        """Advances the methods by one log event; operations are queued for appending."""
        p = event.payload
        if event.type == "ExperimentSubmitted":
            self._submitted(p)
            return
        if event.type == "ExperimentStateChanged":
            search = self.searches.get(p["experiment_id"])
            if search is not None:
                search.state = p["state"]
            return
        if event.type == "ExperimentContinued":
            self._continued(p)
            return
        trial_id = str(p.get("trial_id", ""))
        search = self.searches.get(int(trial_id.split(".", 1)[0])) if trial_id else None
        if search is None or trial_id not in search.request_of or trial_id in search.closed:
            return
        request_id = search.request_of[trial_id]
        if event.type == "ValidationReported":
            try:
                metric, time_value = read_validation(
                    search.config.searcher, p["metrics"], p.get("steps_completed")
                )
            except SearcherError as exc:
                log.warning("validation ignored", trial=trial_id, error=str(exc))
                return
            self._run(search, search.method.on_validation(request_id, metric, time_value))
        elif event.type == "TrialEarlyExited":
            search.early[trial_id] = _EARLY_REASON.get(p["reason"], "errored")
        elif event.type == "TrialStateChanged" and p["state"] in TERMINAL_TRIAL:
            search.closed.add(trial_id)
            reason = search.early.get(trial_id)
            if p["state"] == "ERROR":
                reason = "errored"
            elif p["state"] == "CANCELED":
                reason = reason or "user_canceled"
            if reason is not None:
                self._run(search, search.method.on_trial_exited_early(request_id, reason))
            self._run(search, search.method.on_trial_closed(request_id))

    def _submitted(self, p: dict[str, Any]) -> None:
        exp_id = int(p["experiment_id"])
        try:
            config = parse_config(p["config"])
            method = make_method(config)
        except (ConfigError, SearcherError) as exc:
            log.error("experiment has no usable search", experiment=exp_id, error=str(exc))
            return
        state = "ACTIVE" if p.get("activate", True) else "PAUSED"
        search = Search(exp_id, config, method, state=state)
        self.searches[exp_id] = search
        self._run(search, method.initial_operations())

    def _continued(self, p: dict[str, Any]) -> None:
        """A user continued the ended experiment's trial: the search is open again until that
        trial closes once more (the gateway only continues single-trial experiments)."""
        search = self.searches.get(int(p["experiment_id"]))
        trial_id = str(p["trial_id"])
        if search is None or search.state not in lifecycle.TERMINAL:
            return  # refused by the experiment's state machine too
        request_id = search.request_of.get(trial_id)
        if request_id is None:
            return
        try:
            search.method.on_trial_continued(request_id)
        except SearcherError as exc:
            log.error("continued trial not reopened", trial=trial_id, error=str(exc))
            return
        search.state = "ACTIVE"
        search.shut_down = False
        search.closed.discard(trial_id)
        search.early.pop(trial_id, None)

    def _run(self, search: Search, ops: list[Operation]) -> None:
        stream = f"experiment-{search.experiment_id}"
        for op in ops:
            if isinstance(op, Create) and search.state not in ("ACTIVE", "PAUSED"):
                continue  # a stopping experiment starts nothing new
            if isinstance(op, Create):
                search.trials += 1
                trial_id = f"{search.experiment_id}.{search.trials}"
                search.trial_of[op.request_id] = trial_id
                search.request_of[trial_id] = op.request_id
                self._emit(
                    stream,
                    TrialRequested(
                        experiment_id=search.experiment_id,
                        trial_id=trial_id,
                        request_id=op.request_id,
                        hparams=op.hparams,
                        trial_seed=op.trial_seed,
                    ),
                )
            elif isinstance(op, Stop):
                self._emit(
                    stream,
                    TrialStopRequested(
                        experiment_id=search.experiment_id,
                        trial_id=search.trial_of[op.request_id],
                        request_id=op.request_id,
                    ),
                )
            elif isinstance(op, Shutdown) and not search.shut_down:
                search.shut_down = True
                if search.state in ("ACTIVE", "PAUSED"):
                    state = (
                        "STOPPING_ERROR"
                        if op.failure
                        else "STOPPING_CANCELED"
                        if op.cancel
                        else "STOPPING_COMPLETED"
                    )
                    self._emit(
                        stream,
                        ExperimentStateChanged(
                            experiment_id=search.experiment_id,
                            state=state,
                            reason="search finished",
                            actor="searcher",
                        ),
                    )

    def _emit(self, stream_id: str, fact: Event) -> None:
        if not self.replaying:
            self._pending.append((stream_id, fact))


async def _still_legal(tx: Transaction, stream_id: str, fact: ExperimentStateChanged) -> bool:
    """Whether the experiment, as its stream stands now, may still make the change ``fact``."""
    await tx.lock_appends()
    current = lifecycle.fold_experiment(await tx.read_stream(stream_id)).state
    try:
        lifecycle.check_experiment(current, fact.state)
    except lifecycle.IllegalTransitionError as exc:
        log.info("stopping state overtaken", experiment=fact.experiment_id, reason=str(exc))
        return False
    return True
