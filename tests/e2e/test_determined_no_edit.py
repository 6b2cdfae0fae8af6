"""A Determined user changes nothing: on one embedded cluster (``cairn up --slots 4``), the Core
API tutorial's five stages (``examples/determined_tutorial``, ``import determined as det``) run
to COMPLETED, a list of ``det`` command lines from Determined's docs runs with ``det`` replaced by
``cairn``, and a Determined SDK program drives an experiment; the CLI and the SDK find the master
and log in through ``DET_MASTER``, ``DET_USER`` and ``DET_PASS`` alone."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cairn.auth import session
from cairn.cli import main as cairn_main
from cairn.compat import install_path
from cairn.experimental import client
from cairn.local.service_credentials import admin_password
from tests.helpers import ROOT

TUTORIAL = ROOT / "examples" / "determined_tutorial"
STAGES = ("0_start", "1_metrics", "2_checkpoints", "3_hpsearch", "4_distributed")
CAIRN_VARIABLES = ("CAIRN_HOME", "CAIRN_MASTER", "CAIRN_USER", "CAIRN_PASSWORD")


@dataclass
class Env:
    """The module's cluster and the Determined-style environment that reaches it."""

    home: Path
    api_url: str
    user_home: Path
    env: dict[str, str]


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    """``python -m cairn.cli ARGS`` in ``env``."""
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
    """One embedded cluster with four CPU slots; then, for the module, this process's
    environment as a Determined user's shell has it: ``DET_MASTER``, ``DET_USER``, ``DET_PASS``,
    no ``CAIRN_*`` variable, and a ``CAIRN_HOME`` of its own (no record of the cluster in it)."""
    scratch = Path(tempfile.mkdtemp(prefix="cairn-det-"))
    home = scratch / "home"
    base = {k: v for k, v in os.environ.items() if k not in CAIRN_VARIABLES}
    base.update({"PYTHONPATH": str(ROOT), "CAIRN_HOME": str(home)})
    started = run_cli("up", "--slots", "4", "--api-port", "0", "--stop-timeout", "3", env=base)
    try:
        assert started.returncode == 0, f"cairn up failed:\n{started.stdout}\n{started.stderr}"
        api_url = json.loads((home / "cluster.json").read_text())["api_url"]
        user_home = scratch / "user"
        det_env = {k: v for k, v in base.items() if k != "CAIRN_HOME"}
        password = admin_password(home)
        assert password, "cairn up generated the admin password"
        det_env.update(
            CAIRN_HOME=str(user_home), DET_MASTER=api_url, DET_USER="admin", DET_PASS=password
        )
        with pytest.MonkeyPatch.context() as patch:
            for name in CAIRN_VARIABLES:
                patch.delenv(name, raising=False)
            for name in ("CAIRN_HOME", "DET_MASTER", "DET_USER", "DET_PASS"):
                patch.setenv(name, det_env[name])
            patch.setattr(client, "_determined", None)
            yield Env(home, api_url, user_home, det_env)
    finally:
        stopped = run_cli("down", env=base, timeout=90)
        shutil.rmtree(scratch, ignore_errors=True)
        assert stopped.returncode == 0, stopped.stderr


def det(command: str) -> tuple[int, str, str]:
    """Runs a ``det ...`` command line as ``cairn ...`` in this process; (code, out, err)."""
    words = shlex.split(command)
    assert words[0] == "det", command
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cairn_main(words[1:])
        except SystemExit as exc:  # argparse's usage errors, --version
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def created(stdout: str) -> int:
    """The id in ``created experiment N``."""
    for line in stdout.splitlines():
        if line.startswith("created experiment"):
            return int(line.split()[2].rstrip(";"))
    raise AssertionError(f"no experiment id in {stdout!r}")


@pytest.fixture(scope="module")
def tutorial(cluster: Env) -> dict[str, client.Experiment]:
    """The five stages, each submitted with ``det e create STAGE.yaml DIR``, waited for with the
    SDK; by stage."""
    ids = {}
    for stage in STAGES:
        code, out, err = det(f"det e create {TUTORIAL / stage}.yaml {TUTORIAL}")
        assert code == 0, f"{stage}: {err}"
        ids[stage] = created(out)
    exps = {stage: client.get_experiment(exp_id) for stage, exp_id in ids.items()}
    for stage, exp in exps.items():
        state = exp.wait(interval=0.3)
        if state != client.ExperimentState.COMPLETED:
            logs = "".join(line for t in exp.list_trials() for line in t.logs())
            raise AssertionError(f"{stage} (experiment {exp.id}) ended {state.value}:\n{logs}")
    return exps


