"""The ``cairn`` CLI end to end: every verb runs as a real subprocess against one embedded cluster.

The cluster (``cairn up --slots 2``) is started once for the module on a temporary
``CAIRN_HOME``; experiments use the scripted example with a few short steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from events.domain.config.cluster import CLUSTER_CONFIG_FILE
from tests.helpers import wait_until_sync

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED = ROOT / "examples" / "scripted"
CONFIG = SCRIPTED / "config.yaml"
FAST = [
    "--config", "hyperparameters.steps=20",
    "--config", "hyperparameters.report_every=5",
    "--config", "hyperparameters.checkpoint_every=10",
    "--config", "hyperparameters.sleep=0.01",
]  # fmt: skip


@dataclass
class Env:
    """The module's cluster: its data directory, API URL and the extra checkpoint root its
    cluster config allows."""

    home: Path
    api_url: str
    shared: Path


def run_cli(
    *args: str, home: Path, extra: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m cairn.cli ARGS`` with ``CAIRN_HOME=home`` and captures its output."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CAIRN_HOME", "CAIRN_MASTER", "CAIRN_USER", "CAIRN_PASSWORD")
    }
    env.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(home), **(extra or {})})
    return subprocess.run(
        [sys.executable, "-m", "cairn.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def cluster() -> Iterator[Env]:
    """One embedded cluster with two CPU slots for the whole module.

    Its home is a fresh directory under the system temp dir rather than pytest's, whose root
    other pytest sessions reset to mode 0700 (the unprivileged PostgreSQL user must traverse it).
    """
    scratch = Path(tempfile.mkdtemp(prefix="cairn-cli-"))
    home, shared = scratch / "home", scratch / "shared"
    home.mkdir()
    (home / "cluster.yaml").write_text(f"checkpoint_storage: {{allowed_roots: [{shared}]}}\n")
    started = run_cli(
        "up", "--slots", "2", "--api-port", "0", "--stop-timeout", "3", home=home, timeout=150
    )
    try:
        assert started.returncode == 0, f"cairn up failed:\n{started.stdout}\n{started.stderr}"
        api_url = json.loads((home / "cluster.json").read_text())["api_url"]
        yield Env(home, api_url, shared)
    finally:
        stopped = run_cli("down", home=home, timeout=90)
        shutil.rmtree(scratch, ignore_errors=True)
        assert stopped.returncode == 0, stopped.stderr


@contextlib.contextmanager
def embedded_cluster(
    prefix: str, *, slots: int = 1, cluster_config: str | None = None
) -> Iterator[Env]:
    """``cairn up`` with ``slots`` CPU slots on a fresh home under the system temp dir (see
    :func:`cluster`), ``cairn down`` and the directory removed after; ``Env.shared`` is the
    scratch directory around the home. ``cluster_config``: the YAML of its ``cluster.yaml``."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    home = scratch / "home"
    home.mkdir()
    if cluster_config is not None:
        (home / CLUSTER_CONFIG_FILE).write_text(cluster_config, encoding="utf-8")
    started = run_cli(
        "up", "--slots", str(slots), "--api-port", "0", "--stop-timeout", "3", home=home,
        timeout=150,
    )  # fmt: skip
    try:
        assert started.returncode == 0, f"cairn up failed:\n{started.stdout}\n{started.stderr}"
        api_url = json.loads((home / "cluster.json").read_text())["api_url"]
        yield Env(home, api_url, scratch)
    finally:
        stopped = run_cli("down", home=home, timeout=90)
        shutil.rmtree(scratch, ignore_errors=True)
        assert stopped.returncode == 0, stopped.stderr


def admin_password(env: Env) -> str:
    """The admin password ``cairn up`` generated for the module's cluster."""
    return (env.home / "admin.password").read_text().strip()


