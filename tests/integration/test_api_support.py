"""Shared harness for the API gateway tests (no tests here): a real server on a free port, an
HTTP client over real sockets, and helpers that append the scheduler's facts directly."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from events.domain.config.cluster import ClusterConfig, parse_cluster_config
from events.domain.names import allocation_id, experiment_stream, trial_stream
from events.domain.types import ExperimentSubmitted, SlotsAllocated, TrialRequested
from events.log.store import EventStore
from services.api import agent_credentials, checkpoint_ids
from services.api.app import create_app
from services.api.auth import cluster_secret, join_token, sign_trial_token
from tests.helpers import ADMIN_PASSWORD

CONFIG = """
name: mnist
entrypoint: python train.py
searcher: {name: single, metric: loss, max_length: {batches: 100}}
hyperparameters: {lr: 0.1}
environment: {environment_variables: [FOO=bar]}
checkpoint_storage: {type: shared_fs, host_path: /tmp/ckpts}
"""


TEST_CLUSTER = parse_cluster_config(
    {"checkpoint_storage": {"allowed_roots": [os.path.realpath(tempfile.gettempdir())]}}
)
"""The gateway's cluster config in these tests: checkpoints may live anywhere under the
temporary directory (where :data:`CONFIG` and each test's ``tmp_path`` put them)."""
TEST_STORAGE = TEST_CLUSTER.checkpoint_storage
"""Its storage policy, for the tracker's GC in the same tests."""


class Api:
    """An HTTP client bound to one running gateway, with the join token, agents' credentials
    and the secret at hand (``agent``: agent ``gpu01``'s credential)."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, store: EventStore, secret: bytes
    ) -> None:
        self.session = session
        self.url = url
        self.store = store
        self.secret = secret
        self.agent = ""
        self.admin = ""
        self.join = ""
        self._agents: dict[str, str] = {}

    def trial_token(self, trial_id: int, run_id: int = 1) -> str:
        """A token of run ``run_id`` of a trial, minted the way the gateway mints them."""
        return sign_trial_token(self.secret, trial_id, run_id)

    async def agent_token(self, agent_id: str) -> str:
        """Agent ``agent_id``'s own credential, issued as a join would (without the call, so
        the log holds no audit record of it)."""
        if agent_id not in self._agents:
            issued = await agent_credentials.issue(self.store, agent_id, None)
            self._agents[agent_id] = issued.token
        return self._agents[agent_id]

    def checkpoint_uuid(self, trial_id: int) -> str:
        """A checkpoint uuid issued to trial ``trial_id``, as the gateway issues them."""
        return checkpoint_ids.issue(self.secret, trial_id)

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = None,
        json: Any = None,
        **kwargs: Any,
    ) -> tuple[int, Any]:
        """Sends a request; returns the status and the decoded JSON (or raw bytes)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.session.request(
            method, self.url + path, json=json, headers=headers, **kwargs
        ) as resp:
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, await resp.read()

    async def ok(self, method: str, path: str, token: str | None = None, json: Any = None) -> Any:
        """Sends a request that must answer 200; returns its JSON."""
        status, body = await self.call(method, path, token, json)
        assert status == 200, (status, body)
        return body

    async def login(self, username: str = "admin", password: str = ADMIN_PASSWORD) -> str:
        """Logs in and returns the bearer token."""
        body = await self.ok(
            "POST", "/api/v1/auth/login", json={"username": username, "password": password}
        )
        return str(body["token"])


@contextlib.asynccontextmanager
async def running_api(
    store: EventStore,
    checkpoint_root: Path | None = None,
    cluster: ClusterConfig = TEST_CLUSTER,
    port: int = 0,
    metrics_token: str | None = None,
) -> AsyncIterator[Api]:
    """Starts the gateway on 127.0.0.1:<free port> and yields a client logged in as admin
    (``checkpoint_root``: its default checkpoint root; ``cluster``: its cluster config;
    ``port``: a port of the caller's choosing, for a test that names it in that config;
    ``metrics_token``: the token a scraper may present for ``/metrics``)."""
    secret = await cluster_secret(store)
    app = create_app(
        store,
        None,
        secret=secret,
        checkpoint_root=checkpoint_root,
        cluster=cluster,
        admin_password=ADMIN_PASSWORD,
        metrics_token=metrics_token,
    )
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        async with aiohttp.ClientSession() as session:
            api = Api(session, f"http://{host}:{port}", store, secret)
            api.join = await join_token(store)
            api.agent = await api.agent_token("gpu01")
            api.admin = await api.login()
            yield api
    finally:
        await runner.cleanup()


async def submit_experiment(
    store: EventStore, experiment_id: int = 1, owner: str = "admin"
) -> None:
    """Appends an ExperimentSubmitted with a small valid config, as the gateway would."""
    from events.domain.config import parse_config

    config = parse_config(CONFIG, default_seed=7).model_dump(mode="json")
    await store.append(
        f"experiment-{experiment_id}",
        [ExperimentSubmitted(experiment_id=experiment_id, config=config, owner=owner)],
    )


async def allocate(
    store: EventStore,
    trial_id: int = 11,
    run_id: int = 1,
    agent: str = "gpu01",
    slots: tuple[str, ...] = ("0",),
    request: bool = True,
    experiment_id: int | None = None,
) -> str:
    """Appends what the searcher and scheduler would (TrialRequested, SlotsAllocated); returns
    the allocation id.

    Test trial ids read ``<experiment><n>``: trial 11 is experiment 1's first trial, 21
    experiment 2's (``experiment_id`` defaults to ``trial_id // 10``).
    """
    experiment_id = trial_id // 10 if experiment_id is None else experiment_id
    if request:
        await store.append(
            experiment_stream(experiment_id),
            [
                TrialRequested(
                    experiment_id=experiment_id,
                    trial_id=trial_id,
                    seq=trial_id % 10,
                    request_id=f"r-{trial_id}",
                    hparams={"lr": 0.1},
                    trial_seed=42,
                )
            ],
        )
    allocation = allocation_id(trial_id, run_id)
    await store.append(
        trial_stream(trial_id),
        [
            SlotsAllocated(
                trial_id=trial_id,
                allocation_id=allocation,
                placements={agent: list(slots)},
                run_id=run_id,
            )
        ],
    )
    return allocation


async def types_of(store: EventStore, stream_id: str) -> list[str]:
    """The event types of one stream, in order."""
    return [e.type for e in await store.read_stream(stream_id)]
