"""``import determined`` in a trial's environment and by opt-in: the names map onto cairn's own
objects, a real ``determined`` is never shadowed, and the launchers run as Determined's do
(``wrap_rank`` prefixes every line with its rank; ``deepspeed`` starts DeepSpeed's launcher)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn.compat import install_path, python_path_with_shim, real_determined_spec
from cairn.launch import deepspeed, wrap_rank
from cairn.launch._gang import Gang
from services.agent.runtime import RunSpec, trial_environment
from tests.agent_specs import spec_answer

ROOT = Path(__file__).resolve().parents[2]
SHIM = str(install_path())


def python(
    code: str, cwd: Path, python_path: list[str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Runs ``python -c code`` off-cluster with exactly ``python_path`` on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "DET_"))}
    env["PYTHONPATH"] = os.pathsep.join(python_path)
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def fake_determined(root: Path) -> Path:
    """A directory holding a stand-in for the real ``determined`` package."""
    package = root / "real" / "determined"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("REAL = True\n")
    (package / "core.py").write_text("WHERE = 'real'\n")
    return package.parent


def test_import_determined_gives_cairns_own_objects(tmp_path: Path) -> None:
    """With the shim on the path, ``determined``'s public names are cairn's objects (no second
    implementation) and ``determined.experimental.core_v2`` is ``cairn.experimental.core_v2``."""
    code = """
import json, determined as det, cairn, cairn.core, cairn.experimental.core_v2 as v2
from determined.experimental import core_v2, client
from determined.core import PreemptMode, DistributedContext
import determined.launch.wrap_rank, determined.launch.torch_distributed
import determined.launch.horovod, determined.launch.deepspeed
import cairn.experimental.client as sdk
print(json.dumps({
  "core": det.core is cairn.core,
  "names": [det.get_cluster_info is cairn.core.get_cluster_info, det.InvalidHP is cairn.core.InvalidHP,
            det.ClusterInfo is cairn.core.ClusterInfo, det.TrialInfo is cairn.core.TrialInfo,
            det.LOG_FORMAT == cairn.LOG_FORMAT, PreemptMode is cairn.core.PreemptMode],
  "core_v2": core_v2 is v2, "client": client is sdk,
  "info": det.get_cluster_info(), "version": det.__version__,
}))
"""
    done = python(code, tmp_path, [str(ROOT), SHIM])
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["core"] and all(seen["names"]) and seen["core_v2"] and seen["client"]
    assert seen["info"] is None and seen["version"]


def test_a_real_determined_wins_wherever_it_is_on_the_path(tmp_path: Path) -> None:
    """A real ``determined`` after the shim on the path is loaded in the shim's place; the
    agent's path and ``enable()`` leave the shim off when one is importable; the opt-in command
    refuses (exit 1)."""
    real = str(fake_determined(tmp_path))
    done = python(
        "import determined, determined.core as c; print(determined.REAL, c.WHERE)",
        tmp_path,
        [str(ROOT), SHIM, real],
    )
    assert (done.returncode, done.stdout.split()) == (0, ["True", "real"]), done.stderr
    assert python_path_with_shim([real]) == [real]
    assert python_path_with_shim(["/elsewhere"]) == ["/elsewhere", SHIM]
    assert real_determined_spec([SHIM]) is None
    enabled = python("import cairn.compat as c; print(c.enable())", tmp_path, [str(ROOT), real])
    assert enabled.stdout.strip() == "False", enabled.stderr
    opt_in = python(
        "import sys; from cairn.compat.determined import main; sys.exit(main(sys.argv[1:]))",
        tmp_path,
        [str(ROOT), real],
        "--install-path",
    )
    assert (opt_in.returncode, opt_in.stdout) == (1, ""), opt_in.stderr


def spec(entrypoint: str, environment: dict[str, str] | None = None) -> RunSpec:
    raw = {
        "allocation_id": "9.1",
        "trial_id": 9,
        "entrypoint": entrypoint,
        "slot_ids": ["0"],
        "environment_variables": environment or {},
    }
    return RunSpec.from_api(spec_answer(**raw), "agent-a", Path("/tmp/ckpt"))


def test_the_agent_puts_the_shim_last_on_a_trials_path_only_without_a_real_one(
    tmp_path: Path,
) -> None:
    """A trial's PYTHONPATH ends with the shim (the user's entries and cairn's come first); a
    config whose environment puts a real ``determined`` on the path gets no shim; no cluster
    credential enters the environment for it."""
    (env,) = trial_environment(
        spec("python3 train.py", {"PYTHONPATH": "/opt/lib"}),
        agent_id="agent-a",
        api_url="http://x",
        gpu_slots={},
        base={},
    )
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries[-1] == SHIM and "/opt/lib" in entries[:-1]
    real = str(fake_determined(tmp_path))
    (env,) = trial_environment(
        spec("python3 train.py", {"PYTHONPATH": real}),
        agent_id="agent-a",
        api_url="http://x",
        gpu_slots={},
        base={},
    )
    assert SHIM not in env["PYTHONPATH"].split(os.pathsep)
    assert {k for k in env if k.startswith("DET_")} == set()


def test_a_determined_script_runs_outside_the_cluster_after_the_documented_opt_in(
    tmp_path: Path,
) -> None:
    """``PYTHONPATH=$(python -m cairn.compat.determined --install-path)`` lets an unchanged
    Determined Core API script run off-cluster (locally, checkpoints in ./checkpoints)."""
    printed = python(
        "import sys; from cairn.compat.determined import main; sys.exit(main(sys.argv[1:]))",
        tmp_path,
        [str(ROOT)],
        "--install-path",
    )
    assert printed.returncode == 0 and printed.stdout.strip() == SHIM
    script = (
        "import determined as det\n"
        "with det.core.init() as core_context:\n"
        "    core_context.train.report_training_metrics(steps_completed=1, metrics={'x': 1})\n"
        "    with core_context.checkpoint.store_path({'steps_completed': 1}) as (path, uuid):\n"
        "        (path / 'x').write_text('1')\n"
        "    print(core_context.checkpoint.root)\n"
    )
    done = python(script, tmp_path, [str(ROOT), printed.stdout.strip()])
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path / "checkpoints"
    assert len(list((tmp_path / "checkpoints").glob("*/x"))) == 1


def test_wrap_rank_reads_its_rank_and_command() -> None:
    """RANK is an integer or the first set of a list of variables; ``--`` and
    ``--no-redirect-stdio`` are Determined's spellings; a missing rank or command is an error."""
    env = {"OMPI_COMM_WORLD_RANK": "3"}
    assert wrap_rank.parse(["2", "--", "python3", "x.py"], env) == (2, ["python3", "x.py"])
    assert wrap_rank.parse(["RANK,OMPI_COMM_WORLD_RANK", "cmd"], env) == (3, ["cmd"])
    assert wrap_rank.parse(["--no-redirect-stdio", "0", "cmd"], env) == (0, ["cmd"])
    for bad in (["RANK", "cmd"], ["0", "--"], []):
        with pytest.raises(wrap_rank.WrapRankError):
            wrap_rank.parse(bad, {})