@pytest.mark.timeout(300)
def test_tutorial_stages_run_unedited_to_completed(tutorial: dict[str, client.Experiment]) -> None:
    """Each stage's script imports only determined and runs to COMPLETED showing its stage's
    fact: logs, metrics, checkpoints, an adaptive search that stops trials early, two ranks."""
    for stage in STAGES:
        text = (TUTORIAL / f"{stage}.py").read_text()
        assert "import determined as det" in text and "cairn" not in text, stage
        assert "cairn" not in (TUTORIAL / f"{stage}.yaml").read_text(), stage

    (trial,) = tutorial["0_start"].list_trials()
    assert "batch 100: x=100" in "".join(trial.logs())

    (trial,) = tutorial["1_metrics"].list_trials()
    training = [(m.steps_completed, m.metrics["x"]) for m in trial.iter_metrics("training")]
    assert training == [(s, s) for s in range(10, 101, 10)]
    assert [m.metrics for m in trial.iter_metrics("validation")] == [{"x": 100}]

    (trial,) = tutorial["2_checkpoints"].list_trials()
    every = session().get_trial(trial.id)["checkpoints"]  # the garbage-collected ones too
    assert sorted(c["steps_completed"] for c in every) == list(range(10, 101, 10))
    assert [c.steps_completed for c in trial.list_checkpoints()] == [100]  # the one kept

    search = tutorial["3_hpsearch"].list_trials()
    assert len(search) == 6 and len({t.hparams["increment_by"] for t in search}) > 1
    for t in search:  # each validated every tenth batch until the search had seen enough
        steps = [m.steps_completed for m in t.iter_metrics("validation")]
        assert steps == list(range(10, steps[-1] + 1, 10)), steps
    best = tutorial["3_hpsearch"].top_checkpoint()
    assert best.validation["batches"] == 100  # the best trial trained to the end

    (trial,) = tutorial["4_distributed"].list_trials()
    lines = "".join(trial.logs())
    assert "worker 0 of 2 starting" in lines and "worker 1 of 2 starting" in lines
    final = [m.metrics["x"] for m in trial.iter_metrics("validation")][-1]
    assert final == 100 * 2 * trial.hparams["increment_by"]


