"""The lab suite (``make test-lab``): a real Docker engine, images built offline, the compose
cluster. Skipped unless ``CAIRN_LAB=1`` (``make test`` never runs it).

The compose cluster is started once for the session (``lab``), under its own project name
(``cairnlab``, or ``$CAIRN_LAB_PROJECT``) and API port, with its secrets in a temporary
directory; it is taken down with its volumes at the end, and the teardown fails if anything of
the project is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.compose import PROJECT, QUICKSTART, Lab, env_file_values

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skips this directory's tests unless the lab suite was asked for."""
    if os.environ.get("CAIRN_LAB") == "1":
        return
    skip = pytest.mark.skip(reason="lab suite: run with make test-lab (CAIRN_LAB=1)")
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[Any]:
    """A client of the running Docker engine (the suite fails, not skips, without one)."""
    from services.agent.docker_runtime import docker_client

    client = docker_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_engine: Any) -> str:
    """The offline base image's tag (built by ``deploy/base-image.sh`` if it is missing)."""
    out = subprocess.run(
        [str(ROOT / "deploy" / "base-image.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def lab(docker_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """The compose cluster, up, with the CLI logged in as its admin; taken down after."""
    from services.agent.docker_runtime import LABEL_AGENT

    env_file = QUICKSTART.parent / ".env"
    assert not env_file.exists() or env_file_values(env_file).get("COMPOSE_PROJECT_NAME") == (
        PROJECT
    ), f"{env_file} belongs to another cluster; move it away to run the lab suite"
    secrets_dir = tmp_path_factory.mktemp("lab-secrets")
    env = {
        **{k: v for k, v in os.environ.items() if k != "CAIRN_NATS_PORT"},
        "COMPOSE_PROJECT_NAME": PROJECT,
        "CAIRN_API_PORT": os.environ.get("CAIRN_LAB_API_PORT", "18080"),
        "CAIRN_SECRETS_DIR": str(secrets_dir),
        "PYTHON": sys.executable,
    }
    try:
        subprocess.run([str(QUICKSTART), "up"], check=True, env=env, timeout=1800)
        cluster = Lab.from_env_file(env_file, home=tmp_path_factory.mktemp("cli-home"))
        cluster.cli("user", "login", "admin", f"--password={cluster.admin_password}")
        yield cluster
    finally:
        subprocess.run([str(QUICKSTART), "compose", "logs", "--tail", "200"], env=env)
        subprocess.run([str(QUICKSTART), "down"], env=env, timeout=600)
        env_file.unlink(missing_ok=True)
    project = {"label": f"com.docker.compose.project={PROJECT}"}
    left = {
        "containers": docker_engine.containers.list(all=True, filters=project),
        "trial containers": docker_engine.containers.list(all=True, filters={"label": LABEL_AGENT}),
        "networks": docker_engine.networks.list(filters=project),
        "volumes": docker_engine.volumes.list(filters=project),
    }
    assert not any(left.values()), f"left behind: {left}"
