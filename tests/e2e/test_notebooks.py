"""``cairn notebook`` end to end on an embedded cluster: a real JupyterLab started by the agent,
reached only through the API's proxy with the owner's session (bearer or cookie), a kernel
driven over the proxied WebSocket, other users refused, an ended notebook gone (410), and an
idle notebook ended by its idle_timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from services.api.proxy import MAX_WS_FRAME
from tests.e2e.test_cli import Env, admin_password, as_user, cli, embedded_cluster, ok
from tests.helpers import wait_until, wait_until_sync


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster (one CPU slot; the notebooks hold none) with users nora and mallory."""
    with embedded_cluster("cairn-nb-") as env:
        ok(env, "user", "create", "nora", "--password", "pw-nora-1")
        ok(env, "user", "create", "mallory", "--password", "pw-mallory")
        yield env


def start_notebook(
    env: Env, *config: str, dirs: tuple[str, ...] = (), workspace: str | None = None
) -> dict[str, Any]:
    """Starts a zero-slot notebook as nora with the CLI (its context holds ``data.txt`` and the
    directories ``dirs``; in ``workspace`` when given) and waits until it serves."""
    context = env.shared / f"ctx-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    (context / "data.txt").write_text("shards: 42\n")
    for name in dirs:  # each with a file: a context is uploaded file by file
        (context / name).mkdir(parents=True)
        (context / name / "README.md").write_text(f"# {name}\n")
    overrides = [a for c in ("resources.slots=0", *config) for a in ("--config", c)]
    if workspace is not None:
        overrides += ["--workspace", workspace]
    done = as_user(
        env, env.shared / "nora", "nora", "pw-nora-1",
        "--json", "notebook", "start", "--no-browser", "--context", str(context), *overrides,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    task = json.loads(done.stdout)
    assert task["ready"] and task["url"].endswith(f"/proxy/{task['id']}/lab")
    return dict(task)


def server_process(task_id: str) -> psutil.Process:
    """The notebook server of ``task_id`` (found by its command line)."""
    for proc in psutil.process_iter(["cmdline"]):
        if f"--ServerApp.base_url=/proxy/{task_id}/" in (proc.info["cmdline"] or []):
            return proc
    raise AssertionError(f"no server process of task {task_id}")


def server_address(task_id: str) -> str:
    """``http://address:port`` the notebook of ``task_id`` listens on, as a process on the
    agent's host finds it (from the server's command line)."""
    argv = server_process(task_id).cmdline()
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    return f"http://{flags['ServerApp.ip']}:{flags['ServerApp.port']}"


async def login(http: aiohttp.ClientSession, env: Env, user: str, password: str) -> str:
    async with http.post(
        f"{env.api_url}/api/v1/auth/login", json={"username": user, "password": password}
    ) as answer:
        assert answer.status == 200
        return str((await answer.json())["token"])


async def run_cell(ws: aiohttp.ClientWebSocketResponse, code: str) -> str:
    """Executes ``code`` on the kernel's channels and returns its stdout."""
    msg_id = uuid.uuid4().hex
    await ws.send_json(
        {
            "header": {
                "msg_id": msg_id,
                "username": "nora",
                "session": uuid.uuid4().hex,
                "msg_type": "execute_request",
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False},
        }
    )  # fmt: skip
    out = ""
    async for message in ws:
        reply = json.loads(message.data)
        if reply.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        if reply["msg_type"] == "stream":
            out += reply["content"]["text"]
        if reply["msg_type"] == "error":
            raise AssertionError(reply["content"])
        if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
            return out
    raise AssertionError("the kernel's channel closed")


async def test_notebook_through_the_proxy_owner_only_kernel_runs_and_ended_is_gone(
    cluster: Env,
) -> None:
    """The owner reaches JupyterLab through the proxy (bearer and login cookie), runs a cell
    over the proxied WebSocket that prints 1+1 and its cluster info; no session is 401,
    another user 403, an unknown task 404, no header reroutes the proxy, an oversized frame
    closes the socket, the server refuses whoever reaches its port without the proxy, an admin
    gets in with a bearer token but not with a browser's cookie, and once killed the proxy
    answers 410."""
    task = start_notebook(cluster)
    task_id = task["id"]
    base = f"{cluster.api_url}/proxy/{task_id}/"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        token = await login(http, cluster, "nora", "pw-nora-1")
        bearer = {"Authorization": f"Bearer {token}"}
        async with http.get(base + "api/status", headers=bearer) as answer:
            assert answer.status == 200 and "last_activity" in await answer.json()
        async with http.get(base + "lab") as answer:  # the login's cookie, no header
            assert answer.status == 200 and "JupyterLab" in await answer.text()
        async with http.get(base + "api/contents/data.txt", headers=bearer) as answer:
            assert (await answer.json())["content"] == "shards: 42\n"

    async with aiohttp.ClientSession() as http:
        mallory = await login(http, cluster, "mallory", "pw-mallory")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as bare:
        async with bare.get(base + "api/status") as answer:
            assert answer.status == 401
        other = {"Authorization": f"Bearer {mallory}"}
        async with bare.get(base + "lab", headers=other) as answer:
            assert answer.status == 403
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as admin:
        # An admin reaches another user's notebook with a bearer token, never as a browser
        # does (with the login's cookie): its pages would run where the admin's token lives.
        admin_token = await login(admin, cluster, "admin", admin_password(cluster))
        async with admin.get(base + "api/status") as answer:
            assert answer.status == 403
            assert "never in a browser" in (await answer.json())["error"]["message"]
        as_admin = {"Authorization": f"Bearer {admin_token}"}
        async with admin.get(base + "api/status", headers=as_admin) as answer:
            assert answer.status == 200
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as bare:
        async with bare.get(
            f"{cluster.api_url}/proxy/00000000000000ff/api/status", headers=bearer
        ) as answer:
            assert answer.status == 404
        rerouted = {**bearer, "Host": "169.254.169.254", "X-Forwarded-Host": "example.com"}
        async with bare.get(base + "api/status", headers=rerouted) as answer:
            assert answer.status == 200 and "last_activity" in await answer.json()

        async with bare.get(base + "lab", headers=bearer) as answer:  # Jupyter's _xsrf cookie
            assert answer.status == 200
        xsrf = {c.key: c.value for c in bare.cookie_jar}["_xsrf"]
        posting = {**bearer, "X-XSRFToken": xsrf}
        async with bare.post(base + "api/kernels", headers=posting, json={}) as answer:
            assert answer.status == 201, await answer.text()
            kernel = (await answer.json())["id"]
        channels = f"{base}api/kernels/{kernel}/channels"
        async with bare.ws_connect(channels, headers=bearer) as ws:
            code = "import cairn as det; print(1+1); print(det.get_cluster_info().task_id)"
            assert (await run_cell(ws, code)).split() == ["2", task_id]
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await bare.ws_connect(channels, headers=other)
        assert refused.value.status == 403
        async with bare.ws_connect(channels, headers=bearer) as ws:
            ended = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
            # The proxy drops the socket: the send breaks off, or a close follows.
            with contextlib.suppress(ConnectionError, aiohttp.ClientError):
                await ws.send_str("x" * (MAX_WS_FRAME + 1))
                async with asyncio.timeout(30):
                    while (await ws.receive()).type not in ended:
                        pass  # the kernel's own messages until the proxy closes
        async with bare.get(base + "api/status", headers=bearer) as answer:
            assert answer.status == 200  # the notebook itself is unharmed

        # Whoever reaches the notebook's port without the proxy (another user's trial on the
        # same host) is refused: the server requires the token only the proxy adds.
        direct = f"{server_address(task_id)}/proxy/{task_id}/"
        async with bare.get(direct + "api/status") as answer:
            assert answer.status == 403
        async with bare.get(direct + "api/status", headers=bearer) as answer:
            assert answer.status == 403  # a cairn session is no credential there either
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await bare.ws_connect(f"{direct}api/kernels/{kernel}/channels")

        ok(cluster, "notebook", "kill", task_id)

        async def gone() -> bool:
            async with bare.get(base + "api/status", headers=bearer) as answer:
                return answer.status == 410

        await wait_until(gone, timeout=30)
        async with bare.get(base + "api/status", headers=bearer) as answer:
            assert "has ended (killed" in (await answer.json())["error"]["message"]


def test_idle_notebook_is_killed_by_its_idle_timeout(cluster: Env) -> None:
    """A notebook with idle_timeout 3s and no kernel or connection is killed, and its exit
    says it was idle."""
    task = start_notebook(cluster, "idle_timeout=3s")

    def ended() -> dict[str, Any] | None:
        shown = json.loads(ok(cluster, "--json", "cmd", "describe", task["id"]).stdout)
        return shown if shown["state"] == "TERMINATED" else None

    final = wait_until_sync(ended, timeout=60)
    assert final["outcome"] == "killed" and "idle_timeout 3s" in final["message"]


async def test_a_notebook_opens_at_its_work_dir_with_the_whole_context_browsable(
    cluster: Env,
) -> None:
    """With ``work_dir: nb``, JupyterLab's server runs in the context's ``nb`` and its file
    browser opens there (the page's ``preferredPath``), while its root is still the context:
    the contents API lists ``data.txt`` beside ``nb``."""
    task = start_notebook(cluster, "work_dir=nb", dirs=("nb",))
    base = f"{cluster.api_url}/proxy/{task['id']}/"
    server = server_process(task["id"])
    assert Path(server.cwd()).name == "nb"
    async with aiohttp.ClientSession() as http:
        bearer = {"Authorization": f"Bearer {await login(http, cluster, 'nora', 'pw-nora-1')}"}
        async with http.get(base + "lab", headers=bearer) as answer:
            page = await answer.text()
        found = re.search(r'<script id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S)
        assert found is not None, page[:500]
        assert json.loads(found.group(1))["preferredPath"] == "nb"
        async with http.get(base + "api/contents", headers=bearer) as answer:
            root = await answer.json()
        assert sorted(e["name"] for e in root["content"]) == ["data.txt", "nb"]
    ok(cluster, "notebook", "kill", task["id"])


async def test_a_running_notebook_in_a_workspace_obeys_its_roles_and_holds_the_workspace(
    cluster: Env,
) -> None:
    """Nora's notebook in workspace ``lab`` runs; an Editor of ``lab`` reaches it through the
    proxy with a bearer token (never with a browser's cookie), a Viewer of ``lab`` sees it but
    is refused the proxy and the kill (403); deleting ``lab`` is refused (409 naming the
    notebook) while it runs and succeeds once it was killed."""
    ok(cluster, "workspace", "create", "lab")
    ok(cluster, "user", "create", "ed", "--password", "pw-ed-123")
    for role, user in (("Editor", "nora"), ("Editor", "ed"), ("Viewer", "mallory")):
        ok(cluster, "rbac", "assign-role", role, "-u", user, "-w", "lab")
    task = start_notebook(cluster, workspace="lab")
    task_id = task["id"]
    assert task["workspace"] == "lab"
    base = f"{cluster.api_url}/proxy/{task_id}/"
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        editor = {"Authorization": f"Bearer {await login(http, cluster, 'ed', 'pw-ed-123')}"}
        async with http.get(base + "api/status", headers=editor) as answer:
            assert answer.status == 200 and "last_activity" in await answer.json()
        async with http.get(base + "api/status") as answer:  # ed's login cookie only
            assert answer.status == 403
            assert "never in a browser" in (await answer.json())["error"]["message"]
    async with aiohttp.ClientSession() as http:
        viewer = {"Authorization": f"Bearer {await login(http, cluster, 'mallory', 'pw-mallory')}"}
        async with http.get(base + "api/status", headers=viewer) as answer:
            assert answer.status == 403
        async with http.get(f"{cluster.api_url}/api/v1/tasks/{task_id}", headers=viewer) as answer:
            assert answer.status == 200 and (await answer.json())["workspace"] == "lab"
        async with http.post(
            f"{cluster.api_url}/api/v1/tasks/{task_id}/kill", headers=viewer, json={}
        ) as answer:
            assert answer.status == 403

    refused = cli(cluster, "workspace", "delete", "lab", "--yes")
    assert refused.returncode != 0
    assert f"notebook {task_id}" in refused.stdout + refused.stderr, refused
    ok(cluster, "notebook", "kill", task_id)

    def ended() -> bool:
        shown = json.loads(ok(cluster, "--json", "cmd", "describe", task_id).stdout)
        return bool(shown["state"] == "TERMINATED")

    wait_until_sync(ended, timeout=60)
    ok(cluster, "workspace", "delete", "lab", "--yes")
