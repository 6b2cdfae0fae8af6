"""Tasks on the compose cluster: a command and a notebook, each run by an agent in a container of
the trial image that shares the agent container's network, the notebook reached only through the
API's proxy at the address its agent recorded (the agent container's address on the compose
network)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from events.domain.names import task_allocation_id
from services.agent.docker_runtime import LABEL_AGENT, LABEL_ALLOCATION
from tests.e2e.test_notebooks import run_cell
from tests.helpers import wait_until_sync as wait_until
from tests.lab.compose import Lab


def task_containers(engine: Any, task_id: str) -> list[Any]:
    """The containers of the task's allocation, stopped ones included."""
    label = f"{LABEL_ALLOCATION}={task_allocation_id(task_id)}"
    found: list[Any] = engine.containers.list(all=True, filters={"label": label})
    return found


def test_cmd_run_runs_in_a_task_container_with_its_output_and_exit_code(
    docker_engine: Any, lab: Lab
) -> None:
    """``cairn cmd run`` on the compose cluster: the command runs in a container of the trial
    image, its output is shipped, the CLI exits with its exit code, and its container goes."""
    script = "import sys; print('inside', sys.prefix); sys.exit(3)"
    done = lab.run_cli("cmd", "run", "python", "-c", script, timeout=900)
    assert done.returncode == 3, f"{done.stdout}\n{done.stderr}"
    final = json.loads(done.stdout)
    assert (final["state"], final["outcome"], final["exit_code"]) == ("TERMINATED", "failed", 3)
    status, logs = lab.api("GET", f"/tasks/{final['id']}/logs")
    assert status == 200, logs
    assert any("inside /opt/cairn" in e["line"] for e in logs["logs"]), logs
    wait_until(lambda: not task_containers(docker_engine, final["id"]), timeout=120, every=2.0)


def test_notebook_serves_through_the_proxy_from_its_agents_network(
    docker_engine: Any, lab: Lab
) -> None:
    """``cairn notebook start`` on the compose cluster: JupyterLab runs in a task container
    sharing its agent container's network, the API's proxy reaches it at the recorded address,
    a kernel prints its task id over the proxied WebSocket, and once killed the proxy answers
    410 and no container of it is left."""
    task = lab.cli(
        "notebook", "start", "--no-browser", "--config", "resources.slots=0", timeout=900
    )
    assert task["ready"], task
    task_id = task["id"]
    (container,) = task_containers(docker_engine, task_id)
    agent_id = container.labels[LABEL_AGENT]
    (agent,) = lab.containers(docker_engine, agent_id)
    assert container.attrs["HostConfig"]["NetworkMode"] == f"container:{agent.id}"
    asyncio.run(_use_notebook(lab, task_id))
    lab.cli("notebook", "kill", task_id)

    def gone() -> bool:
        status, _ = lab.api("GET", f"/tasks/{task_id}")
        return status == 200 and asyncio.run(_proxy_status(lab, task_id)) == 410

    wait_until(gone, timeout=120, every=2.0)
    wait_until(lambda: not task_containers(docker_engine, task_id), timeout=120, every=2.0)


async def _proxy_status(lab: Lab, task_id: str) -> int:
    headers = lab.auth_headers()
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{lab.url}/proxy/{task_id}/api/status", headers=headers) as answer,
    ):
        return answer.status


async def _use_notebook(lab: Lab, task_id: str) -> None:
    """Through the proxy as the admin: the server's status, a kernel, a cell."""
    bearer = lab.auth_headers()
    base = f"{lab.url}/proxy/{task_id}/"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(base + "api/status", headers=bearer) as answer:
            assert answer.status == 200 and "last_activity" in await answer.json()
        async with http.get(base + "lab", headers=bearer) as answer:
            assert answer.status == 200 and "JupyterLab" in await answer.text()
        xsrf = {c.key: c.value for c in http.cookie_jar}["_xsrf"]
        posting = {**bearer, "X-XSRFToken": xsrf}
        async with http.post(base + "api/kernels", headers=posting, json={}) as answer:
            assert answer.status == 201, await answer.text()
            kernel = (await answer.json())["id"]
        channels = f"{base}api/kernels/{kernel}/channels"
        async with http.ws_connect(channels, headers=bearer) as ws:
            code = "import cairn as det; print(1+1); print(det.get_cluster_info().task_id)"
            assert (await run_cell(ws, code)).split() == ["2", task_id]
