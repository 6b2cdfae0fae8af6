"""Tasks across faults, with real processes: a notebook outlives SIGKILLs of the API and of
every other control-plane service (the supervisor of ``cairn up`` restarts them; the kernel
keeps its variables); an agent SIGKILLed while a notebook and a command run ends both as lost
and the proxy answers 410; an agent silent past the agent timeout loses its task and stops it
when it comes back; a task whose start command never reaches its agent is lost after the start
timeout instead of staying ASSIGNED.

``cairn down`` stops the agents first (they stop their runs and report them), so no task
outlives it; the control plane's restart with the agent still running is shown by SIGKILLing
every control-plane service at once instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cairn.local.servers import ServerProcess
from cairn.local.state import ProcessState, read_state
from events.domain.commands import agent_subject
from events.domain.names import task_allocation_id, task_stream
from events.log.bus import COMMANDS_STREAM, Bus
from events.log.bus_auth import agent_durable
from events.log.store import EventStore
from tests.e2e.harness import Cluster, wait_for
from tests.e2e.test_cli import Env, embedded_cluster, ok
from tests.e2e.test_notebooks import login, run_cell, start_notebook
from tests.helpers import process_alive, run_pids, wait_until

CONTROL_PLANE = ("relay", "api", "searcher", "scheduler", "tracker")
"""The services ``cairn up`` runs besides its agent."""

ENDED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster (one CPU slot) with user nora."""
    with embedded_cluster("cairn-taskrec-") as env:
        ok(env, "user", "create", "nora", "--password", "pw-nora-1")
        yield env


def supervised(env: Env, name: str) -> ProcessState:
    """The supervisor's record of process ``name`` (its pid now, its restarts)."""
    state = read_state(env.home)
    assert state is not None, "cairn up wrote no cluster.json"
    return state.processes[name]


async def task_events(env: Env, task_id: str) -> list[str]:
    """The types of the task's events, read from the embedded cluster's log."""
    state = read_state(env.home)
    assert state is not None
    store = await EventStore.connect(state.dsn)
    try:
        return [e.type for e in await store.read_stream(task_stream(task_id))]
    finally:
        await store.close()


def describe(env: Env, task_id: str) -> dict[str, Any]:
    return dict(json.loads(ok(env, "--json", "cmd", "describe", task_id).stdout))


class Notebook:
    """nora's view of a notebook through the proxy: a session, its kernel's channels."""

    def __init__(self, env: Env, task_id: str, http: aiohttp.ClientSession, token: str) -> None:
        self.env = env
        self.task_id = task_id
        self.http = http
        self.base = f"{env.api_url}/proxy/{task_id}/"
        self.bearer = {"Authorization": f"Bearer {token}"}
        self.kernel = ""

    async def serves(self) -> bool:
        """Whether the proxy reaches the notebook's server now."""
        try:
            async with self.http.get(self.base + "api/status", headers=self.bearer) as answer:
                return answer.status == 200
        except aiohttp.ClientError:
            return False  # the API is down

    async def start_kernel(self) -> None:
        async with self.http.get(self.base + "lab", headers=self.bearer) as answer:
            assert answer.status == 200
        xsrf = {c.key: c.value for c in self.http.cookie_jar}["_xsrf"]
        posting = {**self.bearer, "X-XSRFToken": xsrf}
        async with self.http.post(self.base + "api/kernels", headers=posting, json={}) as answer:
            assert answer.status == 201, await answer.text()
            self.kernel = (await answer.json())["id"]

    def channels(self) -> Any:
        """The kernel's channels over the proxied WebSocket."""
        url = f"{self.base}api/kernels/{self.kernel}/channels"
        return self.http.ws_connect(url, headers=self.bearer)


@pytest.fixture
async def notebook(cluster: Env) -> AsyncIterator[Notebook]:
    """A ready notebook of nora's with a kernel started through the proxy; killed after."""
    task = start_notebook(cluster)
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        token = await login(http, cluster, "nora", "pw-nora-1")
        opened = Notebook(cluster, task["id"], http, token)
        await opened.start_kernel()
        yield opened
    ok(cluster, "notebook", "kill", task["id"])


async def sigkill(env: Env, *names: str) -> dict[str, ProcessState]:
    """SIGKILLs the supervised processes ``names`` and waits until each is dead."""
    victims = {name: supervised(env, name) for name in names}
    for record in victims.values():
        assert record.pid is not None and record.alive(), f"{record.name} is not running"
        os.kill(record.pid, signal.SIGKILL)
    await wait_until(lambda: not any(r.alive() for r in victims.values()), timeout=30)
    return victims


