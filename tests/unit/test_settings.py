"""``events.settings`` is the one reader of cairn's environment variables: typed, read at call
time, malformed values named, ``CAIRN_HOME`` interpreted once, and ``docs/configuration.md``
generated from it."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import auth
from cairn.core._info import get_cluster_info
from cairn.launch._gang import Gang, LaunchError
from cairn.local.layout import default_data_dir
from events import settings
from events.domain.config.storage import default_checkpoint_root
from events.log import faults, lease
from services import credentials
from services.searcher.sandbox import SandboxSettings

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("events", "services", "cairn")
SETTINGS_MODULE = ROOT / "events" / "settings.py"
NOT_VARIABLES = {"CAIRN_EVENTS", "CAIRN_COMMANDS"}
"""``CAIRN_*`` strings that name JetStream streams, not environment variables."""
_ENV_RECEIVER = re.compile(r"(^|\.)(environ|env)(\(\))?$")
_VARIABLE = re.compile(r"^(CAIRN|DET)_[A-Z0-9_]+$")


def production_files() -> list[Path]:
    """Every Python file of the production packages except the settings module."""
    return sorted(
        path
        for package in PRODUCTION
        for path in (ROOT / package).rglob("*.py")
        if path != SETTINGS_MODULE
    )


def _names_variable(node: ast.expr) -> bool:
    """Whether ``node`` is a ``CAIRN_*``/``DET_*`` name, or a name built from such a literal."""
    return any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith(("CAIRN_", "DET_"))
        for n in ast.walk(node)
    )  # fmt: skip


def environment_reads(source: str) -> list[str]:
    """The reads of a ``CAIRN_*``/``DET_*`` variable from an environment in ``source``:
    ``os.environ.get``/``[...]``/``.pop``, ``os.getenv``, the same on a variable called
    ``env``/``environ`` or on ``proc.environ()``, an alias called ``env``, and a helper called
    with a variable's name and the environment."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        key: ast.expr | None = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "getenv"):
                receiver = ast.unparse(func.value)
                if func.attr == "getenv" or _ENV_RECEIVER.search(receiver):
                    key = node.args[0]
            elif isinstance(func, ast.Name) and func.id in ("getenv", "env", "environ"):
                key = node.args[0]  # os.getenv, or an alias such as ``env = os.environ.get``
            elif any(isinstance(a, ast.Name) and a.id in ("env", "environ") for a in node.args):
                key = node.args[0]  # a helper handed the environment: ``_int("CAIRN_X", 0, env)``
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _ENV_RECEIVER.search(ast.unparse(node.value))
        ):
            key = node.slice
        if key is not None and _names_variable(key):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_finds_every_form_of_an_environment_read() -> None:
    """The source scan below is not vacuous: it flags each way a module could read a variable."""
    source = "\n".join(
        [
            'os.environ.get("CAIRN_A")',
            'os.environ["CAIRN_B"]',
            'os.getenv("CAIRN_C", "1")',
            'env.get("DET_MASTER")',
            'proc.environ().get("CAIRN_ALLOCATION_ID")',
            'os.environ.get(name + "_FILE") or os.environ.get("CAIRN_" + name)',
            'env("CAIRN_AGENT_ID")',
            '_int("CAIRN_TRIAL_ID", 0, env)',
            'env["CAIRN_WRITTEN"] = "1"',
            'bus.pop("CAIRN_NATS")',
        ]
    )
    assert len(environment_reads(source)) == 8


def test_no_production_module_but_settings_reads_a_cairn_variable() -> None:
    """Every ``CAIRN_*`` (and ``DET_*``) read in events/, services/ and cairn/ goes through
    ``events.settings``."""
    offenders = {
        str(path.relative_to(ROOT)): reads
        for path in production_files()
        if (reads := environment_reads(path.read_text()))
    }
    assert offenders == {}, (
        "read these through a Setting of events/settings.py (declare it there if it is new): "
        f"{json.dumps(offenders, indent=2)}"
    )


def test_every_cairn_variable_named_in_production_code_is_declared() -> None:
    """A ``CAIRN_*`` string written or passed anywhere (a trial's environment, a child's) names a
    declared setting, so the table in docs/configuration.md is complete."""
    declared = {s.name for s in settings.SETTINGS}
    named: dict[str, str] = {}
    for path in production_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if _VARIABLE.match(node.value) and node.value.startswith("CAIRN_"):
                    named.setdefault(node.value, str(path.relative_to(ROOT)))
            elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("CAIRN_"):
                named.setdefault(node.arg, str(path.relative_to(ROOT)))
    missing = {n: where for n, where in named.items() if n not in declared | NOT_VARIABLES}
    assert missing == {}, f"declare these in events/settings.py: {missing}"


