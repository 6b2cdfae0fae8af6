"""Schemathesis fuzzing of the API gateway over real HTTP: no operation may answer a 5xx.

The schema is the live OpenAPI document (``GET /api/v1/openapi.json``) of a real
``python -m services.api`` process on a free port and a database of its own. An experiment, a
trial with an allocation, an agent and a code blob are seeded first; generated path parameters
are often swapped for those real ids, so the fuzzer reaches past the 404s into the handlers.
Each operation gets a bounded number of examples; the checks are ``not_a_server_error`` and
``status_code_conformance`` (every status answered is one the document declares).
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import io
import os
import re
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, BaseSchema, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from cairn.local.servers import ServerProcess
from events.log.store import EventStore
from services.api.app import all_routes
from tests.helpers import create_database, wait_until_sync
from tests.integration.test_api_support import CONFIG, allocate

ROOT = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = int(os.environ.get("CAIRN_FUZZ_EXAMPLES", "25"))
"""Examples per operation; raise ``CAIRN_FUZZ_EXAMPLES`` for a deeper run."""
REQUEST_TIMEOUT = 15.0
PATH_PARAM = re.compile(r"{([^}:]+)(?::[^}]*)?}")
"""An aiohttp path parameter, ``{name}`` or ``{name:regex}`` (OpenAPI spells both ``{name}``)."""
STREAMING = r"/events/stream|follow"
"""Paths that stream until the client leaves; excluded, they would only hang the fuzzer."""


@dataclass
class LiveApi:
    """A running gateway process with its admin token and the ids seeded into it."""

    url: str
    admin: str
    log: Path
    ids: dict[str, list[str]] = field(default_factory=dict)

    def login(self) -> str:
        """A fresh admin token (for operations that revoke the token they are called with)."""
        resp = requests.post(
            f"{self.url}/api/v1/auth/login",
            json={"username": "admin", "password": "admin"},
            timeout=REQUEST_TIMEOUT,
        )
        resp.raise_for_status()
        return str(resp.json()["token"])

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """An admin request that must answer 200; returns its JSON."""
        resp = requests.request(
            method,
            f"{self.url}{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.admin}"},
            timeout=REQUEST_TIMEOUT,
        )
        assert resp.status_code == 200, (method, path, resp.status_code, resp.text)
        return resp.json()


def _unhandled(log_line: str) -> bool:
    """Whether a line of the API's JSON log records an unhandled error (a 500)."""
    return '"unhandled error"' in log_line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _code_tarball() -> str:
    """A tiny base64 tar.gz, as the CLI uploads code."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"print('hello')\n"
        info = tarfile.TarInfo("train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    assert gzip.decompress(buf.getvalue())
    return base64.b64encode(buf.getvalue()).decode()


def _wait_ready(proc: subprocess.Popen[bytes], ready: Path, log: Path) -> None:
    def started() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the API exited with {proc.returncode}:\n{log.read_text()}")
        return ready.exists()

    wait_until_sync(started, timeout=30, detail=log.read_text)


def _seed(api: LiveApi, dsn: str) -> None:
    """An experiment (with code) through the API, then a trial, an allocation and an agent."""
    created = api.call(
        "POST", "/api/v1/experiments", {"config": CONFIG, "code": _code_tarball(), "activate": True}
    )
    experiment_id = str(created["id"])

    trial_id = int(experiment_id) * 10 + 1

    async def trial() -> str:
        store = await EventStore.connect(dsn)
        try:
            return await allocate(store, trial_id, experiment_id=int(experiment_id))
        finally:
            await store.close()

    allocation_id = asyncio.run(trial())
    api.call(
        "POST",
        "/api/v1/agents/gpu01/register",
        {"slots": [{"slot_id": "0", "device": "cpu"}], "hostname": "gpu01"},
    )
    api.ids = {
        "experiment_id": [experiment_id],
        "trial_id": [str(trial_id)],
        "allocation_id": [allocation_id],
        "agent_id": ["gpu01"],
        "code_ref": [str(created["code_ref"])],
    }


@pytest.fixture(scope="module")
def live_api(
    pg_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveApi]:
    """``python -m services.api`` on a free port and a fresh database, seeded, logged in."""
    tmp: Path = tmp_path_factory.mktemp("fuzz")
    dsn = create_database(pg_server, "fuzz")
    port = _free_port()
    ready, log = tmp / "ready", tmp / "api.log"
    cluster_config = tmp / "cluster.yaml"
    # The seeded config keeps checkpoints under /tmp; the fuzzer's failed logins (and the
    # fixture's own) come from one address and must not lock the admin out.
    cluster_config.write_text(
        f"checkpoint_storage: {{allowed_roots: [{os.path.realpath(tempfile.gettempdir())}]}}\n"
        "accounts: {login_throttle: {max_failures_per_user: 1000000,"
        " max_failures_per_address: 1000000}}\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CAIRN_FAULTS": "",
        "CAIRN_ADMIN_PASSWORD": "admin",
        "CAIRN_READY_FILE": str(ready),
    }
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.api",
                "--db",
                dsn,
                "--port",
                str(port),
                "--cluster-config",
                str(cluster_config),
            ],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(proc, ready, log)
        api = LiveApi(url=f"http://127.0.0.1:{port}", admin="", log=log)
        api.admin = api.login()
        _seed(api, dsn)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def api_schema(live_api: LiveApi) -> BaseSchema:
    """The live OpenAPI document, fetched with the admin token."""
    return schemathesis.openapi.from_url(
        f"{live_api.url}/api/v1/openapi.json",
        headers={"Authorization": f"Bearer {live_api.admin}"},
        timeout=REQUEST_TIMEOUT,
    )


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every route the gateway serves, as the OpenAPI document spells them."""
    found = []
    for route in all_routes():
        path = PATH_PARAM.sub(r"{\1}", route.path)
        if not re.search(STREAMING, path):
            found.append((route.method.upper(), path))
    return found