def cli(env: Env, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Runs the CLI against the module's cluster."""
    return run_cli(*args, home=env.home, **kwargs)


def ok(env: Env, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Runs the CLI and requires exit 0."""
    done = cli(env, *args, **kwargs)
    assert done.returncode == 0, f"{args} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def as_json(env: Env, *args: str) -> Any:
    """Runs a read verb with ``--json`` and parses its one document."""
    return json.loads(ok(env, "--json", *args).stdout)


def created_id(stdout: str) -> int:
    """The id in ``created experiment N``."""
    for line in stdout.splitlines():
        if line.startswith("created experiment"):
            return int(line.split()[2].rstrip(";"))
    raise AssertionError(f"no experiment id in {stdout!r}")


@pytest.fixture(scope="module")
def finished(cluster: Env) -> dict[str, Any]:
    """A scripted experiment created with ``-f`` (exit code, output) and its describe JSON."""
    done = cli(cluster, "experiment", "create", str(CONFIG), str(SCRIPTED), *FAST, "-f")
    exp_id = created_id(done.stdout)
    exp = as_json(cluster, "experiment", "describe", str(exp_id))
    return {"done": done, "id": exp_id, "exp": exp}


def test_user_login_whoami_create_logout(cluster: Env) -> None:
    """login stores a 0600 token; whoami, create, list work; logout falls back to local admin."""
    assert cli(cluster, "user", "login", "admin", "--password", "wrong").returncode == 3
    password = admin_password(cluster)
    assert "logged in" in ok(cluster, "user", "login", "admin", "--password", password).stdout
    auth = cluster.home / "auth.json"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    assert json.loads(auth.read_text())["masters"][cluster.api_url]["username"] == "admin"
    assert "admin" in ok(cluster, "user", "whoami").stdout

    ok(cluster, "u", "create", "alice", "--password", "pw-alice")
    assert cli(cluster, "user", "create", "alice", "--password", "pw-alice2").returncode == 5
    short = cli(cluster, "user", "create", "bert", "--password", "x")
    assert short.returncode == 1 and "at least 8 characters" in short.stderr
    users = as_json(cluster, "user", "list")["users"]
    assert {"alice", "admin"} <= {u["username"] for u in users}

    ok(cluster, "user", "login", "alice", extra={"CAIRN_PASSWORD": "pw-alice"})
    assert as_json(cluster, "user", "whoami")["username"] == "alice"
    assert cli(cluster, "user", "list").returncode == 5  # alice is no admin
    assert "logged out" in ok(cluster, "user", "logout").stdout
    # No token and the local cluster: the CLI logs in as its admin by itself.
    assert as_json(cluster, "user", "whoami") == {
        "kind": "user",
        "username": "admin",
        "admin": True,
    }


def test_only_an_admin_links_a_user_to_a_unix_account(cluster: Env) -> None:
    """``user link-with-agent-user`` (admin) links a user, ``user agent-user-group`` shows it;
    the user cannot link themself (exit 5) and uid 0 is refused (exit 1, naming the field)."""
    ok(cluster, "user", "create", "dave", "--password", "pw-dave-1")
    ok(
        cluster, "user", "link-with-agent-user", "dave", "--agent-uid", "1234",
        "--agent-gid", "2345", "--agent-user", "dave", "--agent-group", "ml",
    )  # fmt: skip
    shown = as_json(cluster, "user", "agent-user-group", "dave")
    assert (shown["agent_uid"], shown["agent_gid"], shown["linked"]) == (1234, 2345, True)
    root = cli(cluster, "user", "link-with-agent-user", "dave", "--agent-uid", "0",
               "--agent-gid", "1")  # fmt: skip
    assert root.returncode == 1 and "agent_uid" in root.stderr, root.stderr
    ok(cluster, "user", "login", "dave", extra={"CAIRN_PASSWORD": "pw-dave-1"})
    try:
        mine = cli(cluster, "user", "link-with-agent-user", "dave", "--agent-uid", "1",
                   "--agent-gid", "1")  # fmt: skip
        assert mine.returncode == 5, mine.stderr
        assert "uid 1234" in ok(cluster, "user", "agent-user-group").stdout
    finally:
        ok(cluster, "user", "logout")


def test_no_token_for_a_remote_master_exits_3(cluster: Env, tmp_path: Path) -> None:
    """A master that is not the local cluster, with no stored token, asks for a login (exit 3)."""
    done = run_cli("-m", cluster.api_url, "experiment", "list", home=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "cairn user login" in done.stderr


def test_unreachable_master_exits_6(tmp_path: Path) -> None:
    """A master nobody answers on exits 6."""
    done = run_cli("-m", "http://127.0.0.1:9", "experiment", "list", home=tmp_path)
    assert done.returncode == 6, done.stderr


def test_unknown_experiment_exits_4(cluster: Env) -> None:
    """describe/wait of an experiment that does not exist exit 4."""
    assert cli(cluster, "experiment", "describe", "987654").returncode == 4
    assert cli(cluster, "e", "wait", "987654").returncode == 4


def test_bad_config_shows_the_path(cluster: Env) -> None:
    """A config the server rejects prints the offending dotted path and exits nonzero."""
    done = cli(
        cluster, "experiment", "create", str(CONFIG), str(SCRIPTED),
        "--config", "resources.slots_per_trial=lots",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "resources.slots_per_trial" in done.stderr


def test_create_follow_completes(finished: dict[str, Any]) -> None:
    """``create -f`` shows progress, prints a summary and exits 0 once COMPLETED."""
    done = finished["done"]
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "trials" in done.stderr  # plain progress lines (stderr is no terminal)
    assert "COMPLETED" in done.stdout.splitlines()[-1]
    assert finished["exp"]["state"] == "COMPLETED"
    steps = finished["exp"]["config"]["hyperparameters"]["steps"]
    assert steps in (20, {"type": "const", "val": 20})  # the --config override applied


def test_reads_with_json(cluster: Env, finished: dict[str, Any]) -> None:
    """list/describe/list-trials/list-checkpoints print parseable JSON holding the experiment."""
    exp_id = finished["id"]
    listed = wait_until_sync(
        lambda: [e for e in as_json(cluster, "e", "list")["experiments"] if e["id"] == exp_id]
    )
    assert listed and listed[0]["state"] == "COMPLETED"
    after = json.loads(ok(cluster, "experiment", "ls", "--json", "--limit", "1").stdout)
    assert len(after["experiments"]) == 1 and "pagination" in after
    assert str(exp_id) in ok(cluster, "experiment", "list").stdout

    trials = as_json(cluster, "experiment", "list-trials", str(exp_id))["trials"]
    assert [t["experiment_id"] for t in trials] == [exp_id]
    assert trials[0]["state"] == "COMPLETED"
    checkpoints = wait_until_sync(lambda: as_json(cluster, "e", "lc", str(exp_id))["checkpoints"])
    assert checkpoints and all(c["experiment_id"] == exp_id for c in checkpoints)
    best = as_json(cluster, "e", "list-checkpoints", str(exp_id), "--best", "1")["checkpoints"]
    assert len(best) == 1
    assert str(trials[0]["trial_id"]) in ok(cluster, "experiment", "describe", str(exp_id)).stdout


def test_usage_bills_the_finished_trials_allocations(
    cluster: Env, finished: dict[str, Any]
) -> None:
    """``cairn usage --by experiment`` bills the experiment exactly its allocations' slot time
    (allocation to exit, to the millisecond); ``--by user`` and ``--csv`` agree."""
    exp_id = finished["id"]
    expected = 0
    for summary in finished["exp"]["trials"]:
        trial = as_json(cluster, "trial", "describe", str(summary["trial_id"]))
        for alloc in trial["allocations"]:
            slots = sum(len(s) for s in alloc["placements"].values())
            start, end = (datetime.fromisoformat(alloc[k]) for k in ("allocated_at", "ended_at"))
            expected += slots * ((end - EPOCH) // MS - (start - EPOCH) // MS)
    assert expected > 0

    def billed() -> list[dict[str, Any]]:
        rows = as_json(cluster, "usage", "--by", "experiment")["rows"]
        return [r for r in rows if r["experiment"] == exp_id]

    rows = wait_until_sync(lambda: [r for r in billed() if r["slot_ms"] == expected])
    assert rows == [
        {
            "experiment": exp_id,
            "slot_type": "cpu",
            "slot_ms": expected,
            "slot_seconds": expected / 1000,
        }
    ]
    by_user = as_json(cluster, "usage", "--by", "user")["rows"]
    assert next(r["slot_ms"] for r in by_user if r["user"] == "admin") >= expected
    csv_lines = ok(cluster, "usage", "--by", "experiment", "--csv").stdout.splitlines()
    assert csv_lines[0] == "experiment,slot_type,slot_seconds,slot_ms"
    assert f"{exp_id},cpu,{expected // 1000}.{expected % 1000:03d},{expected}" in csv_lines
    assert "SLOT-SECONDS" in ok(cluster, "usage").stdout


def test_trial_describe_and_logs(cluster: Env, finished: dict[str, Any]) -> None:
    """trial describe shows the trial; logs (plain, --tail, -f) print its output; kill is 409;
    trial ids are plain integers (``cairn trial logs 17``), anything else is a usage error."""
    number = finished["exp"]["trials"][0]["trial_id"]
    assert type(number) is int and number > 0
    trial_id = str(number)
    trial = as_json(cluster, "trial", "describe", trial_id)
    assert trial["trial_id"] == number and trial["state"] == "COMPLETED"
    assert trial["allocations"]
    assert trial_id in ok(cluster, "t", "describe", trial_id).stdout

    wait_until_sync(lambda: "done at step 20" in ok(cluster, "trial", "logs", trial_id).stdout)
    tail = ok(cluster, "trial", "logs", trial_id, "--tail", "1").stdout.splitlines()
    assert len(tail) == 1
    followed = ok(cluster, "trial", "logs", trial_id, "-f", timeout=30).stdout
    assert "done at step 20" in followed  # the stream ends: the trial is terminal
    assert "done at step 20" in ok(cluster, "experiment", "logs", str(finished["id"])).stdout
    assert cli(cluster, "trial", "kill", trial_id).returncode == 5  # it has ended
    refused = cli(cluster, "trial", "logs", f"{finished['id']}.x")
    assert refused.returncode == 2 and "not a trial id" in refused.stderr


def test_checkpoint_describe_and_download(
    cluster: Env, finished: dict[str, Any], tmp_path: Path
) -> None:
    """checkpoint describe shows it; download unpacks the checkpoint's files."""
    checkpoints = wait_until_sync(
        lambda: as_json(cluster, "e", "lc", str(finished["id"]))["checkpoints"]
    )
    uuid = checkpoints[0]["uuid"]
    assert as_json(cluster, "checkpoint", "describe", uuid)["uuid"] == uuid
    target = tmp_path / "ckpt"
    ok(cluster, "c", "download", uuid, "-o", str(target))
    state = json.loads((target / "state.json").read_text())
    assert state["steps"] == checkpoints[0]["steps_completed"]
    assert cli(cluster, "checkpoint", "describe", "no-such-uuid").returncode == 4


SDK_DOWNLOAD = """
import sys
from cairn.experimental import client

model = client.get_model(sys.argv[1])
version = model.get_version()
print(version.model_version, version.checkpoint.download(sys.argv[2]))
"""


def test_model_registry_create_register_describe_and_download(
    cluster: Env, finished: dict[str, Any], tmp_path: Path
) -> None:
    """model create, register-version, describe, list-versions and ls; the SDK downloads the
    latest version's checkpoint; while it is registered the experiment's deletion is refused
    naming the model and version; model delete lifts that."""
    checkpoints = wait_until_sync(
        lambda: as_json(cluster, "e", "lc", str(finished["id"]))["checkpoints"]
    )
    uuid = checkpoints[0]["uuid"]
    ok(cluster, "model", "create", "cli model", "--description", "from the CLI")
    taken = cli(cluster, "model", "create", "cli model")
    assert taken.returncode != 0 and "exists already" in taken.stderr
    assert as_json(cluster, "model", "register-version", "cli model", uuid)["version"] == 1
    described = as_json(cluster, "m", "describe", "cli model", "--version", "1")
    assert described["model"]["description"] == "from the CLI"
    assert described["model_version"]["checkpoint"]["uuid"] == uuid
    listed = as_json(cluster, "model", "list-versions", "cli model")["model_versions"]
    assert [v["version"] for v in listed] == [1]
    assert "cli model" in ok(cluster, "model", "ls").stdout

    target = tmp_path / "registered"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "DET_"))}
    env.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(cluster.home)})
    sdk = subprocess.run(
        [sys.executable, "-c", SDK_DOWNLOAD, "cli model", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert sdk.returncode == 0, sdk.stderr
    assert sdk.stdout.split() == ["1", str(target)]
    state = json.loads((target / "state.json").read_text())
    assert state["steps"] == checkpoints[0]["steps_completed"]

    refused = cli(cluster, "experiment", "delete", str(finished["id"]), "--yes")
    assert refused.returncode != 0 and "model 'cli model' version 1" in refused.stderr
    ok(cluster, "model", "delete", "cli model", "--yes")
    assert cli(cluster, "model", "describe", "cli model").returncode == 4


def test_models_live_in_workspaces_and_move_between_them(cluster: Env, tmp_path: Path) -> None:
    """model create -w puts a model in a workspace; list shows its WORKSPACE and filters by
    -w; a user without a role there neither lists nor reads it (exit 5); workspace delete is
    refused while it holds the model; model move takes it out and the workspace goes."""
    ok(cluster, "workspace", "create", "registry-ws")
    created = as_json(cluster, "model", "create", "ws model", "-w", "registry-ws")
    assert created["workspace"] == "registry-ws"
    listed = ok(cluster, "model", "ls", "--workspace-names", "registry-ws").stdout
    assert "WORKSPACE" in listed and "ws model" in listed and "registry-ws" in listed
    ok(cluster, "user", "create", "dee", "--password", "pw-dee-123")
    seen = as_user(cluster, tmp_path / "dee", "dee", "pw-dee-123", "--json", "model", "ls")
    assert seen.returncode == 0 and "ws model" not in seen.stdout, seen.stderr
    read = as_user(cluster, tmp_path / "dee", "dee", "pw-dee-123", "model", "describe", "ws model")
    assert read.returncode == 5 and "view_model_registry" in read.stderr, read.stderr
    refused = cli(cluster, "workspace", "delete", "registry-ws", "--yes")
    assert refused.returncode != 0 and "'ws model'" in refused.stderr, refused.stderr
    moved = ok(cluster, "model", "move", "ws model", "--workspace-name", "Uncategorized")
    assert "is in workspace 'Uncategorized'" in moved.stdout
    ok(cluster, "workspace", "delete", "registry-ws", "--yes")
    ok(cluster, "model", "delete", "ws model", "--yes")


def test_archive_and_unarchive(cluster: Env, finished: dict[str, Any]) -> None:
    """An archived experiment leaves the default list, shows with --all, and comes back."""
    exp_id = str(finished["id"])

    def ids(*flags: str) -> set[int]:
        return {e["id"] for e in as_json(cluster, "e", "list", *flags)["experiments"]}

    ok(cluster, "experiment", "archive", exp_id)
    wait_until_sync(lambda: finished["id"] not in ids())
    assert finished["id"] in ids("--all")
    ok(cluster, "experiment", "unarchive", exp_id)
    wait_until_sync(lambda: finished["id"] in ids())


def test_agents_and_slots(cluster: Env) -> None:
    """agent list and slot list show the agent's two slots; slot disable/enable (by id or
    name) flips one; agent disable/enable succeed; agent credentials lists the agent's live
    credential, and revoking an unknown agent is not found."""
    agents = wait_until_sync(lambda: as_json(cluster, "agent", "list")["agents"])
    assert len(agents) == 1 and len(agents[0]["slots"]) == 2
    agent_id = agents[0]["agent_id"]
    assert agent_id in ok(cluster, "a", "ls").stdout
    slots = as_json(cluster, "slot", "list")["slots"]
    assert {s["agent_id"] for s in slots} == {agent_id} and len(slots) == 2
    slot_id, slot_name = slots[0]["slot_id"], slots[0]["name"]

    def enabled() -> bool:
        found = [s for s in as_json(cluster, "s", "ls")["slots"] if s["slot_id"] == slot_id]
        return bool(found[0]["enabled"])

    ok(cluster, "slot", "disable", agent_id, slot_id)
    wait_until_sync(lambda: not enabled())
    ok(cluster, "slot", "enable", agent_id, slot_name)  # a slot's name works as well
    wait_until_sync(enabled)
    ok(cluster, "agent", "disable", agent_id, "--drain")
    ok(cluster, "agent", "enable", agent_id)
    assert cli(cluster, "slot", "disable", "no-such-agent", "0").returncode == 4
    creds = as_json(cluster, "agent", "credentials")["credentials"]
    assert [c["agent_id"] for c in creds] == [agent_id] and creds[0]["revoked_at"] is None
    assert cli(cluster, "agent", "revoke", "no-such-agent").returncode == 4


def test_pause_activate_kill_wait_delete(cluster: Env) -> None:
    """pause/activate move the state; after kill, wait exits 1; delete needs --yes."""
    slow = ["--config", "hyperparameters.steps=1000", "--config", "hyperparameters.sleep=0.1"]
    done = ok(cluster, "e", "create", str(CONFIG), str(SCRIPTED), *slow, "--paused")
    exp_id = str(created_id(done.stdout))
    assert as_json(cluster, "e", "describe", exp_id)["state"] == "PAUSED"
    assert "ACTIVE" in ok(cluster, "experiment", "activate", exp_id).stdout
    assert "PAUSED" in ok(cluster, "experiment", "pause", exp_id).stdout
    assert cli(cluster, "experiment", "archive", exp_id).returncode == 5  # not terminal
    ok(cluster, "experiment", "kill", exp_id)
    waited = cli(cluster, "experiment", "wait", exp_id, "--polling-interval", "0.3", timeout=60)
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "CANCELED" in waited.stdout
    assert cli(cluster, "experiment", "delete", exp_id).returncode == 2  # no tty, no --yes
    assert "DELETING" in ok(cluster, "experiment", "delete", exp_id, "--yes").stdout


# --------------------------------------------------------------------------- changing things


def as_user(env: Env, home: Path, user: str, password: str, *args: str) -> Any:
    """Runs the CLI as ``user`` (logging in by itself from its own home) against the cluster."""
    extra = {"CAIRN_USER": user, "CAIRN_PASSWORD": password}
    return run_cli("-m", env.api_url, *args, home=home, extra=extra)


def test_config_set_and_label(cluster: Env, finished: dict[str, Any], tmp_path: Path) -> None:
    """config prints YAML; set name/description/priority/weight/max-slots and label add/remove
    change what describe, config and list show; another user may not (exit 5), bad values
    exit 2 or name the field."""
    exp_id = str(finished["id"])
    config = yaml.safe_load(ok(cluster, "experiment", "config", exp_id).stdout)
    assert config["searcher"]["name"] == "single"
    ok(cluster, "experiment", "set", "name", exp_id, "renamed-by-cli")
    ok(cluster, "e", "set", "description", exp_id, "described by the cli")
    ok(cluster, "e", "set", "priority", exp_id, "12")
    ok(cluster, "e", "set", "weight", exp_id, "2.5")
    ok(cluster, "e", "set", "max-slots", exp_id, "2")
    ok(cluster, "e", "set", "max-slots", exp_id, "none")
    ok(cluster, "experiment", "label", "add", exp_id, "keep")
    ok(cluster, "experiment", "label", "add", exp_id, "drop")
    assert "keep" in ok(cluster, "experiment", "label", "remove", exp_id, "drop").stdout
    exp = as_json(cluster, "experiment", "describe", exp_id)
    assert (exp["name"], exp["description"], exp["labels"]) == (
        "renamed-by-cli",
        "described by the cli",
        ["keep"],
    )
    assert (exp["priority"], exp["weight"], exp["max_slots"]) == (12, 2.5, None)
    shown = yaml.safe_load(ok(cluster, "e", "config", exp_id).stdout)
    assert shown["name"] == "renamed-by-cli" and shown["resources"]["priority"] == 12
    wait_until_sync(
        lambda: any(
            e["name"] == "renamed-by-cli" for e in as_json(cluster, "e", "list")["experiments"]
        )
    )
    assert cli(cluster, "e", "set", "priority", exp_id, "high").returncode == 2
    bad = cli(cluster, "e", "set", "priority", exp_id, "0")
    assert bad.returncode == 1 and "resources.priority" in bad.stderr

    ok(cluster, "user", "create", "mallory", "--password", "pw-mallory")
    other = as_user(
        cluster, tmp_path / "m", "mallory", "pw-mallory", "e", "set", "name", exp_id, "x"
    )
    assert other.returncode == 5, other.stderr


def test_experiment_and_trial_download(
    cluster: Env, finished: dict[str, Any], tmp_path: Path
) -> None:
    """experiment download --top-n unpacks the best checkpoints under -o; trial download
    --latest and --best unpack one; a trial download needs one of its flags (exit 2)."""
    exp_id, trial_id = str(finished["id"]), str(finished["exp"]["trials"][0]["trial_id"])
    wait_until_sync(lambda: as_json(cluster, "e", "lc", exp_id)["checkpoints"])
    got = as_json(cluster, "e", "download", exp_id, "--top-n", "1", "-o", str(tmp_path / "e"))
    [best] = got["checkpoints"]
    assert (tmp_path / "e" / best["uuid"] / "state.json").exists()
    latest = as_json(cluster, "trial", "download", trial_id, "--latest", "-o", str(tmp_path / "l"))
    state = json.loads((tmp_path / "l" / "state.json").read_text())
    assert state["steps"] == latest["steps_completed"] == 20
    best_one = as_json(cluster, "t", "download", trial_id, "--best", "-o", str(tmp_path / "b"))
    assert best_one["uuid"] == best["uuid"]
    assert cli(cluster, "trial", "download", trial_id).returncode == 2


def test_continue_resumes_from_the_latest_checkpoint_then_delete_it(
    cluster: Env, finished: dict[str, Any]
) -> None:
    """continue trains the ended single-trial experiment on from its step-20 checkpoint to the
    new step count and it completes again, leaving a log without findings; checkpoint delete
    then removes a checkpoint."""
    exp_id, trial_id = str(finished["id"]), str(finished["exp"]["trials"][0]["trial_id"])
    before = as_json(cluster, "trial", "describe", trial_id)["latest_checkpoint"]
    done = cli(
        cluster, "experiment", "continue", exp_id, "--config", "hyperparameters.steps=30", "-f",
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout.splitlines()[-1]
    logs = ok(cluster, "trial", "logs", trial_id).stdout
    assert f"resumed from checkpoint {before} at step 20" in logs
    assert "done at step 30" in logs
    trial = as_json(cluster, "trial", "describe", trial_id)
    assert trial["state"] == "COMPLETED" and len(trial["allocations"]) == 2
    refused = cli(cluster, "e", "continue", exp_id, "--config", "searcher.metric=x")
    assert refused.returncode == 1 and "searcher.metric" in refused.stderr
    dsn = json.loads((cluster.home / "cluster.json").read_text())["dsn"]
    checked = subprocess.run(
        [sys.executable, "-m", "events.domain.check", dsn],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr  # the log is clean

    uuid = wait_until_sync(lambda: as_json(cluster, "t", "describe", trial_id)["latest_checkpoint"])
    assert cli(cluster, "checkpoint", "delete", uuid).returncode == 2  # no tty, no --yes
    assert "deleting" in ok(cluster, "checkpoint", "delete", uuid, "--yes").stdout
    wait_until_sync(lambda: as_json(cluster, "checkpoint", "describe", uuid)["state"] == "DELETED")
    assert cli(cluster, "checkpoint", "delete", "no-such-uuid", "--yes").returncode == 4


def test_user_password_and_deactivation(cluster: Env, tmp_path: Path) -> None:
    """A user changes their own password (old one required); an admin deactivates them, after
    which they cannot log in (exit 3), and activates them again."""
    ok(cluster, "user", "create", "dora", "--password", "pw-dora1")
    home = tmp_path / "dora"
    changed = as_user(
        cluster, home, "dora", "pw-dora1", "user", "change-password",
        "--old-password", "pw-dora1", "--password", "pw-dora2",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    other = as_user(
        cluster, home, "dora", "pw-dora2", "user", "change-password", "admin", "--password", "x"
    )
    assert other.returncode == 5
    ok(cluster, "user", "deactivate", "dora")
    assert any(
        u["username"] == "dora" and not u["active"]
        for u in as_json(cluster, "user", "list")["users"]
    )
    refused = as_user(cluster, tmp_path / "fresh", "dora", "pw-dora2", "user", "whoami")
    assert refused.returncode == 3 and "deactivated" in refused.stderr
    ok(cluster, "user", "activate", "dora")
    again = as_user(cluster, tmp_path / "again", "dora", "pw-dora2", "--json", "user", "whoami")
    assert again.returncode == 0 and json.loads(again.stdout)["username"] == "dora"


def test_templates_and_create_with_template(cluster: Env, tmp_path: Path) -> None:
    """template set/list/describe/remove; create --template merges the experiment's config over
    the template's; an unknown template exits nonzero naming it."""
    file = tmp_path / "tpl.yaml"
    file.write_text("labels: [from-template]\nresources: {priority: 7}\nmax_restarts: 0\n")
    assert "created" in ok(cluster, "template", "set", "defaults", str(file)).stdout
    assert "defaults" in ok(cluster, "template", "list").stdout
    assert yaml.safe_load(ok(cluster, "template", "describe", "defaults").stdout)["resources"] == {
        "priority": 7
    }
    made = ok(
        cluster, "e", "create", str(CONFIG), str(SCRIPTED), "--template", "defaults", "--paused"
    )
    exp_id = str(created_id(made.stdout))
    config = yaml.safe_load(ok(cluster, "experiment", "config", exp_id).stdout)
    assert config["labels"] == ["from-template"] and config["resources"]["priority"] == 7
    assert config["max_restarts"] == 3  # the experiment's own value wins
    ok(cluster, "experiment", "kill", exp_id)
    missing = cli(cluster, "e", "create", str(CONFIG), str(SCRIPTED), "--template", "nope")
    assert missing.returncode == 1 and "template" in missing.stderr
    ok(cluster, "template", "remove", "defaults")
    assert cli(cluster, "template", "describe", "defaults").returncode == 4


def test_master_info_and_version(cluster: Env) -> None:
    """master info shows the version, cluster id and uptime; version shows client and master."""
    info = as_json(cluster, "master", "info")
    assert info["version"] and info["cluster_id"] and info["uptime_seconds"] >= 0
    assert "cluster id" in ok(cluster, "master", "info").stdout
    versions = as_json(cluster, "version")
    assert versions["client"]["version"] == versions["master"]["version"]
    assert cli(cluster, "-m", "http://127.0.0.1:9", "version").returncode == 6


def test_the_data_dirs_cluster_config_governs_storage_and_tokens(
    cluster: Env, tmp_path: Path
) -> None:
    """``cairn up`` hands ``DIR/cluster.yaml`` to the services: storage under the root it
    allows is accepted and ``/etc`` refused naming the field; ``cairn token list`` shows the
    CLI's token with its expiry and ``cairn token revoke`` ends a token."""

    def create(host_path: str) -> subprocess.CompletedProcess[str]:
        config = yaml.safe_load(CONFIG.read_text())
        config["checkpoint_storage"] = {"type": "shared_fs", "host_path": host_path}
        path = tmp_path / f"storage-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(config))
        return cli(cluster, "experiment", "create", str(path), str(SCRIPTED), "--paused")

    refused = create("/etc")
    assert refused.returncode == 1, refused.stderr
    assert "checkpoint_storage.host_path: /etc is outside the allowed roots" in refused.stderr
    assert str(cluster.shared) in refused.stderr
    accepted = create(str(cluster.shared / "ckpt"))
    assert accepted.returncode == 0, accepted.stderr
    ok(cluster, "experiment", "cancel", str(created_id(accepted.stdout)))

    for _ in range(2):  # two sessions of admin's: the first stays valid, the second is in use
        ok(cluster, "user", "login", "admin", "--password", admin_password(cluster))
    tokens = as_json(cluster, "token", "list")["tokens"]
    assert len(tokens) >= 2 and all(t["expires_at"] for t in tokens)
    assert [t["current"] for t in tokens].count(True) == 1
    other = next(t["id"] for t in tokens if not t["current"])
    assert f"revoked token {other} of admin" in ok(cluster, "token", "revoke", str(other)).stdout
    assert other not in {t["id"] for t in as_json(cluster, "token", "list")["tokens"]}


def test_teams_workspaces_groups_and_roles(
    cluster: Env, finished: dict[str, Any], tmp_path: Path
) -> None:
    """Two workspaces with a project each, users in two groups: a group's Viewer role on one
    workspace lets its members see an experiment moved there (the other group's member is
    refused, exit 5), my-permissions and workspace ls show it, and the experiment moves back."""
    for name in ("vision", "speech"):
        ok(cluster, "workspace", "create", name)
    ok(cluster, "project", "create", "vision", "detection", "--description", "boxes")
    ok(cluster, "p", "create", "speech", "asr")
    for name in ("ana", "cy"):
        ok(cluster, "user", "create", name, "--password", f"pw-{name}-123")
    ok(cluster, "user-group", "create", "seers", "--add-user", "ana")
    ok(cluster, "user-group", "create", "talkers")
    ok(cluster, "user-group", "add-user", "talkers", "cy")
    granted = ok(cluster, "rbac", "assign-role", "Viewer", "-g", "seers", "-w", "vision")
    assert "granted" in granted.stdout
    exp_id = str(finished["id"])
    assert "moved" in ok(cluster, "e", "move", exp_id, "vision", "detection").stdout
    listed = wait_until_sync(  # the list reads the projection, which follows the move
        lambda: as_json(cluster, "project", "list-experiments", "vision", "detection")[
            "experiments"
        ]
    )
    assert [e["id"] for e in listed] == [finished["id"]]

    ana = as_user(cluster, tmp_path / "ana", "ana", "pw-ana-123", "--json", "e", "describe", exp_id)
    assert ana.returncode == 0, ana.stderr
    cy = as_user(cluster, tmp_path / "cy", "cy", "pw-cy-123", "e", "describe", exp_id)
    assert cy.returncode == 5 and "lacks permission view_experiment" in cy.stderr, cy.stderr
    mine = as_user(
        cluster, tmp_path / "ana", "ana", "pw-ana-123", "--json", "rbac", "my-permissions"
    )
    assert "view_experiment" in json.loads(mine.stdout)["workspaces"]["vision"]
    seen = as_user(cluster, tmp_path / "ana", "ana", "pw-ana-123", "--json", "workspace", "ls")
    assert [w["name"] for w in json.loads(seen.stdout)["workspaces"]] == [
        "Uncategorized",
        "vision",
    ]
    ok(cluster, "e", "move", exp_id, "Uncategorized", "Uncategorized")
    ok(cluster, "rbac", "unassign-role", "Viewer", "-g", "seers", "-w", "vision")
    again = as_user(cluster, tmp_path / "ana", "ana", "pw-ana-123", "e", "describe", exp_id)
    assert again.returncode == 5


SDK_WORKSPACES = """
import json
import sys
import time
from cairn.experimental import client

exp_id = int(sys.argv[1])
ws = client.create_workspace("sdk-ws")
project = ws.create_project("sdk-project", "from the SDK")
exp = client.get_experiment(exp_id)
exp.move_to_project("sdk-ws", "sdk-project")
assert exp.project_id == project.id and exp.workspace_id == ws.id, (exp.project_id, project)
deadline = time.monotonic() + 60
while True:  # lists read the tracker's projection, which follows the move a moment later
    found = client.get_workspace("sdk-ws").get_project("sdk-project")
    listed = [e.id for e in found.list_experiments()]
    by_filter = [e.id for e in client.list_experiments(project_id=project.id)]
    if (listed and by_filter) or time.monotonic() > deadline:
        break
    time.sleep(0.2)
exp.move_to_project("Uncategorized", "Uncategorized")
ws.delete_project("sdk-project")
client.delete_workspace("sdk-ws")
names = [w.name for w in client.list_workspaces()]
print(json.dumps([listed, by_filter, names]))
"""


def test_sdk_workspaces_projects_and_moves(cluster: Env, finished: dict[str, Any]) -> None:
    """The SDK creates a workspace and a project, moves an experiment there (its project and
    workspace ids follow), lists it by project, moves it back and deletes both."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "DET_"))}
    env.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(cluster.home)})
    sdk = subprocess.run(
        [sys.executable, "-c", SDK_WORKSPACES, str(finished["id"])],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert sdk.returncode == 0, sdk.stderr
    listed, by_filter, names = json.loads(sdk.stdout)
    assert listed == by_filter == [finished["id"]]
    assert "sdk-ws" not in names and "Uncategorized" in names