def test_wrap_rank_splits_lines_at_newlines_and_carriage_returns() -> None:
    """``\\n``, ``\\r`` and ``\\r\\n`` each end a line, even across chunks; long lines are cut."""
    chunks = [b"a\r", b"\nb\rc", b"\n", b"xxxxx", b"yy"]
    assert list(wrap_rank.lines(iter(chunks), limit=4)) == [
        b"a",
        b"b",
        b"c",
        b"xxxx",
        b"xyy",
    ]


def test_wrap_rank_prefixes_every_line_of_a_trial_process(tmp_path: Path) -> None:
    """``python3 -m determined.launch.wrap_rank 1 -- CMD`` with a trial's PYTHONPATH prefixes
    each line of both streams with ``[rank=1] `` and exits with the command's status."""
    (env,) = trial_environment(
        spec("python3 train.py"), agent_id="agent-a", api_url="http://x", gpu_slots={}, base={}
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}, **env}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "determined.launch.wrap_rank",
            "1",
            "--",
            sys.executable,
            "-c",
            "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "[rank=1] out\n", "[rank=1] err\n")


def test_deepspeed_launcher_runs_deepspeed_over_this_agents_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DeepSpeed launcher runs ``deepspeed`` with one process per local slot, each worker
    wrapped by wrap_rank; without DeepSpeed installed it exits 2 and says so."""
    gang = Gang(
        nnodes=1,
        node_rank=0,
        nproc_per_node=2,
        world_size=2,
        rank_offset=0,
        master_addr="127.0.0.1",
        master_port=29500,
    )
    argv = deepspeed.deepspeed_argv(gang, ["--bind_cores_to_rank"], ["train.py", "--lr", "1"])
    assert argv[1:11] == [
        "--num_nodes",
        "1",
        "--num_gpus",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        "29500",
        "--no_python",
        "--no_local_rank",
    ]
    assert argv[11:] == [
        "--bind_cores_to_rank",
        sys.executable,
        "-m",
        "cairn.launch.wrap_rank",
        "RANK",
        "--",
        sys.executable,
        "train.py",
        "--lr",
        "1",
    ]
    monkeypatch.setattr(deepspeed, "deepspeed_runner", lambda: None)
    assert deepspeed.main(["python3", "train.py"]) == 2