def _bounded(case: schemathesis.Case[Any]) -> None:
    """Caps long polls at a fraction of a second and turns ``follow`` off, so no call hangs."""
    query = case.query if isinstance(case.query, dict) else None
    if query is None:
        return
    timeout = query.get("timeout_seconds")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0.2:
        query["timeout_seconds"] = 0.2
    if "follow" in query:
        query["follow"] = "false"


def _strategy(
    operation: APIOperation[Any, Any, Any, Any],
) -> st.SearchStrategy[schemathesis.Case[Any]]:
    """Valid and invalid cases of ``operation`` (only valid ones when nothing can be invalid)."""
    positive = operation.as_strategy(GenerationMode.POSITIVE)
    if not operation.path_parameters and not operation.query and operation.body is None:
        return positive
    return st.one_of(positive, operation.as_strategy(GenerationMode.NEGATIVE))


def test_every_documented_operation_is_fuzzed(api_schema: BaseSchema) -> None:
    """The live document lists exactly the operations fuzzed below (plus any streaming ones)."""
    documented = {
        (method.upper(), path)
        for path, item in api_schema.raw_schema["paths"].items()
        for method in item
        if not re.search(STREAMING, path)
    }
    assert documented == set(_operations())


@pytest.mark.parametrize(("method", "path"), _operations(), ids=lambda v: str(v))
def test_no_operation_answers_a_server_error_or_an_undocumented_status(
    api_schema: BaseSchema, live_api: LiveApi, method: str, path: str
) -> None:
    """Generated requests, valid and invalid, never get a 5xx or a status the document omits."""
    operation = api_schema[path][method]
    revokes_token = path.endswith("/auth/logout")

    @given(case=_strategy(operation), real_ids=st.booleans())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: schemathesis.Case[Any], real_ids: bool) -> None:
        if real_ids and isinstance(case.path_parameters, dict):
            for name in case.path_parameters:
                if name in live_api.ids:
                    case.path_parameters[name] = live_api.ids[name][0]
        _bounded(case)
        token = live_api.login() if revokes_token else live_api.admin
        case.call_and_validate(
            base_url=live_api.url,
            headers={"Authorization": f"Bearer {token}"},
            checks=[not_a_server_error, status_code_conformance],
            timeout=REQUEST_TIMEOUT,
        )

    seen = live_api.log.stat().st_size
    try:
        fuzz()
    finally:
        with live_api.log.open("rb") as f:
            f.seek(seen)
            errors = [
                line for line in f.read().decode(errors="replace").splitlines() if _unhandled(line)
            ]
        for line in errors[-3:]:
            print(f"API log: {line}")  # shown with the failure: the server's traceback
