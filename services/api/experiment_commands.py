"""Deciding a user's command on an experiment: the experiment id of the path, and the
load-check-decide-append step every owner-only change of an experiment's stream shares (in the
caller's transaction, or in one of its own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

from events.domain.authorization import Permission
from events.domain.deciders import Refusal
from events.domain.names import experiment_stream
from events.log.envelope import Event
from events.log.store import Transaction
from services.api.access import check_experiment
from services.api.auth import Principal
from services.api.decided import append_accepted
from services.api.errors import not_found
from services.api.inbox import in_transaction
from services.api.routing import store_of
from services.api.views import MAX_ID, ExperimentView, load_experiment

E = TypeVar("E", bound=Event)


def experiment_id_of(request: web.Request) -> int:
    """The experiment id of the path (an id that cannot exist is a 404)."""
    raw = request.match_info["experiment_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_ID:
        raise not_found(f"no experiment {raw!r}")
    return int(raw)


async def decide_on_experiment(
    tx: Transaction,
    principal: Principal,
    experiment_id: int,
    decide: Callable[[ExperimentView], list[E] | Refusal],
    *,
    permission: Permission = Permission.UPDATE_EXPERIMENT,
) -> tuple[ExperimentView, list[E]]:
    """Folds the experiment in ``tx``, lets whoever holds ``permission`` on it act (its owner,
    an admin, a role in its workspace), and appends what ``decide`` decides against the folded
    version.

    Args:
        tx: the request's transaction.
        principal: who acts (recorded as each event's actor).
        experiment_id: the experiment.
        decide: the decider, given the folded experiment (without its trials).
        permission: what the change needs.

    Returns:
        The experiment as folded before the change, and the events appended (none: no change).

    Raises:
        ApiError: 404 unknown, 403 another user's, or the decider's refusal.
        ConcurrencyError: the stream moved on since it was folded (retryable: re-fold).
    """
    view = await load_experiment(tx, experiment_id, with_trials=False)
    await check_experiment(tx, principal, view, permission)
    events = await append_accepted(
        tx,
        experiment_stream(experiment_id),
        decide(view),
        expected_version=view.version,
        actor=principal.name,
    )
    return view, events


async def act_on_experiment(
    request: web.Request,
    principal: Principal,
    experiment_id: int,
    decide: Callable[[ExperimentView], list[E] | Refusal],
    *,
    permission: Permission = Permission.UPDATE_EXPERIMENT,
) -> tuple[ExperimentView, list[E]]:
    """:func:`decide_on_experiment` in a transaction of its own, decided again from a fresh fold
    when a concurrent append moved the stream on (:func:`services.api.inbox.in_transaction`).

    Returns:
        The experiment as folded before the change, and the events appended (none: no change).

    Raises:
        ApiError: 404 unknown, 403 another user's, or the decider's refusal.
    """

    async def work(tx: Transaction) -> tuple[ExperimentView, list[E]]:
        return await decide_on_experiment(
            tx, principal, experiment_id, decide, permission=permission
        )

    return await in_transaction(store_of(request), work)
