"""Tasks that serve HTTP (a notebook, a TensorBoard, a shell): the server's command line, its
readiness, its idling.

The agent picks the port, starts the server bound to the agent's address and serving under
``/proxy/<task_id>/`` (the API's proxy forwards paths unchanged), reports ``ready`` once the
port accepts connections, and, when a notebook or a shell has an ``idle_timeout``, polls the
server's
``/api/status`` and reports ``idle`` once it has had no activity and no open connection for
that long (the API then decides the kill). The server requires a token of every request
(:data:`SERVE_TOKEN_VARIABLES` names where it is in its environment: the spec's
``serve_token``, an HMAC of the task and its allocation under the cluster secret); the API's
proxy adds it to what it forwards and the agent to its status polls, so a process that reaches
the port without going through the proxy (another user's trial on the same host) is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import structlog

from cairn.tasks import SERVE_TOKEN_VARIABLE
from cairn.tasks.tensorboard_sources import TensorboardSourceFile, source_of
from events.domain.config.storage import checkpoint_root
from events.domain.config.task import TaskConfig
from services.contracts.agent import TensorboardSpecSource

log = structlog.get_logger("agent")


READY_POLL_SECONDS = 0.2
IDLE_POLL_MAX_SECONDS = 10.0

SERVE_TOKEN_VARIABLES = {
    "notebook": "JUPYTER_TOKEN",
    "tensorboard": SERVE_TOKEN_VARIABLE,
    "shell": SERVE_TOKEN_VARIABLE,
}
"""Where each serving kind's server finds its token in its environment."""

TENSORBOARD_LOGDIR = "logdir"
"""A TensorBoard's local copy of the trials' files, in its work directory."""


def proxy_prefix(task_id: str) -> str:
    """The path the task serves under (what the API's proxy forwards)."""
    return f"/proxy/{task_id}/"


def notebook_argv(
    task_id: str, *, address: str, port: int, work: Path, start: Path | None = None
) -> list[str]:
    """JupyterLab on ``address``:``port`` under the proxy's prefix, rooted at the work dir (its
    token comes from ``JUPYTER_TOKEN`` in its environment, never its command line).

    With ``start`` (a directory under ``work``: the task's ``work_dir``), its file browser opens
    there; the root stays ``work``, so the whole context can still be browsed.
    """
    opens = [] if start is None or start == work else [start.relative_to(work).as_posix()]
    return [
        "python",
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={address}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={proxy_prefix(task_id)}",
        f"--ServerApp.root_dir={work}",
        "--ServerApp.allow_remote_access=True",
        "--ServerApp.password=",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        *(f"--ContentsManager.preferred_dir={path}" for path in opens),
    ]


def shell_argv(task_id: str, *, address: str, port: int, work: Path) -> list[str]:
    """cairn's terminal server (:mod:`cairn.tasks.shell_server`) on ``address``:``port`` under
    the proxy's prefix, starting its shells in ``work`` (the task's start directory: its context,
    or the ``work_dir`` in it; its token comes from its environment, never its command line)."""
    return [
        "python",
        "-m",
        "cairn.tasks.shell_server",
        f"--address={address}",
        f"--port={port}",
        f"--prefix={proxy_prefix(task_id)}",
        f"--work={work}",
    ]


def tensorboard_argv(
    task_id: str, *, address: str, port: int, work: Path, sources: Path
) -> list[str]:
    """cairn's TensorBoard server on ``address``:``port`` under the proxy's prefix, reading the
    sources file ``sources`` and copying into ``<work>/logdir`` (its token comes from its
    environment, never its command line)."""
    return [
        "python",
        "-m",
        "cairn.tasks.tensorboard_server",
        f"--address={address}",
        f"--port={port}",
        f"--prefix={proxy_prefix(task_id)}",
        f"--sources={sources}",
        f"--logdir={work / TENSORBOARD_LOGDIR}",
    ]


def tensorboard_sources(
    spec: Sequence[TensorboardSpecSource], default_root: Path
) -> tuple[list[TensorboardSourceFile], list[Path]]:
    """Where a TensorBoard's experiments keep their TensorBoard files (the sources file's
    entries), and the storage directories among them (which its confined process must see)."""
    sources = [
        source_of(s.experiment_id, s.trial_ids, s.checkpoint_storage, default_root) for s in spec
    ]
    roots = {
        checkpoint_root(s.checkpoint_storage, default_root)
        for s in spec
        if (s.checkpoint_storage or {}).get("type") != "s3"
    }
    return sources, sorted(roots)


async def wait_ready(address: str, port: int, exited: Callable[[], bool]) -> bool:
    """Waits until ``address``:``port`` accepts a connection (``True``) or the process
    exited (``False``)."""
    while not exited():
        try:
            _, writer = await asyncio.open_connection(address, port)
        except OSError:
            await asyncio.sleep(READY_POLL_SECONDS)
            continue
        writer.close()
        await writer.wait_closed()
        return True
    return False


def idle_seconds(status: dict[str, object], now: datetime) -> int:
    """How long a server whose ``/api/status`` answered ``status`` (Jupyter's, or a shell's in
    the same shape) has been idle: 0 while a connection is open, else the time since its last
    activity."""
    if int(str(status.get("connections", 0))) > 0:
        return 0
    last = datetime.fromisoformat(str(status["last_activity"]).replace("Z", "+00:00"))
    return max(0, int((now - last).total_seconds()))


async def watch_idle(
    task_id: str,
    address: str,
    port: int,
    config: TaskConfig,
    token: str | None,
    report: Callable[[int], object],
) -> None:
    """Polls the server's ``/api/status``; calls ``report(idle_seconds)`` (awaited) once it
    has been idle ``idle_timeout``, then returns. Returns at once without an idle_timeout."""
    timeout = config.idle_seconds
    if timeout is None:
        return
    every = min(max(timeout / 5, 0.5), IDLE_POLL_MAX_SECONDS)
    url = f"http://{address}:{port}{proxy_prefix(task_id)}api/status"
    headers = {"Authorization": f"token {token}"} if token else {}
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=10), headers=headers
    ) as session:
        while True:
            await asyncio.sleep(every)
            try:
                async with session.get(url) as answer:
                    status = await answer.json()
                idle = idle_seconds(status, datetime.now(UTC))
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                log.warning("task server status unavailable", task_id=task_id, error=str(exc))
                continue
            if idle >= timeout:
                log.info("task server idle", task_id=task_id, idle_seconds=idle)
                result = report(idle)
                if asyncio.iscoroutine(result):
                    await result
                return
