"""Asking custom searchers: off the searcher's event loop, outside its consumer's transactions.

The searcher's fold only records which calls to ask a user's method
(:class:`~events.domain.search.custom.CustomStrategy`). The leader's
:class:`CustomWorkers` keeps one :class:`CustomWorker` task per live custom search with a call
due. A worker starts the experiment's sandbox (:mod:`services.searcher.sandbox`) when a call is
due, not before; feeds a fresh process the calls already answered, in order, so that the user's
object reaches the state it had (those answers are compared with the recorded ones, never
recorded again); then asks the next unanswered call and records the answer, or why there is
none, as a fact of the experiment's stream in a transaction of its own. The consumer applies
the fact when it folds it, like any other input.

Invariants:

- A call is settled at most once. The worker appends call ``k``'s fact only if, under the
  append lock, the experiment's stream settles exactly ``k - 1`` calls; it appends with the
  stream version it read as the expected version, with the leader's fence, and with an event
  id derived from ``(experiment, k)`` that the log's unique index refuses twice. An answer made
  stale meanwhile (settled by a previous leader's worker) is dropped; a zombie leader's is
  fenced off.
- No call is lost: a call whose fact did not commit is still unanswered in the fold and is
  asked again, by this worker or the next leader's, of a process fed the same history.
- Only live searches run user code: nothing runs during a rebuild or for an ended experiment,
  a process starts only when a call is due, and a search that ends, fails or loses its leader
  has its process killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TypeVar

import structlog

from events.domain.names import experiment_stream
from events.domain.search.custom import CustomStrategy, answer_digest, hook_of
from events.domain.types import CustomSearcherAnswered, CustomSearcherFailed
from events.log.envelope import NewEvent
from events.log.errors import DuplicateEventError, EventsError, FencedError
from events.log.store import EventStore, Fence, Transaction
from services.api import read as api_read
from services.confine import Identity, default_identity
from services.searcher.sandbox import Sandbox, SandboxError, SandboxSettings, as_json, code_root

log = structlog.get_logger("searcher")

ANSWER_TYPES = frozenset({"CustomSearcherAnswered", "CustomSearcherFailed"})
"""The facts that settle a custom searcher's call."""
_ANSWER_IDS = uuid.UUID("0b6f3c8e-52a1-4f0c-9e7d-2d4a8c1f6b35")
_RETRY_FIRST, _RETRY_MOST = 0.2, 5.0
T = TypeVar("T")


def answer_event_id(experiment_id: int, call: int) -> uuid.UUID:
    """The event id of the fact settling ``call`` of ``experiment_id`` (the same for an answer
    and a failure, so that the log holds at most one of them)."""
    return uuid.uuid5(_ANSWER_IDS, f"{experiment_id}/{call}")