@pytest.mark.timeout(300)
def test_det_command_lines_run_with_det_replaced_by_cairn(
    cluster: Env, tutorial: dict[str, client.Experiment], tmp_path: Path
) -> None:
    """Command lines as Determined's docs write them (abbreviations, ``det``'s flags and
    positionals) parse and work against the cluster, found through DET_MASTER/DET_USER/DET_PASS."""
    exp = tutorial["2_checkpoints"].id
    (trial,) = tutorial["2_checkpoints"].list_trials()
    uuid = trial.top_checkpoint().uuid
    (dist_trial,) = tutorial["4_distributed"].list_trials()
    search = tutorial["3_hpsearch"].id
    template = tmp_path / "template.yaml"
    template.write_text("max_restarts: 0\n")
    lines = [
        "det --version",
        "det version",
        "det master info",
        "det e",
        "det e list",
        "det experiment list --all",
        "det e ls -a --csv",
        f"det e describe {exp} --json",
        f"det e describe {exp},{search}",
        f"det experiment describe {search} --metrics",
        f"det e config {exp}",
        f"det e list-trials {search}",
        f"det e lt {search} --csv",
        f"det e list-checkpoints {exp} --best 1",
        f"det e lc {exp} --csv",
        f"det e logs {exp} --tail 3",
        f"det e label add {exp} tutorial",
        f"det e label remove {exp} tutorial",
        f"det e set description {exp} 'stage two'",
        f"det e set name {exp} core-api-stage-2-renamed",
        f"det e set priority {exp} 10",
        f"det e set weight {exp} 2",
        f"det e set max-slots {exp} 4",
        f"det e download {exp} --top-n 1 -o {tmp_path / 'exp-best'}",
        f"det e download {search} --top-n 2 --sort-by x --smaller-is-better false -q "
        f"-o {tmp_path / 'search-best'}",
        f"det e archive {exp}",
        f"det e unarchive {exp}",
        f"det e wait {exp} --polling-interval 1",
        f"det t describe {trial.id}",
        f"det trial describe {trial.id} --metrics --json",
        f"det t describe {trial.id} --metrics-summary --csv",
        f"det t logs {trial.id}",
        f"det trial logs {trial.id} -f --tail 2",
        f"det t logs {trial.id} --head 2",
        f"det t logs {dist_trial.id} --rank-id 1 --level INFO",
        f"det t logs {trial.id} --stdtype stderr --timestamp-after 2000-01-01T00:00:00Z",
        f"det t download {trial.id} --best -o {tmp_path / 'trial-best'}",
        f"det trial download {trial.id} --latest -q -o {tmp_path / 'trial-latest'}",
        f"det t download {trial.id} --uuid {uuid} -o {tmp_path / 'trial-uuid'}",
        f"det c describe {uuid}",
        f"det checkpoint download {uuid} -o {tmp_path / 'ckpt'} --mode master",
        "det a",
        "det agent list",
        "det a ls --csv",
        "det slot list",
        "det s ls --json",
        "det u",
        "det user whoami",
        "det u ls",
        "det -u admin e list",
        f"det -m {cluster.api_url} e list",
        f"det tpl create det-tpl {template}",
        "det template list -d",
        "det tpl describe det-tpl",
        f"det template set-value config det-tpl {template}",
        "det template rm det-tpl",
        f"det preview-search {TUTORIAL / '3_hpsearch.yaml'}",
        f"det e create {TUTORIAL / '0_start.yaml'} {TUTORIAL} --paused",
        f"det e create {TUTORIAL / '0_start.yaml'} {TUTORIAL} -f",
    ]
    failures = []
    outputs = {}
    for line in lines:
        code, out, err = det(line)
        outputs[line] = out
        if code != 0:
            failures.append(f"{line} -> {code}\n{out}\n{err}")
    assert not failures, "\n\n".join(failures)

    assert outputs["det --version"].strip().startswith("cairn ")
    assert json.loads(outputs[f"det e describe {exp} --json"])["id"] == exp
    assert outputs[f"det e lc {exp} --csv"].startswith("UUID,TRIAL,STEPS,STATE,METRIC,REPORTED\n")
    assert (tmp_path / "trial-latest" / "state.json").exists()
    assert json.loads((tmp_path / "ckpt" / "state.json").read_text())["batches"] == 100
    assert len([p for p in (tmp_path / "search-best").iterdir()]) == 2
    rank_lines = outputs[f"det t logs {dist_trial.id} --rank-id 1 --level INFO"].splitlines()
    assert rank_lines and any("worker 1 of 2" in line for line in rank_lines)
    paused = created(outputs[f"det e create {TUTORIAL / '0_start.yaml'} {TUTORIAL} --paused"])
    for line in (f"det e activate {paused}", f"det e kill {paused}"):
        code, _, err = det(line)
        assert code == 0, f"{line}: {err}"
    assert client.get_experiment(paused).wait(interval=0.3) == client.ExperimentState.CANCELED


@pytest.mark.timeout(300)
def test_determined_sdk_program_drives_an_experiment(cluster: Env, tmp_path: Path) -> None:
    """A Determined SDK program (``from determined.experimental import client``), run from a
    plain shell with the documented opt-in and DET_* variables, creates an experiment, waits for
    it, downloads its best checkpoint and reads its training and validation metrics."""
    env = dict(cluster.env, PYTHONPATH=os.pathsep.join([str(ROOT), str(install_path())]))
    done = subprocess.run(
        [sys.executable, str(TUTORIAL / "drive_sdk.py"), str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["state"] == "COMPLETED"
    assert summary["checkpoint_steps"] == 100 and summary["checkpoint_trial"] == summary["trial_id"]
    assert summary["state_json"]["batches"] == 100
    assert {"metadata.json", "state.json"} <= set(summary["files"])
    assert summary["training"] == [[s, s] for s in range(10, 101, 10)]
    assert summary["validation"] == [[100, 100]]
