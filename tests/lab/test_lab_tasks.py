"""Tasks on the compose cluster: a command, a notebook, a shell and a TensorBoard, each run by an
agent in a container of the trial image that shares the agent container's network, the serving
ones reached only through the API's proxy at the address their agent recorded (the agent
container's address on the compose network)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from events.domain.names import task_allocation_id
from services.agent.docker_runtime import LABEL_AGENT, LABEL_ALLOCATION
from tests.e2e.test_notebooks import run_cell
from tests.e2e.test_shells import Terminal
from tests.helpers import wait_until as async_wait_until
from tests.helpers import wait_until_sync as wait_until
from tests.lab.compose import Lab

TRIAL_DIR = Path(__file__).with_name("trial")


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
    _in_its_agents_network(docker_engine, lab, task_id)
    asyncio.run(_use_notebook(lab, task_id))
    _kill_and_check_gone(docker_engine, lab, "notebook", task_id)


def test_shell_session_runs_in_a_task_container_through_the_proxy(
    docker_engine: Any, lab: Lab
) -> None:
    """``cairn shell start -d`` on the compose cluster: the terminal server runs in a task
    container sharing its agent container's network; over the proxied WebSocket its pty runs a
    login shell in the task's work directory, as no root and without the serving token, and
    ``exit 3`` sends ``{"exit": 3}``; once killed the proxy answers 410 and no container of it
    is left."""
    task = lab.cli("shell", "start", "-d", "--config", "resources.slots=0")
    task_id = task["id"]
    wait_until(lambda: _serving(lab, task_id), timeout=900, every=2.0)
    _in_its_agents_network(docker_engine, lab, task_id)
    asyncio.run(_use_shell(lab, task_id))
    _kill_and_check_gone(docker_engine, lab, "shell", task_id)


def test_tensorboard_shows_a_container_trials_scalars_through_the_proxy(
    docker_engine: Any, lab: Lab
) -> None:
    """A one-trial experiment in a container writes TensorBoard scalars through the Core API;
    ``cairn tensorboard start`` on it runs TensorBoard in a task container that reads them from
    the checkpoint volume, and TensorBoard's own scalars API through the proxy shows run
    ``trial_<id>`` with the trial's training and validation steps; once killed the proxy
    answers 410 and no container of it is left."""
    created = lab.cli("experiment", "create", str(TRIAL_DIR / "single.yaml"), str(TRIAL_DIR))
    exp_id = int(created["id"])
    lab.cli("experiment", "wait", str(exp_id), timeout=900)
    described = lab.cli("experiment", "describe", str(exp_id))
    assert described["state"] == "COMPLETED", described
    trial_id = int(described["trials"][0]["trial_id"])

    task = lab.cli("tensorboard", "start", str(exp_id), "--no-browser", timeout=900)
    assert task["ready"], task
    task_id = task["id"]
    _in_its_agents_network(docker_engine, lab, task_id)
    steps = asyncio.run(_tensorboard_steps(lab, task_id, f"trial_{trial_id}"))
    assert steps == {"training/loss": [10, 20], "validation/validation_loss": [20]}, steps
    _kill_and_check_gone(docker_engine, lab, "tensorboard", task_id)


def _serving(lab: Lab, task_id: str) -> bool:
    """Whether the task serves (failing at once if it ended first)."""
    status, task = lab.api("GET", f"/tasks/{task_id}")
    assert status == 200, task
    if task["state"] == "TERMINATED":
        _, logs = lab.api("GET", f"/tasks/{task_id}/logs")
        lines = "\n".join(e["line"] for e in (logs or {}).get("logs", []))
        raise AssertionError(f"{task['outcome']}: {task.get('message')}\n{lines}")
    return bool(task["ready"])


def _in_its_agents_network(engine: Any, lab: Lab, task_id: str) -> None:
    """The task has one container, in the network of the agent container that started it."""
    (container,) = task_containers(engine, task_id)
    (agent,) = lab.containers(engine, container.labels[LABEL_AGENT])
    assert container.attrs["HostConfig"]["NetworkMode"] == f"container:{agent.id}"


def _kill_and_check_gone(engine: Any, lab: Lab, kind: str, task_id: str) -> None:
    """Kills the task with the CLI; waits until the proxy answers 410 and its container went."""
    lab.cli(kind, "kill", task_id)
    wait_until(lambda: asyncio.run(_proxy_status(lab, task_id)) == 410, timeout=120, every=2.0)
    wait_until(lambda: not task_containers(engine, task_id), timeout=120, every=2.0)


async def _use_shell(lab: Lab, task_id: str) -> None:
    """One session through the proxy as the admin: a marker echoed, then ``exit 3``."""
    terminal = f"{lab.url}/proxy/{task_id}/terminal"
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(terminal, headers=lab.auth_headers()) as ws,
    ):
        term = Terminal(ws)
        await term.type("echo lab-$((6*7)) token-${CAIRN_SERVE_TOKEN:-none} uid-$(id -u) $PWD\n")
        found = await term.expect(r"lab-42 token-none uid-(\d+) (\S+)\r\n", timeout=60)
        assert int(found.group(1)) != 0, found.group(0)
        assert "/allocations/" in found.group(2).decode(), found.group(0)
        await term.type("exit 3\n")
        await term.until_closed()
        assert term.exit == 3 and ws.close_code == aiohttp.WSCloseCode.OK


async def _tensorboard_steps(lab: Lab, task_id: str, run: str) -> dict[str, list[int]]:
    """The steps TensorBoard shows for each tag of ``run``, once it shows the trial's training
    and validation tags (TensorBoard reads its copy of the files some seconds after it starts)."""
    base = f"{lab.url}/proxy/{task_id}/data/plugin/scalars/"
    wanted = {"training/loss", "validation/validation_loss"}
    headers = lab.auth_headers()
    async with aiohttp.ClientSession(headers=headers) as http:

        async def tags() -> dict[str, Any] | None:
            async with http.get(base + "tags") as answer:
                assert answer.status == 200, await answer.text()
                shown: dict[str, Any] = await answer.json()
            return shown if wanted <= set(shown.get(run, {})) else None

        shown = await async_wait_until(tags, timeout=120, every=1.0)
        assert set(shown) == {run}, shown
        steps = {}
        for tag in sorted(wanted):
            params = {"run": run, "tag": tag}
            async with http.get(base + "scalars", params=params) as answer:
                assert answer.status == 200, await answer.text()
                steps[tag] = [int(point[1]) for point in await answer.json()]
        return steps


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
