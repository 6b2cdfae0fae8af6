"""Determined configs through the API: what is ignored comes back as warnings (and stays with
the experiment), and storage credentials never leave the API unmasked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from events.domain.config.secrets import MASK
from events.domain.types import ExperimentSubmitted
from events.log.store import EventStore
from tests.integration.test_api_event_stream import read_events
from tests.integration.test_api_support import Api, running_api

SECRET = "wJalrXUtnFEMI-do-not-show"
CONFIG = f"""
name: determined-style
entrypoint: python3 train.py
searcher: {{name: single, metric: loss}}
slurm: {{gpu_type: a100, sbatch_args: [--exclusive]}}
resources: {{agent_label: gpu-node}}
checkpoint_storage:
  type: s3
  bucket: ckpts
  endpoint_url: http://127.0.0.1:9
  access_key: AKIAEXAMPLE
  secret_key: {SECRET}
"""
WARNED = ["resources.agent_label", "slurm.gpu_type"]


@pytest.fixture
async def api(store: EventStore) -> AsyncIterator[Api]:
    async with running_api(store) as client:
        yield client


async def test_create_returns_warnings_and_the_experiment_keeps_them(
    api: Api, store: EventStore
) -> None:
    """The create response lists each ignored path once; ExperimentSubmitted records them and
    the experiment's detail shows them."""
    body = await api.ok("POST", "/api/v1/experiments", token=api.admin, json={"config": CONFIG})
    assert [w["path"] for w in body["warnings"]] == WARNED
    assert all(w["message"].startswith("ignored: ") for w in body["warnings"])
    [submitted] = await store.read_stream(f"experiment-{body['id']}")
    assert submitted.schema_version == ExperimentSubmitted.schema_version  # the current one
    assert [w["path"] for w in submitted.payload["warnings"]] == WARNED
    detail = await api.ok("GET", f"/api/v1/experiments/{body['id']}", token=api.admin)
    assert detail["warnings"] == body["warnings"]


async def test_storage_secrets_are_masked_in_detail_and_event_stream(
    api: Api, store: EventStore
) -> None:
    """The log keeps the secret key (the trial needs it); the experiment detail and the event
    stream show it masked."""
    body = await api.ok("POST", "/api/v1/experiments", token=api.admin, json={"config": CONFIG})
    [submitted] = await store.read_stream(f"experiment-{body['id']}")
    assert submitted.payload["config"]["checkpoint_storage"]["secret_key"] == SECRET
    detail = await api.ok("GET", f"/api/v1/experiments/{body['id']}", token=api.admin)
    storage = detail["config"]["checkpoint_storage"]
    assert storage["secret_key"] == MASK and storage["access_key"] == MASK
    assert storage["bucket"] == "ckpts"
    [event] = await read_events(api, api.admin, 1, query=f"?experiment_id={body['id']}")
    assert event["event"] == "ExperimentSubmitted"
    shown = event["data"]["payload"]["config"]["checkpoint_storage"]
    assert shown["secret_key"] == MASK and SECRET not in str(event)


async def test_template_secrets_are_masked(api: Api) -> None:
    """A template holding storage credentials is shown with them masked."""
    template = {"config": f"checkpoint_storage: {{type: s3, bucket: b, secret_key: {SECRET}}}\n"}
    await api.ok("PUT", "/api/v1/templates/s3", token=api.admin, json=template)
    shown = await api.ok("GET", "/api/v1/templates/s3", token=api.admin)
    assert shown["config"]["checkpoint_storage"]["secret_key"] == MASK
