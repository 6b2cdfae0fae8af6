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

A new trial's id is taken from the ``trial_ids`` sequence in the transaction that appends its
``TrialRequested``. Replay never takes one: the searcher also reads its own ``TrialRequested``
facts and learns each request's trial id from them, as recorded.

A custom searcher (a user's code) never runs here, neither on this event loop nor inside a
consumer transaction. Its method's inputs become numbered calls in the fold
(:mod:`events.domain.search.custom`); after each commit the leader hands the due calls to
:class:`~services.searcher.custom_worker.CustomWorkers`, which ask them in a sandboxed process
and record each answer as a fact (``CustomSearcherAnswered`` / ``CustomSearcherFailed``) in a
transaction of their own. The fold applies those facts like any other input, so a rebuild or a
standby folds a custom search from the log alone and never starts its code; only the leader's
workers run it, and only for a live search with a call due.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from events.domain import lifecycle
from events.domain.aggregates import (
    ExperimentView,
    TrialView,
    apply_experiment,
    apply_trial,
    fold_experiment,
)
from events.domain.config import ConfigError, CustomSearcher, ExperimentConfig, parse_config
from events.domain.names import experiment_stream
from events.domain.search import (
    Create,
    Operation,
    SearcherError,
    SearchMethod,
    Shutdown,
    Stop,
    make_method,
    read_validation,
)
from events.domain.search.custom import CustomStrategy
from events.domain.types import (
    CheckpointSaved,
    CustomSearcherAnswered,
    CustomSearcherFailed,
    ExperimentContinued,
    ExperimentStateChanged,
    ExperimentSubmitted,
    TrialEarlyExited,
    TrialRequested,
    TrialStateChanged,
    TrialStopRequested,
    ValidationReported,
)
from events.log.consumer import Consumer
from events.log.envelope import Event, RecordedEvent
from events.log.store import EventStore, Transaction
from services.searcher.custom_worker import ANSWER_TYPES, CustomWorkers

log = structlog.get_logger("searcher")

TYPES = frozenset(
    {
        "ExperimentSubmitted",
        "ExperimentStateChanged",
        "ExperimentContinued",
        "ValidationReported",
        "TrialEarlyExited",
        "TrialStateChanged",
        "TrialRequested",
        "CheckpointSaved",
        *ANSWER_TYPES,
    }
)
_TrialFact = ValidationReported | CheckpointSaved | TrialEarlyExited | TrialStateChanged
"""The facts of :data:`TYPES` on a trial's stream: they advance its search's method."""
_OPEN = (lifecycle.ACTIVE, lifecycle.PAUSED)
"""The states in which a search still creates trials and may end the experiment."""
_EARLY_REASON = {
    "invalid_hp": "invalid_hp",
    "user_requested_stop": "user_canceled",
    "errored": "errored",
}


@dataclass
class Search:
    """One experiment's search: its method and the trial <-> request mapping.

    ``trials`` counts the trials the method created (the next one's ``seq``); ``trial_of`` maps
    a request id to the trial id recorded for it. ``replayed`` holds, during replay, the
    hyperparameters the method chose again for requests whose ``TrialRequested`` is still ahead,
    to check them against the recorded ones.
    """

    experiment_id: int
    config: ExperimentConfig
    method: SearchMethod
    experiment: ExperimentView
    trials: int = 0
    trial_of: dict[str, int] = field(default_factory=dict)
    request_of: dict[int, str] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    trial_views: dict[int, TrialView] = field(default_factory=dict)
    """The search's trials, folded by the trial fold (state, early exit)."""
    shut_down: bool = False
    failed: bool = False
    replayed: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The experiment's state, as the experiment fold has it."""
        return self.experiment.state


@dataclass(frozen=True)
class _NewTrial:
    """A ``Create`` decided by a method, waiting for its trial id (taken at append time)."""

    experiment_id: int
    create: Create
    seq: int

    @property
    def request_id(self) -> str:
        """The request's id."""
        return self.create.request_id

    @property
    def hparams(self) -> dict[str, Any]:
        """The hyperparameters decided."""
        return self.create.hparams

    @property
    def trial_seed(self) -> int:
        """The trial seed decided."""
        return self.create.trial_seed


@dataclass(frozen=True)
class _StopTrial:
    """A ``Stop`` decided by a method; its trial id is looked up at append time."""

    experiment_id: int
    request_id: str


_Pending = Event | _NewTrial | _StopTrial


class SearcherConsumer(Consumer):
    """Feeds each experiment's search method and records its operations."""

    name = "searcher"
    types = TYPES

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.searches: dict[int, Search] = {}
        self.custom: dict[int, CustomStrategy] = {}
        """The custom searches that may still ask their user's method, by experiment."""
        self.workers: CustomWorkers | None = None
        """The leader's custom searcher workers (``None``: a standby's fold asks nothing)."""
        self.experiment_of: dict[int, int] = {}
        self.replaying = False
        self.folded = 0
        self._pending: list[tuple[str, _Pending]] = []

    async def rebuild(self) -> None:
        """Replays the log up to the checkpoint, rebuilding every method without appending
        (and without running any custom searcher: their answers are in the log)."""
        self.searches = {}
        self.custom = {}
        self.experiment_of = {}
        self.folded = 0
        await self.advance()

    async def advance(self) -> None:
        """Replays the log from where the state is up to the checkpoint, appending nothing
        (a standby follows the leader's checkpoint this way, so a takeover folds only the tail).
        """
        checkpoint = await self.store.checkpoint(self.name)
        self.replaying = True
        try:
            async for event in self.store.iter_all(self.folded, types=TYPES):
                if event.position > checkpoint:
                    break
                self.apply(event)
                self.folded = event.position
            self.folded = max(self.folded, checkpoint)
        finally:
            self.replaying = False
            self._pending = []

    async def on_rollback(self) -> None:
        await self.rebuild()

    async def after_commit(self) -> None:
        """Hands the custom searches' due calls to the leader's workers."""
        if self.workers is not None:
            self.workers.sync(self.custom)

    async def handle(self, tx: Transaction, event: RecordedEvent) -> None:
        self.apply(event)
        pending, self._pending = self._pending, []
        for stream_id, item in pending:
            fact = await self._decided(tx, item)
            if fact is None:
                continue
            if isinstance(fact, ExperimentStateChanged) and not await _still_legal(
                tx, stream_id, fact
            ):
                continue
            await tx.append(stream_id, [fact])

    async def _decided(self, tx: Transaction, item: _Pending) -> Event | None:
        """The fact to append for a queued decision; a new trial takes its id here."""
        if isinstance(item, _NewTrial):
            create = item.create
            search = self.searches.get(item.experiment_id)
            parent = None
            if create.parent is not None and search is not None:
                parent = search.trial_of.get(create.parent)
            trial_id = await tx.next_trial_id()
            self._requested(item.experiment_id, create.request_id, trial_id)
            return TrialRequested(
                experiment_id=item.experiment_id,
                trial_id=trial_id,
                seq=item.seq,
                request_id=create.request_id,
                hparams=create.hparams,
                trial_seed=create.trial_seed,
                parent_trial_id=parent,
                round=create.round,
                change=create.change,
                warm_start_checkpoint=create.warm_start,
                warm_start_steps=create.warm_start_steps,
            )
        if isinstance(item, _StopTrial):
            search = self.searches.get(item.experiment_id)
            stopped = search.trial_of.get(item.request_id) if search else None
            if stopped is None:
                log.error("stop for a request with no trial", request=item.request_id)
                return None
            return TrialStopRequested(
                experiment_id=item.experiment_id, trial_id=stopped, request_id=item.request_id
            )
        return item

    def _requested(self, experiment_id: int, request_id: str, trial_id: int) -> None:
        """Records which trial id request ``request_id`` of ``experiment_id`` got."""
        search = self.searches.get(experiment_id)
        if search is None:
            return
        search.trial_of[request_id] = trial_id
        search.request_of[trial_id] = request_id
        self.experiment_of[trial_id] = experiment_id

    def apply(self, event: RecordedEvent) -> None:
        """Advances the methods by one log event; operations are queued for appending."""
        e = event.decode()
        if isinstance(e, ExperimentSubmitted):
            self._submitted(event, e)
            return
        if isinstance(e, ExperimentStateChanged):
            search = self.searches.get(e.experiment_id)
            # A change the experiment fold refuses is never applied.
            if (
                search is not None
                and apply_experiment(search.experiment, event, e)
                and search.state not in _OPEN
            ):
                self._close(search)  # stopping or ended: its searcher is asked nothing more
            return
        if isinstance(e, ExperimentContinued):
            self._continued(event, e)
            return
        if isinstance(e, CustomSearcherAnswered | CustomSearcherFailed):
            self._answered(e)
            return
        if isinstance(e, TrialRequested):
            self._requested(e.experiment_id, e.request_id, e.trial_id)
            self._check_replayed(e)
            return
        if not isinstance(e, _TrialFact):
            return  # not one of :data:`TYPES`
        trial_id = e.trial_id
        experiment_id = self.experiment_of.get(trial_id)
        search = self.searches.get(experiment_id) if experiment_id is not None else None
        if search is None or trial_id not in search.request_of or trial_id in search.closed:
            return
        request_id = search.request_of[trial_id]
        trial = search.trial_views.setdefault(trial_id, TrialView(trial_id))
        if isinstance(e, ValidationReported):
            try:
                metric, time_value = read_validation(
                    search.config.searcher, e.metrics, e.steps_completed
                )
            except SearcherError as exc:
                log.warning("validation ignored", trial=trial_id, error=str(exc))
                return
            self._run(search, search.method.on_validation(request_id, metric, time_value))
        elif isinstance(e, CheckpointSaved):
            ops = search.method.on_checkpoint(request_id, e.uuid, e.steps_completed)
            self._run(search, ops)
        elif isinstance(e, TrialEarlyExited):
            apply_trial(trial, event, e)
        else:
            if not apply_trial(trial, event, e):  # refused by the state machine: not applied
                return
            after = trial.state
            if after not in lifecycle.TERMINAL:
                return
            search.closed.add(trial_id)
            early = trial.early_exit
            reason = None if early is None else _EARLY_REASON.get(early, "errored")
            if after == lifecycle.ERROR:
                reason = "errored"
            elif after == lifecycle.CANCELED:
                reason = reason or "user_canceled"
            if reason is not None:
                self._run(search, search.method.on_trial_exited_early(request_id, reason))
            self._run(search, search.method.on_trial_closed(request_id))

    def _answered(self, e: CustomSearcherAnswered | CustomSearcherFailed) -> None:
        """Applies a custom searcher's recorded answer (or failure) to its call."""
        search = self.searches.get(e.experiment_id)
        if search is None or search.failed or e.experiment_id not in self.custom:
            return  # the search has ended: a late answer changes nothing
        try:
            if isinstance(e, CustomSearcherFailed):
                search.method.on_call_failed(e.call, e.reason)
                ops: list[Operation] = []
            else:
                # The strategy checks and digests the operations as the log stores them: the
                # models dumped back to their stored JSON (serialization, not field access).
                recorded = [op.model_dump(mode="json") for op in e.ops]
                ops = search.method.on_answer(e.call, recorded)
        except SearcherError as exc:
            log.error(
                "custom searcher answer not applied",
                experiment=search.experiment_id,
                error=str(exc),
            )
            return
        self._run(search, ops)

    def _check_replayed(self, e: TrialRequested) -> None:
        """Logs an error when the method, replayed, chose other hyperparameters than recorded
        (its code or a library it samples with changed under a running search): the recorded
        trial stands, but later decisions no longer match a run that never restarted."""
        search = self.searches.get(e.experiment_id)
        if search is None:
            return
        chosen = search.replayed.pop(e.request_id, None)
        if chosen is not None and chosen != e.hparams:
            log.error(
                "replayed search diverges from the log",
                experiment=search.experiment_id,
                request=e.request_id,
                recorded=e.hparams,
                replayed=chosen,
            )

    def _submitted(self, event: RecordedEvent, e: ExperimentSubmitted) -> None:
        exp_id = e.experiment_id
        if e.unmanaged:
            return  # its script names its trials through the API: nothing to search
        try:
            config = parse_config(e.config)
            strategy = None
            if isinstance(config.searcher, CustomSearcher):
                strategy = CustomStrategy(
                    e.config,
                    seed=config.reproducibility.experiment_seed or 0,
                    code_ref=e.code_ref,
                    max_trials=config.searcher.max_trials,
                )
            method = make_method(config, strategy)
        except (ConfigError, SearcherError) as exc:
            log.error("experiment has no usable search", experiment=exp_id, error=str(exc))
            return
        experiment = ExperimentView(exp_id)
        apply_experiment(experiment, event, e)
        search = Search(exp_id, config, method, experiment)
        self.searches[exp_id] = search
        if strategy is not None:
            self.custom[exp_id] = strategy
        self._run(search, method.initial_operations())

    def _continued(self, event: RecordedEvent, e: ExperimentContinued) -> None:
        """A user continued the ended experiment's unfinished trials: the search is open again
        until they close once more (the gateway only continues searches whose method can reopen
        a trial)."""
        search = self.searches.get(e.experiment_id)
        if search is None or not apply_experiment(search.experiment, event, e):
            return  # refused by the experiment's state machine
        reopened = False
        for continued in e.trials:
            trial_id = continued.trial_id
            request_id = search.request_of.get(trial_id)
            if request_id is None:
                continue
            try:
                search.method.on_trial_continued(request_id)
            except SearcherError as exc:
                log.error("continued trial not reopened", trial=trial_id, error=str(exc))
                continue
            reopened = True
            search.closed.discard(trial_id)
            trial = search.trial_views.get(trial_id)
            if trial is not None:
                trial.continued()
        if reopened:
            search.shut_down = False

    def _run(self, search: Search, ops: list[Operation]) -> None:
        stream = experiment_stream(search.experiment_id)
        failure = search.method.strategy.failure
        if failure is not None:
            self._failed(search, failure)
            return
        for op in ops:
            if isinstance(op, Create) and search.state not in _OPEN:
                continue  # a stopping experiment starts nothing new
            if isinstance(op, Create):
                search.trials += 1
                if self.replaying:
                    search.replayed[op.request_id] = op.hparams
                self._emit(
                    stream,
                    _NewTrial(experiment_id=search.experiment_id, create=op, seq=search.trials),
                )
            elif isinstance(op, Stop):
                self._emit(stream, _StopTrial(search.experiment_id, op.request_id))
            elif isinstance(op, Shutdown) and not search.shut_down:
                search.shut_down = True
                if search.state in _OPEN:
                    state = (
                        lifecycle.STOPPING_ERROR
                        if op.failure
                        else lifecycle.STOPPING_CANCELED
                        if op.cancel
                        else lifecycle.STOPPING_COMPLETED
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

    def _failed(self, search: Search, reason: str) -> None:
        """The search cannot go on (a custom searcher failed): the experiment ends in error."""
        search.shut_down = True
        self._close(search)
        if search.failed or self.replaying:
            return  # a failure met in replay only is recorded by the next live call
        search.failed = True
        if search.state in _OPEN:
            self._emit(
                experiment_stream(search.experiment_id),
                ExperimentStateChanged(
                    experiment_id=search.experiment_id,
                    state=lifecycle.STOPPING_ERROR,
                    reason=reason[:1000],
                    actor="searcher",
                ),
            )

    def _emit(self, stream_id: str, fact: _Pending) -> None:
        if not self.replaying:
            self._pending.append((stream_id, fact))

    def _close(self, search: Search) -> None:
        """Asks a custom search nothing more (its worker is stopped at the next commit)."""
        strategy = self.custom.pop(search.experiment_id, None)
        if strategy is not None:
            strategy.release()


async def _still_legal(tx: Transaction, stream_id: str, fact: ExperimentStateChanged) -> bool:
    """Whether the experiment, as its stream stands now, may still make the change ``fact``."""
    await tx.lock_appends()
    current = fold_experiment(0, await tx.read_stream(stream_id)).state
    try:
        lifecycle.check_experiment(current, fact.state)
    except lifecycle.IllegalTransitionError as exc:
        log.info("stopping state overtaken", experiment=fact.experiment_id, reason=str(exc))
        return False
    return True