class CustomWorker:
    """Asks one experiment's custom searcher its due calls, in order (see the module's
    invariants).

    Args:
        experiment_id: The experiment.
        store: The log.
        fence: The leader's fence every fact is written with (``None``: no lease, in tests).
        settings: The sandbox's limits.
        identity: The uid and gid the searcher runs as.
        root: Where sandboxes unpack their code.
    """

    def __init__(
        self,
        experiment_id: int,
        *,
        store: EventStore,
        fence: Fence | None,
        settings: SandboxSettings,
        identity: Identity | None,
        root: Path,
    ) -> None:
        self.experiment_id = experiment_id
        self.store = store
        self.fence = fence
        self.settings = settings
        self.identity = identity
        self.root = root
        self.strategy: CustomStrategy | None = None
        self.settled = 0
        """Calls settled in the log, as last read or written here."""
        self._seen_version = 0
        self._sandbox: Sandbox | None = None
        self._fed = 0
        self._wake = asyncio.Event()
        self.task = asyncio.create_task(self._run(), name=f"custom-searcher-{experiment_id}")

    @property
    def done(self) -> bool:
        """Whether the worker has stopped (after recording a failure, or fenced off)."""
        return self.task.done()

    def offer(self, strategy: CustomStrategy) -> None:
        """Hands over the fold's current calls (a rebuilt fold hands over an equal list)."""
        self.strategy = strategy
        self._wake.set()

    def _due(self) -> int | None:
        strategy = self.strategy
        if strategy is None or strategy.failure is not None or strategy.ended:
            return None
        call = max(strategy.answered, self.settled) + 1
        return call if call <= len(strategy.calls) else None

    async def _run(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while (call := self._due()) is not None:
                    if not await self._settle(call):
                        return
        except FencedError as exc:
            log.warning(
                "custom searcher worker fenced off", experiment=self.experiment_id, error=str(exc)
            )
        except Exception:
            log.exception("custom searcher worker failed", experiment=self.experiment_id)
        finally:
            await self.stop_sandbox()

    async def _settle(self, call: int) -> bool:
        """Asks ``call`` and records its fact; ``False`` once the search cannot go on."""
        strategy = self.strategy
        assert strategy is not None
        if self._sandbox is None:
            await self._retrying("experiment unreadable", self._read_settled)
            if call <= self.settled:
                return True  # settled by a previous leader; the fold will catch up
        message = strategy.calls[call - 1]
        hook = hook_of(message)
        failed = False
        try:
            sandbox = await self._ready(strategy, call)
            ops = await sandbox.ask(message, hook=hook, timeout=self.settings.call_timeout)
            self._fed = call
            fact: CustomSearcherAnswered | CustomSearcherFailed = CustomSearcherAnswered(
                experiment_id=self.experiment_id,
                call=call,
                hook=hook,
                request_id=message.get("request_id"),
                ops=ops,
            )
        except SandboxError as exc:
            failed = True
            await self.stop_sandbox()
            reason = f"custom searcher {strategy.searcher_class}: {exc}"
            log.warning("custom searcher failed", experiment=self.experiment_id, reason=reason)
            fact = CustomSearcherFailed(
                experiment_id=self.experiment_id, call=call, hook=hook, reason=reason[:1000]
            )
        if await self._record(call, fact):
            return not failed
        if self.settled < call - 1:  # cannot happen: calls are asked in order
            log.error("custom searcher calls out of order", experiment=self.experiment_id)
            return False
        return True  # settled meanwhile by a previous leader's worker: go on from there

    async def _ready(self, strategy: CustomStrategy, call: int) -> Sandbox:
        """The process, started if need be and fed every call before ``call``.

        Raises:
            SandboxError: it cannot start, or a call of its history failed.
        """
        if self._sandbox is not None and (not self._sandbox.running or self._fed >= call):
            await self.stop_sandbox()  # dead, or ahead of the log: start over
        if self._sandbox is None:
            code = await self._code(strategy)
            self._sandbox = await Sandbox.start(
                code, settings=self.settings, identity=self.identity, root=self.root
            )
            self._fed = 0
            startup = max(self.settings.call_timeout, self.settings.startup_timeout)
            await self._sandbox.ask(strategy.init_message(), hook="__init__", timeout=startup)
        while self._fed < call - 1:
            replayed = self._fed + 1
            message = strategy.calls[replayed - 1]
            hook = hook_of(message)
            try:
                ops = await self._sandbox.ask(
                    message, hook=hook, timeout=self.settings.call_timeout
                )
            except SandboxError as exc:
                raise SandboxError(f"{exc} (feeding it call {replayed} again)") from None
            self._fed = replayed
            recorded = strategy.digests[replayed - 1] if replayed <= len(strategy.digests) else ""
            if recorded and answer_digest(as_json(ops)) != recorded:
                log.error(
                    "replayed search diverges from the log",
                    experiment=self.experiment_id,
                    call=replayed,
                    hook=hook,
                )
        return self._sandbox

    async def _code(self, strategy: CustomStrategy) -> bytes:
        """The experiment's code tarball (retried while the database is unavailable).

        Raises:
            SandboxError: the experiment has no code.
        """
        code_ref = strategy.code_ref
        if code_ref is None:
            raise SandboxError("the experiment has no code")

        async def read() -> bytes | None:
            async with self.store.connection() as conn:
                return await api_read.code_blob(conn, code_ref)

        data = await self._retrying("custom searcher's code unreadable", read)
        if data is None:
            raise SandboxError(f"the experiment's code {code_ref} is missing")
        return data

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, tried again after a growing pause while the database is unavailable.

        Raises:
            FencedError: a newer leader was elected.
            DuplicateEventError: the event is already in the log.
        """
        delay = _RETRY_FIRST
        while True:
            try:
                return await attempt()
            except (FencedError, DuplicateEventError):
                raise
            except EventsError as exc:
                log.warning(what, experiment=self.experiment_id, error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MOST)

    async def _read_settled(self, tx: Transaction | None = None) -> int:
        """Reads the experiment's stream past what was read before (in ``tx`` when given),
        updates :attr:`settled` and returns the stream's version."""
        stream = experiment_stream(self.experiment_id)
        if tx is None:
            events = await self.store.read_stream(stream, after_version=self._seen_version)
        else:
            events = await tx.read_stream(stream, after_version=self._seen_version)
        for event in events:
            if event.type in ANSWER_TYPES:
                fact = event.decode()
                if isinstance(fact, CustomSearcherAnswered | CustomSearcherFailed):
                    self.settled = max(self.settled, fact.call)
        if events:
            self._seen_version = events[-1].stream_version
        return self._seen_version

    async def _record(self, call: int, fact: CustomSearcherAnswered | CustomSearcherFailed) -> bool:
        """Appends ``fact`` as call ``call``'s settlement; ``False`` if it was stale.

        Raises:
            FencedError: a newer leader was elected.
        """
        stream = experiment_stream(self.experiment_id)
        new = NewEvent(event=fact, event_id=answer_event_id(self.experiment_id, call))

        async def append() -> bool:
            async with self.store.transaction() as tx:
                tx.write_as(self.fence)
                if self.fence is not None:
                    await tx.check_fence(self.fence)
                else:
                    await tx.lock_appends()
                version = await self._read_settled(tx)
                if self.settled != call - 1:
                    log.info(
                        "custom searcher answer dropped as stale",
                        experiment=self.experiment_id,
                        call=call,
                        settled=self.settled,
                    )
                    return False
                recorded = await tx.append(stream, [new], expected_version=version)
            self.settled = call
            self._seen_version = recorded[-1].stream_version
            return True

        try:
            return await self._retrying("custom searcher answer not recorded yet", append)
        except DuplicateEventError:
            return False  # settled already: the stale check's read cannot have missed it

    async def stop_sandbox(self) -> None:
        """Kills the process, if one runs."""
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            await sandbox.close()

    async def stop(self) -> None:
        """Stops the worker and kills its process."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class CustomWorkers:
    """The leader's custom searcher workers: one per live custom search with a call due.

    Args:
        store: The log.
        fence: The leader's fence (``None``: no lease, in tests).
        settings: The sandbox's limits.
        identity: The uid and gid searchers run as (:func:`services.confine.default_identity`
            when not given).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        fence: Fence | None,
        settings: SandboxSettings,
        identity: Identity | None = None,
    ) -> None:
        self.store = store
        self.fence = fence
        self.settings = settings
        self.identity = default_identity() if identity is None else identity
        self.workers: dict[int, CustomWorker] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._root: Path | None = None

    def sync(self, live: Mapping[int, CustomStrategy]) -> None:
        """Brings the workers in line with the fold: ``live`` maps each experiment whose custom
        search may still ask to its strategy. Workers of the others are stopped; a worker is
        started for a live search with a call due. A worker that stopped by itself is not
        started again in this term (its search is failing)."""
        for experiment_id in [e for e in self.workers if e not in live]:
            stopped = self.workers.pop(experiment_id)
            task = asyncio.create_task(stopped.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
        for experiment_id, strategy in live.items():
            worker = self.workers.get(experiment_id)
            if worker is None:
                if not strategy.answers_due:
                    continue
                if self._root is None:
                    self._root = code_root()
                worker = CustomWorker(
                    experiment_id,
                    store=self.store,
                    fence=self.fence,
                    settings=self.settings,
                    identity=self.identity,
                    root=self._root,
                )
                self.workers[experiment_id] = worker
            worker.offer(strategy)

    async def close(self) -> None:
        """Stops every worker and kills every process."""
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.stop() for w in workers), *self._stopping)
        if self._root is not None:
            root, self._root = self._root, None
            await asyncio.to_thread(shutil.rmtree, root, True)