async def test_notebook_outlives_a_sigkill_of_the_api_with_its_kernel_state(
    cluster: Env, notebook: Notebook
) -> None:
    """SIGKILL the API while a kernel is connected over the proxied WebSocket: the socket
    breaks, the supervisor starts a new API, the proxy serves the same notebook again, its
    kernel still holds the variable set before, and the task's log has no exit."""
    async with notebook.channels() as ws:
        assert (await run_cell(ws, "shards = 42; print(shards)")).split() == ["42"]
        (killed,) = (await sigkill(cluster, "api")).values()
        async with asyncio.timeout(30):
            while (await ws.receive()).type not in ENDED:
                pass  # the kernel's messages already in flight
    await wait_until(notebook.serves, timeout=60)
    restarted = supervised(cluster, "api")
    assert restarted.pid != killed.pid and restarted.restarts == killed.restarts + 1
    async with notebook.channels() as ws:
        assert (await run_cell(ws, "print(shards + 1)")).split() == ["43"]
    assert "TaskExited" not in await task_events(cluster, notebook.task_id)
    assert describe(cluster, notebook.task_id)["state"] == "RUNNING"


async def test_notebook_outlives_a_sigkill_of_every_control_plane_service(
    cluster: Env, notebook: Notebook
) -> None:
    """SIGKILL relay, API, searcher, scheduler and tracker at once while the agent keeps
    running (what ``cairn down`` + ``up`` would be if the agent outlived it): every one comes
    back, the proxy serves the notebook again, its kernel state survived, no exit is logged."""
    async with notebook.channels() as ws:
        assert (await run_cell(ws, "seen = ['before']; print(len(seen))")).split() == ["1"]
    agent = supervised(cluster, "agent")
    killed = await sigkill(cluster, *CONTROL_PLANE)

    def back() -> bool:
        now = {name: supervised(cluster, name) for name in CONTROL_PLANE}
        return all(r.pid != killed[n].pid and r.state == "running" for n, r in now.items())

    await wait_until(back, timeout=90, detail=lambda: str(read_state(cluster.home)))
    await wait_until(notebook.serves, timeout=60)
    async with notebook.channels() as ws:
        assert (await run_cell(ws, "print(seen[0])")).split() == ["before"]
    assert supervised(cluster, "agent").pid == agent.pid, "the agent ran throughout"
    assert "TaskExited" not in await task_events(cluster, notebook.task_id)


async def test_agent_sigkill_loses_its_notebook_and_command_and_the_proxy_says_gone(
    cluster: Env, notebook: Notebook
) -> None:
    """SIGKILL the agent while a notebook (with a kernel) and a command run: their processes
    outlive it, the supervisor's new agent process stops them (the kernel too) before it
    registers, both tasks end ``lost`` (agent restarted) instead of hanging in RUNNING, and the
    proxy answers 410 naming that."""
    async with notebook.channels() as ws:
        assert (await run_cell(ws, "import os; print(os.getpid())")).strip().isdigit()
    command = ok(cluster, "cmd", "run", "-d", "python", "-c", "import time; time.sleep(600)")
    command_id = command.stdout.strip()
    await wait_until(lambda: describe(cluster, command_id)["state"] == "RUNNING", timeout=60)
    allocations = [task_allocation_id(t) for t in (notebook.task_id, command_id)]
    assert all(run_pids(a) for a in allocations), "both tasks' processes run"
    assert len(run_pids(allocations[0])) >= 2, "the notebook's server and its kernel"

    (killed,) = (await sigkill(cluster, "agent")).values()

    for task_id in (notebook.task_id, command_id):
        await wait_until(lambda t=task_id: describe(cluster, t)["state"] == "TERMINATED", 60)
        final = describe(cluster, task_id)
        assert (final["outcome"], final["message"]) == ("lost", "agent restarted"), final
    assert supervised(cluster, "agent").pid != killed.pid
    agent_log = await asyncio.to_thread(Path(supervised(cluster, "agent").log).read_text)
    left = [line for line in agent_log.splitlines() if "left by an earlier agent process" in line]
    assert left and all(a in left[-1] for a in allocations), "the new agent found both running"
    await wait_until(lambda: not any(run_pids(a) for a in allocations), timeout=30)

    async with notebook.http.get(notebook.base + "api/status", headers=notebook.bearer) as answer:
        assert answer.status == 410
        message = (await answer.json())["error"]["message"]
    assert "has ended (lost: agent restarted)" in message


