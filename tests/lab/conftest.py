"""The lab suite (``make test-lab``): a real Docker engine, images built offline, the compose
cluster. Skipped unless ``CAIRN_LAB=1`` (``make test`` never runs it)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
