"""SIGKILL of the tracker while webhook deliveries are pending: after its restart the receiver
has every delivery the log fired, each under its stable id, in log order per webhook, the one
in flight at the kill received again under the same id."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from cairn.local.servers import ServerProcess
from events.domain.config.cluster import parse_cluster_config
from events.domain.names import experiment_stream, trial_stream
from events.domain.types import (
    ExperimentStateChanged,
    TrialRequested,
    TrialStateChanged,
)
from events.domain.webhooks.matching import delivery_id
from events.log.store import EventStore
from services.tracker import webhooks as tracker_webhooks
from tests.helpers import spawn, wait_for_line, wait_until
from tests.integration.test_api_support import CONFIG, TEST_CLUSTER, running_api
from tests.integration.webhook_receiver import HOST, Receiver

TRIALS = 16
TRIGGERS = [
    {"trigger_type": "TRIAL_STATE_CHANGE", "condition": {"state": "STOPPING_COMPLETED"}},
    {"trigger_type": "TRIAL_STATE_CHANGE", "condition": {"state": "COMPLETED"}},
    {"trigger_type": "EXPERIMENT_STATE_CHANGE", "condition": {"state": "COMPLETED"}},
]


def drained(proc: subprocess.Popen[str]) -> threading.Thread:
    """Reads ``proc``'s stderr to its end in a thread, so its logging never blocks on a pipe."""
    assert proc.stderr is not None
    stream = proc.stderr
    thread = threading.Thread(target=lambda: [None for _ in stream], daemon=True)
    thread.start()
    return thread


async def search(store: EventStore, experiment_id: int) -> None:
    """What a search of TRIALS trials records: each trial requested, stopping, completed, then
    the experiment completed."""
    trial_ids = [experiment_id * 100 + n for n in range(1, TRIALS + 1)]
    await store.append(
        experiment_stream(experiment_id),
        [
            TrialRequested(
                experiment_id=experiment_id, trial_id=t, seq=n, request_id=f"r{t}",
                hparams={"lr": n / 100}, trial_seed=n,
            )
            for n, t in enumerate(trial_ids)
        ],
    )  # fmt: skip
    for trial_id in trial_ids:
        await store.append(
            trial_stream(trial_id),
            [
                TrialStateChanged(trial_id=trial_id, state="STOPPING_COMPLETED"),
                TrialStateChanged(trial_id=trial_id, state="COMPLETED"),
            ],
        )
    await store.append(
        experiment_stream(experiment_id),
        [
            ExperimentStateChanged(experiment_id=experiment_id, state="STOPPING_COMPLETED"),
            ExperimentStateChanged(experiment_id=experiment_id, state="COMPLETED"),
        ],
    )


async def test_tracker_killed_with_deliveries_pending_loses_none_and_keeps_ids_and_order(
    store: EventStore,
    db_url: str,
    nats_server: ServerProcess,
    service_env: Callable[..., dict[str, str]],
    tmp_path: Path,
) -> None:
    """The tracker is SIGKILLed right after posting its first delivery, before recording it;
    restarted, it delivers the rest: the receiver has all 2*16+1 deliveries in log order, the
    first twice under one id, and every row ends delivered."""
    receiver = Receiver()
    await receiver.start()
    webhooks = {
        "allowed_urls": [f"http://{HOST}:{receiver.port}/"],
        "allowed_networks": [f"{HOST}/32"],
        "retry_delay": "0.05s",
        "max_retry_delay": "0.2s",
    }
    cluster = TEST_CLUSTER.model_copy(
        update={"webhooks": parse_cluster_config({"webhooks": webhooks}).webhooks}
    )
    config_file = tmp_path / "cluster.yaml"
    config_file.write_text(f"webhooks: {webhooks}\n".replace("'", '"'))
    await tracker_webhooks.migrate(store)
    try:
        async with running_api(store, cluster=cluster) as api:
            hook = await api.ok(
                "POST", "/api/v1/webhooks", token=api.admin,
                json={"name": "search", "url": receiver.url("ok", "s"), "triggers": TRIGGERS},
            )  # fmt: skip
            created = await api.ok(
                "POST", "/api/v1/experiments", token=api.admin,
                json={"config": CONFIG, "activate": True},
            )  # fmt: skip
        experiment_id = int(created["id"])
        await search(store, experiment_id)
        fired = [
            e
            for e in await store.read_types(["TrialStateChanged", "ExperimentStateChanged"])
            if e.type == "TrialStateChanged"
            or e.decode_as(ExperimentStateChanged).state == "COMPLETED"
        ]
        expected = [delivery_id(str(e.event_id), hook["id"]) for e in fired]
        assert len(expected) == 2 * TRIALS + 1

        args = ("--db", db_url, "--nats", nats_server.url, "--cluster-config", str(config_file))
        tracker = spawn("services.tracker", *args, env=service_env("webhooks.after_post=120"))
        try:
            await asyncio.to_thread(wait_for_line, tracker, "FAULT-POINT webhooks.after_post", 60)
            # The first delivery was posted; its row still says pending, as do all the others.
            assert [s.delivery_id for s in receiver.seen["s"]] == expected[:1]
            states = await store.fetch(
                "SELECT state FROM webhook_deliveries WHERE webhook_id = $1", hook["id"]
            )
            assert len(states) == len(expected)
            assert {r["state"] for r in states} == {"pending"}
            tracker.send_signal(signal.SIGKILL)
            assert tracker.wait(10) == -signal.SIGKILL
        finally:
            if tracker.poll() is None:
                tracker.kill()
                tracker.wait(10)

        restarted = spawn("services.tracker", *args, env=service_env())
        drained(restarted)
        try:

            async def all_delivered() -> bool:
                count = await store.fetchval(
                    """SELECT count(*) FROM webhook_deliveries
                       WHERE webhook_id = $1 AND state = 'delivered'""",
                    hook["id"],
                )
                return int(count) == len(expected)

            await wait_until(all_delivered, timeout=90)
        finally:
            restarted.send_signal(signal.SIGTERM)
            restarted.wait(10)
    finally:
        await receiver.stop()
    got = [s.delivery_id for s in receiver.seen["s"]]
    assert got == [expected[0], *expected]  # the one in flight twice, then the rest, in order
    bodies = [s.json for s in receiver.seen["s"]]
    assert all(b["delivery_id"] == d for b, d in zip(bodies, got, strict=True))
    assert bodies[0] == bodies[1]  # the same bytes under the same id
    trial_states = [b["event_data"]["trial"]["state"] for b in bodies[1:-1]]
    assert trial_states == ["STOPPING_COMPLETED", "COMPLETED"] * TRIALS
    assert bodies[-1]["event_data"]["experiment"]["state"] == "COMPLETED"