@pytest.fixture
async def processes(
    db_url: str, nats_server: ServerProcess, tmp_path: Path
) -> AsyncIterator[Cluster]:
    """Relay, searcher, scheduler and API as processes (agent timeout 4 s, task start timeout
    3 s), logged in as admin; the test starts its agent."""
    c = Cluster(db_url, nats_server.url, tmp_path)
    c.start_services("--agent-timeout", "4", "--task-start-timeout", "3", timeout=30)
    try:
        await c.login()
        yield c
    finally:
        for name in c.agents:
            if c.procs[name].poll() is None:
                os.kill(c.procs[name].pid, signal.SIGCONT)
        c.stop()


async def run_command(c: Cluster, argv: list[str]) -> str:
    """Submits a one-slot command task as admin; its id."""
    return str((await c.request("POST", "/commands", {"argv": argv}))["id"])


async def stream_of(store: EventStore, task_id: str) -> list[Any]:
    return list(await store.read_stream(task_stream(task_id)))


async def test_a_task_of_an_agent_silent_past_its_timeout_is_lost_and_stopped_when_it_returns(
    processes: Cluster, store: EventStore
) -> None:
    """SIGSTOP the agent while a command runs: past the agent timeout the task is lost (the
    agent stopped heartbeating) while its process still runs; once the agent is resumed it
    learns the task ended and stops that process, so nothing serves on unseen."""
    agent = processes.start_agent("agent-a", 1)
    task_id = await run_command(processes, ["python", "-c", "import time; time.sleep(600)"])
    allocation = task_allocation_id(task_id)

    async def started() -> bool:
        return any(e.type == "TaskStarted" for e in await stream_of(store, task_id))

    await wait_for(processes, started)
    [pid] = run_pids(allocation)
    os.kill(agent.pid, signal.SIGSTOP)

    async def exited() -> list[Any]:
        return [e.payload for e in await stream_of(store, task_id) if e.type == "TaskExited"]

    await wait_for(processes, exited, timeout=60)
    [verdict] = await exited()
    assert (verdict["outcome"], verdict["message"]) == (
        "lost",
        "agent agent-a stopped heartbeating",
    )
    assert process_alive(pid), "the task's process ran on while its agent was silent"
    os.kill(agent.pid, signal.SIGCONT)
    await wait_until(lambda: not run_pids(allocation), timeout=60, detail=processes.logs)
    log = (processes.workdir / "agent-a.log").read_text()
    assert "the task ended in the log; stopping its run" in log
    assert [e.type for e in await stream_of(store, task_id)].count("TaskExited") == 1


async def test_a_task_whose_start_command_never_reaches_its_agent_is_lost_after_the_start_timeout(
    processes: Cluster, store: EventStore, bus: Bus
) -> None:
    """The agent's command queue is deleted (the start command is published but can never be
    delivered) while the agent keeps heartbeating: the task placed on it is recorded lost,
    never started, once its heartbeats 3 s after the placement do not list it; it never ran."""
    agent = processes.start_agent("agent-a", 1)
    durable = agent_durable("agent-a")

    async def subscribed() -> bool:
        try:
            await bus.js.consumer_info(COMMANDS_STREAM, durable)
        except Exception:
            return False
        return len(await store.read_stream("agent-agent-a")) >= 1

    await wait_for(processes, subscribed)
    await bus.js.delete_consumer(COMMANDS_STREAM, durable)
    task_id = await run_command(processes, ["python", "-c", "print('never')"])

    async def exited() -> list[Any]:
        return [e.payload for e in await stream_of(store, task_id) if e.type == "TaskExited"]

    await wait_for(processes, exited, timeout=60)
    [verdict] = await exited()
    assert verdict["outcome"] == "lost"
    assert verdict["message"].startswith("never started: agent agent-a did not receive"), verdict
    types = [e.type for e in await stream_of(store, task_id)]
    assert types == ["TaskRequested", "TaskAllocated", "TaskExited"], types
    start = await bus.js.get_last_msg(COMMANDS_STREAM, agent_subject("agent-a"))
    assert json.loads(start.data)["kind"] == "start", "the start command was published"
    assert agent.poll() is None, "the agent ran (and heartbeated) throughout"
