"""The tracker service: the projections, checkpoint GC, usage, audit and webhook consumers.

:func:`catch_up` runs them once to the head of the log (what tests and tools call to make the
projections current; webhook deliveries are queued, not sent); :func:`run_consumers` runs them
until stopped, woken by the bus, with the webhook sender beside them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from events.domain.config.cluster import CheckpointStoragePolicy, WebhookPolicy
from events.domain.config.storage import default_checkpoint_root
from events.domain.webhooks.urls import Endpoints
from events.log.bus import Bus
from events.log.consumer import ConsumerRunner
from events.log.store import EventStore
from services.tracker import audit, schema, webhooks
from services.tracker.audit import AuditConsumer
from services.tracker.gc import GCConsumer
from services.tracker.projections import ProjectionsConsumer
from services.tracker.usage import UsageConsumer
from services.tracker.webhook_sender import WebhookSender
from services.tracker.webhooks import WebhookConsumer

MAX_ROUNDS = 10
PAGE = 2000
"""Events read and applied per transaction by the projection consumers (the runner's default is
500): a page costs a checkpoint lock, a read, a few statements per table and a commit whatever
its size, and their batched statements take a page of any size in one go."""


async def catch_up(
    store: EventStore,
    *,
    checkpoint_root: Path | None = None,
    storage_policy: CheckpointStoragePolicy | None = None,
) -> None:
    """Brings the projections, the checkpoint GC and the usage to the head of the log, once.

    The projections run first, then the GC; when the GC appended something (``CheckpointsDeleted``,
    ``DELETED``) the projections run again, so they include it on return.

    Args:
        store: the event store.
        checkpoint_root: the default checkpoint root (else ``$CAIRN_CHECKPOINT_ROOT``,
            ``$CAIRN_HOME/checkpoints`` or ``~/.cairn/checkpoints``).
        storage_policy: the cluster config's storage policy (``None``: its default, only the
            default root).
    """
    await schema.migrate(store)
    await audit.migrate(store)
    await webhooks.migrate(store)
    await ConsumerRunner(store, None, AuditConsumer(), batch=PAGE).catch_up()
    await ConsumerRunner(store, None, WebhookConsumer(), batch=PAGE).catch_up()
    projections = ConsumerRunner(store, None, ProjectionsConsumer(), batch=PAGE)
    policy = storage_policy or CheckpointStoragePolicy()
    gc = ConsumerRunner(store, None, GCConsumer(default_checkpoint_root(checkpoint_root), policy))
    await ConsumerRunner(store, None, UsageConsumer(), batch=PAGE).catch_up()
    for _ in range(MAX_ROUNDS):
        projected = await projections.catch_up()
        await gc.catch_up()
        if await store.head() <= projected:
            return
    await projections.catch_up()


async def run_consumers(
    store: EventStore,
    bus: Bus | None,
    stop: asyncio.Event,
    *,
    checkpoint_root: Path | None = None,
    storage_policy: CheckpointStoragePolicy | None = None,
    webhook_policy: WebhookPolicy | None = None,
    endpoints: Endpoints | None = None,
    catch_up_every: float = 2.0,
) -> None:
    """Runs the consumers and the webhook sender until ``stop`` is set.

    Args:
        store: the event store (the tracker schema must be migrated).
        bus: wakes the consumers on new events (``None``: the catch-up timer only).
        stop: set to stop.
        checkpoint_root: the default checkpoint root (see :func:`catch_up`).
        storage_policy: the cluster config's storage policy (see :func:`catch_up`).
        webhook_policy: the cluster config's webhook section (``None``: its defaults).
        endpoints: the cluster's own services, which deliveries never reach.
        catch_up_every: seconds between catch-ups that heal lost wake-ups.
    """
    root = default_checkpoint_root(checkpoint_root)
    policy = webhook_policy or WebhookPolicy()
    sender = WebhookSender(store, policy, endpoints or Endpoints())
    runners = [
        ConsumerRunner(
            store, bus, ProjectionsConsumer(), batch=PAGE, catch_up_every=catch_up_every
        ),
        ConsumerRunner(
            store,
            bus,
            GCConsumer(root, storage_policy or CheckpointStoragePolicy()),
            catch_up_every=catch_up_every,
        ),
        ConsumerRunner(store, bus, AuditConsumer(), batch=PAGE, catch_up_every=catch_up_every),
        ConsumerRunner(store, bus, UsageConsumer(), batch=PAGE, catch_up_every=catch_up_every),
        ConsumerRunner(
            store,
            bus,
            WebhookConsumer(policy, on_queued=sender.wake),
            batch=PAGE,
            catch_up_every=catch_up_every,
        ),
    ]
    await asyncio.gather(*(runner.run(stop) for runner in runners), sender.run(stop))