def test_docs_configuration_table_is_the_generated_one() -> None:
    """docs/configuration.md shows exactly what ``python -m events.settings --markdown`` prints."""
    document = (ROOT / "docs" / "configuration.md").read_text()
    assert document == settings.with_table(document), (
        "docs/configuration.md is stale: run "
        "`.venv/bin/python -m events.settings --write docs/configuration.md`"
    )


def test_the_command_prints_the_table_and_rewrites_a_document(tmp_path: Path) -> None:
    """``--markdown`` prints the table; ``--write`` replaces only what is between the markers."""
    printed = subprocess.run(
        [sys.executable, "-m", "events.settings", "--markdown"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert printed == settings.markdown_table() + "\n"
    doc = tmp_path / "c.md"
    doc.write_text(f"# intro\n{settings.BEGIN_MARKER}\nold\n{settings.END_MARKER}\nafter\n")
    assert settings.main(["--write", str(doc)]) == 0
    assert doc.read_text() == (
        f"# intro\n{settings.BEGIN_MARKER}\n{settings.markdown_table()}\n"
        f"{settings.END_MARKER}\nafter\n"
    )
    (tmp_path / "bare.md").write_text("no markers\n")
    assert settings.main(["--write", str(tmp_path / "bare.md")]) == 1


def test_every_setting_is_documented_and_every_file_setting_is_marked_secret() -> None:
    """Each setting names its readers and meaning; each ``*_FILE`` one is a secret file whose
    value form, when declared, is a secret."""
    for s in settings.SETTINGS:
        assert s.read_by and s.description and s.type_name, s.name
        if s.name.endswith("_FILE") and s.name != "CAIRN_READY_FILE":
            assert s.secret_file, s.name
            twin = s.name.removesuffix("_FILE")
            if any(t.name == twin for t in settings.SETTINGS):
                assert settings.by_name(twin).secret, twin


@pytest.mark.parametrize(
    ("setting", "value", "complaint"),
    [
        (settings.API_PORT, "eighty", "not an integer"),
        (settings.API_PORT, "70000", "not a port number"),
        (settings.LEASE_TIMEOUT, "-1", "not a positive number"),
        (settings.RENDEZVOUS_TIMEOUT, "soon", "not a number of seconds"),
        (settings.CUSTOM_SEARCHER_TIMEOUT, "0", "not a positive number"),
        (settings.HPARAMS, "[1, 2]", "not a JSON object"),
        (settings.EXPERIMENT_CONFIG, "{oops", "not valid JSON"),
        (settings.SLOT_IDS, '"gpu0"', "not a JSON list"),
        (settings.CONTAINER_SLOT_COUNTS, '["a"]', "invalid literal"),
        (settings.FAULTS, "relay.after_publish=soon", "not NAME=SECONDS"),
        (settings.LOG_LEVEL, "chatty", "not a log level"),
        (settings.TRIAL_ID, "7.1", "not an integer"),
    ],
)
def test_a_malformed_value_is_an_error_naming_the_variable_and_the_value(
    setting: settings.Setting[object], value: str, complaint: str
) -> None:
    """A value its type refuses raises SettingError with the variable, the value and why."""
    with pytest.raises(settings.SettingError) as caught:
        setting.get({setting.name: value})
    message = str(caught.value)
    assert f"{setting.name}={value!r}" in message
    assert complaint in message


def test_typed_values_defaults_and_empty_values() -> None:
    """A set variable is parsed to its type; unset or empty gives the default; a password may
    be empty; a default list is a fresh copy each time."""
    assert settings.API_PORT.get({"CAIRN_API_PORT": " 9090 "}) == 9090
    assert settings.API_PORT.get({}) == 8080
    assert settings.API_PORT.get({"CAIRN_API_PORT": ""}) == 8080
    assert settings.LOG_LEVEL.get({"CAIRN_LOG_LEVEL": "debug"}) == "DEBUG"
    assert settings.CHECKPOINT_ROOT.get({"CAIRN_CHECKPOINT_ROOT": "/x"}) == Path("/x")
    assert settings.FAULTS.get({"CAIRN_FAULTS": "a=1.5, b"}) == {"a": 1.5, "b": 0.0}
    assert settings.PASSWORD.get({"CAIRN_PASSWORD": ""}) == ""
    assert settings.USER.get({"CAIRN_USER": ""}) is None
    settings.SLOT_IDS.get({}).append("mine")
    assert settings.SLOT_IDS.get({}) == []


def test_variables_are_read_when_asked_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable set after every module was imported is honoured: fault points, the lease
    timeout and the searcher's sandbox timeout read the environment when they run."""
    monkeypatch.setenv("CAIRN_FAULTS", "settings.test=0")
    monkeypatch.setenv("CAIRN_LEASE_TIMEOUT", "4.5")
    monkeypatch.setenv("CAIRN_CUSTOM_SEARCHER_TIMEOUT", "2")
    assert settings.FAULTS.get() == {"settings.test": 0.0}
    asyncio.run(faults.point("settings.test"))
    assert lease.lease_timeout() == 4.5
    assert SandboxSettings.from_env().call_timeout == 2.0
    monkeypatch.setenv("CAIRN_LEASE_TIMEOUT", "nope")
    with pytest.raises(settings.SettingError, match="CAIRN_LEASE_TIMEOUT"):
        lease.lease_timeout()


def test_importing_every_production_module_reads_no_cairn_variable() -> None:
    """No module of events/, services/ or cairn/ reads a CAIRN_* variable while it is imported."""
    probe = """
import importlib, os, pkgutil
reads, current = [], [""]
class Watching(type(os.environ)):
    def __getitem__(self, key):
        if str(key).startswith(("CAIRN_", "DET_")):
            reads.append((key, current[0]))
        return super().__getitem__(key)
os.environ.__class__ = Watching
for package in ("events", "services", "cairn"):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if info.name.endswith("__main__") or ".compat.pythonpath" in info.name:
            continue
        current[0] = info.name
        importlib.import_module(info.name)
print(reads)
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_cairn_home_is_interpreted_once_and_every_reader_agrees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``CAIRN_HOME=~/x`` the data directory, the token file and the default checkpoint
    root all sit under the same expanded, absolute directory."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CAIRN_HOME", "~/x")
    monkeypatch.delenv("CAIRN_CHECKPOINT_ROOT", raising=False)
    home = (tmp_path / "x").resolve()
    assert settings.cairn_home() == home
    assert default_data_dir() == home
    assert auth.auth_path() == home / "auth.json"
    assert default_checkpoint_root() == home / "checkpoints"


def test_without_cairn_home_tokens_and_checkpoints_go_to_the_user_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unset, ``CAIRN_HOME`` leaves the data directory at ./.cairn (README) and the per-user
    files under ~/.cairn (docs/tracking.md), as before."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CAIRN_HOME", raising=False)
    monkeypatch.delenv("CAIRN_CHECKPOINT_ROOT", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert settings.cairn_home() is None
    assert default_data_dir() == work.resolve() / ".cairn"
    assert auth.auth_path() == tmp_path / "home" / ".cairn" / "auth.json"
    assert default_checkpoint_root() == tmp_path / "home" / ".cairn" / "checkpoints"


def test_a_trial_variable_that_is_malformed_is_named() -> None:
    """The Core API and the launcher name the variable a trial's agent set wrongly."""
    env = {"CAIRN_MASTER": "http://m", "CAIRN_TRIAL_ID": "3", "CAIRN_ALLOCATION_ID": "3.1"}
    assert get_cluster_info({**env, "CAIRN_HPARAMS": '{"lr": 0.1}'}).trial.hparams == {"lr": 0.1}  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="CAIRN_HPARAMS='\\[1\\]'"):
        get_cluster_info({**env, "CAIRN_HPARAMS": "[1]"})
    with pytest.raises(LaunchError, match="CAIRN_NUM_NODES='two'"):
        Gang.from_env({"CAIRN_NUM_NODES": "two"})


def test_secrets_are_read_from_the_file_a_file_variable_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``credentials.secret`` finds ``CAIRN_DB_FILE`` through the settings and prefers it over
    ``CAIRN_DB``; an undeclared secret name is refused."""
    secret_file = tmp_path / "db"
    secret_file.write_text("postgresql://from-file\n")
    monkeypatch.setenv("CAIRN_DB", "postgresql://from-env")
    monkeypatch.setenv("CAIRN_DB_FILE", str(secret_file))
    assert credentials.secret("CAIRN_DB") == "postgresql://from-file"
    monkeypatch.delenv("CAIRN_DB_FILE")
    assert credentials.secret("CAIRN_DB") == "postgresql://from-env"
    with pytest.raises(KeyError, match="CAIRN_NOT_A_SETTING"):
        credentials.secret("CAIRN_NOT_A_SETTING")
