"""A task's ``work_dir`` and ``bind_mounts``: what the config accepts, what the deciders refuse,
where the agent starts the task (process and container), and the ``config`` templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cairn.cli.command import CONFIG_TEMPLATE as COMMAND_TEMPLATE
from cairn.cli.notebook import CONFIG_TEMPLATE as NOTEBOOK_TEMPLATE
from cairn.cli.shell import CONFIG_TEMPLATE as SHELL_TEMPLATE
from cairn.cli.tensorboard import CONFIG_TEMPLATE as TENSORBOARD_TEMPLATE
from events.domain.aggregates import fold_task
from events.domain.config import load_yaml
from events.domain.config.host_requests import host_request_errors
from events.domain.config.limits import MAX_PATH_CHARS
from events.domain.config.task import MAX_TASK_BIND_MOUNTS, TaskConfig
from events.domain.deciders import Refusal
from events.domain.deciders.task import (
    RunCommand,
    StartNotebook,
    StartShell,
    StartTensorboard,
    decide_run_command,
    decide_start_notebook,
    decide_start_shell,
    decide_start_tensorboard,
)
from events.domain.names import task_stream
from events.domain.types import TaskRequested
from events.domain.types.task import TensorboardSource
from services.agent.docker_runtime import plan_containers
from services.agent.runtime import RunSpec, start_directory, trial_environment
from services.agent.serving import notebook_argv, shell_argv
from tests.agent_specs import spec_answer
from tests.unit.test_planner import Log

TASK = "0123456789abcdef"
CODE = "sha256:" + "0" * 64


def refusal(config: dict[str, Any], *, code_ref: str | None = CODE) -> Refusal:
    """The refusal of a command with ``config`` (the test fails if it is accepted)."""
    decided = decide_run_command(
        fold_task(TASK, []), RunCommand(TASK, "alice", ("pwd",), config, code_ref)
    )
    assert isinstance(decided, Refusal), decided
    return decided


@pytest.mark.parametrize(
    ("work_dir", "says"),
    [
        ("/etc", "must be a path inside the task's context directory"),
        ("../escape", "must not contain a '..' component"),
        ("sub/../../escape", "must not contain a '..' component"),
        ("sub/..", "must not contain a '..' component"),
        ("sub\x00/x", "must not contain a NUL character"),
        ("sub\nx", "must not contain a control character"),
        ("x" * (MAX_PATH_CHARS + 1), f"must be at most {MAX_PATH_CHARS} characters"),
        ("", "must name a directory of the context"),
        ("  ", "must name a directory of the context"),
    ],
)
def test_a_work_dir_outside_the_context_or_malformed_is_refused_naming_work_dir(
    work_dir: str, says: str
) -> None:
    """An absolute path, a ``..`` escape, a NUL or control character, an oversized or an empty
    ``work_dir`` is refused at ``config.work_dir`` saying what was wrong."""
    refused = refusal({"work_dir": work_dir})
    assert refused.field == "config.work_dir"
    assert refused.message.startswith("config.work_dir: ") and says in refused.message


def test_a_work_dir_of_the_wrong_type_is_refused_naming_work_dir() -> None:
    """A number or a list is no directory name."""
    assert refusal({"work_dir": 3}).field == "config.work_dir"
    assert refusal({"work_dir": ["a"]}).field == "config.work_dir"


def test_a_relative_work_dir_is_recorded_as_written() -> None:
    """``sub``, ``./sub/deeper`` and a name with dots in it are directories of the context."""
    for work_dir in ("sub", "./sub/deeper", "v1..2", ".hidden"):
        decided = decide_run_command(
            fold_task(TASK, []), RunCommand(TASK, "alice", ("pwd",), {"work_dir": work_dir}, CODE)
        )
        assert not isinstance(decided, Refusal), (work_dir, decided)
        (requested,) = decided
        assert isinstance(requested, TaskRequested)
        assert requested.config["work_dir"] == work_dir
        log = Log()
        log.add(task_stream(TASK), requested)
        assert fold_task(TASK, log.events).config.work_dir == work_dir


def test_a_work_dir_without_a_context_is_refused_for_every_kind_that_takes_one() -> None:
    """A command, a notebook or a shell with a ``work_dir`` but no context has nowhere to start:
    a refusal at ``config.work_dir`` that says to give a context."""
    empty, config = fold_task(TASK, []), {"work_dir": "sub"}
    for decided in (
        decide_run_command(empty, RunCommand(TASK, "alice", ("pwd",), config)),
        decide_start_notebook(empty, StartNotebook(TASK, "alice", config)),
        decide_start_shell(empty, StartShell(TASK, "alice", config)),
    ):
        assert isinstance(decided, Refusal), decided
        assert decided.field == "config.work_dir" and "--context" in decided.message


def test_a_tensorboard_refuses_a_work_dir_and_takes_bind_mounts() -> None:
    """A TensorBoard has no context, so a ``work_dir`` is refused; its bind mounts are recorded
    as anyone's."""
    sources = (TensorboardSource(experiment_id=1, trial_ids=None, storage=None),)
    empty = fold_task(TASK, [])
    refused = decide_start_tensorboard(
        empty, StartTensorboard(TASK, "alice", sources, {"work_dir": "sub"})
    )
    assert isinstance(refused, Refusal) and refused.field == "config.work_dir"
    mounts = [{"host_path": "/datasets/a", "container_path": "/a"}]
    accepted = decide_start_tensorboard(
        empty, StartTensorboard(TASK, "alice", sources, {"bind_mounts": mounts})
    )
    assert not isinstance(accepted, Refusal)
    assert accepted[0].config["bind_mounts"][0]["host_path"] == "/datasets/a"


@pytest.mark.parametrize(
    ("mount", "field", "says"),
    [
        ({"host_path": "data", "container_path": "/d"}, "host_path", "absolute path"),
        ({"host_path": "/d\x00x", "container_path": "/d"}, "host_path", "NUL"),
        ({"host_path": "/" + "x" * MAX_PATH_CHARS, "container_path": "/d"}, "host_path", "at most"),
        ({"host_path": "/d", "container_path": "/d\x00x"}, "container_path", "NUL"),
        ({"host_path": "/d", "container_path": ""}, "container_path", "at least 1"),
        ({"host_path": "/d"}, "container_path", "Field required"),
        ({"host_path": "/d", "container_path": "/d", "mode": "rw"}, "mode", "Extra inputs"),
        ({"host_path": "/d", "container_path": "/d", "read_only": "yes"}, "read_only", "bool"),
    ],
)
def test_a_malformed_bind_mount_is_refused_naming_its_index_and_field(
    mount: dict[str, Any], field: str, says: str
) -> None:
    """The experiment's bind mount rules hold for a task: absolute host paths, no NUL, no
    oversized path, no unknown key, no string for a boolean; the path names the item."""
    refused = refusal({"bind_mounts": [{"host_path": "/ok", "container_path": "/ok"}, mount]})
    assert refused.field == f"config.bind_mounts[1].{field}", refused
    assert says in refused.message


def test_too_many_bind_mounts_are_refused() -> None:
    """More than :data:`MAX_TASK_BIND_MOUNTS` mounts is a refusal at ``config.bind_mounts``."""
    mounts = [
        {"host_path": f"/d/{i}", "container_path": f"/m/{i}"}
        for i in range(MAX_TASK_BIND_MOUNTS + 1)
    ]
    assert refusal({"bind_mounts": mounts}).field == "config.bind_mounts"


def test_the_clusters_host_policy_judges_a_task_config_as_an_experiments() -> None:
    """The one rule of host paths applies to a task's recorded config: under an allowed root
    passes, ``/``, a ``..`` escape and a directory holding the Docker socket do not."""

    class Policy:
        allowed_bind_mount_roots = ("/datasets", "/var")
        allowed_devices = ()
        allowed_capabilities = ()

    def config(*paths: str) -> dict[str, Any]:
        mounts = [{"host_path": p, "container_path": "/m"} for p in paths]
        return TaskConfig.model_validate({"bind_mounts": mounts}).model_dump(mode="json")

    assert host_request_errors(config("/datasets/imagenet"), Policy()) == []
    errors = host_request_errors(config("/", "/datasets/../etc", "/var/run"), Policy())
    assert [p for p, _ in errors] == [f"bind_mounts[{i}].host_path" for i in range(3)]
    assert "container engine's socket" in errors[2][1]


def test_start_directory_is_the_context_or_a_directory_inside_it(tmp_path: Path) -> None:
    """No ``work_dir`` starts in the context; ``sub`` and a link to a directory inside the
    context start there (as a path under the context, the one a container sees too)."""
    work = tmp_path / "alloc"
    (work / "sub" / "deeper").mkdir(parents=True)
    (work / "inner").symlink_to(work / "sub")
    assert start_directory(work, None) == work
    assert start_directory(work, "sub") == work / "sub"
    assert start_directory(work, "./sub/deeper") == work / "sub" / "deeper"
    assert start_directory(work, "inner/deeper") == work / "sub" / "deeper"


def test_start_directory_refuses_what_is_missing_a_file_or_a_link_out(tmp_path: Path) -> None:
    """A missing directory, a file, a link leading out of the context (an absolute one and a
    ``..`` one), and a loop of links are errors naming ``work_dir`` and its value."""
    work = tmp_path / "alloc"
    work.mkdir()
    (tmp_path / "outside").mkdir()
    (work / "notes.txt").write_text("x")
    (work / "out").symlink_to(tmp_path / "outside")
    (work / "up").symlink_to("..")
    (work / "loop").symlink_to("loop")
    for work_dir, says in (
        ("missing", "is not a directory of the task's context"),
        ("notes.txt", "is not a directory of the task's context"),
        ("out", "leads outside the task's context directory"),
        ("up/outside", "leads outside the task's context directory"),
        ("/etc", "leads outside the task's context directory"),
        ("loop", "work_dir: 'loop'"),
    ):
        with pytest.raises(ValueError, match="work_dir: ") as raised:
            start_directory(work, work_dir)
        assert says in str(raised.value) and repr(work_dir) in str(raised.value)


def test_a_notebook_opens_at_its_work_dir_rooted_at_its_context() -> None:
    """JupyterLab's root stays the context; its file browser opens at the ``work_dir``; without
    one nothing is added."""
    work = Path("/agent/allocations/t.1")
    argv = notebook_argv(TASK, address="10.0.0.2", port=8888, work=work, start=work / "a" / "b")
    assert f"--ServerApp.root_dir={work}" in argv
    assert "--ContentsManager.preferred_dir=a/b" in argv
    plain = notebook_argv(TASK, address="10.0.0.2", port=8888, work=work, start=work)
    assert not [a for a in plain if "preferred_dir" in a]
    shell = shell_argv(TASK, address="10.0.0.2", port=8888, work=work / "a")
    assert f"--work={work / 'a'}" in shell


def test_a_task_container_starts_in_its_work_dir_and_mounts_its_bind_mounts() -> None:
    """A task run in a container has the ``work_dir`` as its working directory, the context
    mounted at the agent's path, and its bind mounts as an experiment's would be."""
    config = TaskConfig.model_validate(
        {
            "work_dir": "sub",
            "bind_mounts": [
                {"host_path": "/datasets", "container_path": "/data", "read_only": True}
            ],
        }
    ).model_dump(mode="json")
    raw = spec_answer(
        allocation_id=f"task-{TASK}.1",
        trial_id=0,
        experiment_id=0,
        entrypoint=["pwd"],
        slot_ids=["a1-cpu0"],
        config=config,
        task_id=TASK,
        task_kind="command",
    )
    run = RunSpec.from_api(raw, "a1", Path("/var/lib/cairn/checkpoints"))
    envs = trial_environment(run, agent_id="a1", api_url="http://x", gpu_slots={}, base={})
    work = Path("/var/lib/agent/allocations/task-x.1")
    (plan,) = plan_containers(
        run, "img:1", envs, agent_id="a1", work=work, gpu_slots={}, start=work / "sub"
    )
    assert plan.working_dir == str(work / "sub")
    assert plan.volumes[str(work)] == {"bind": str(work), "mode": "rw"}
    assert plan.volumes["/datasets"] == {"bind": "/data", "mode": "ro"}


@pytest.mark.parametrize(
    ("template", "kind"),
    [
        (COMMAND_TEMPLATE, "command"),
        (NOTEBOOK_TEMPLATE, "notebook"),
        (SHELL_TEMPLATE, "shell"),
        (TENSORBOARD_TEMPLATE, "tensorboard"),
    ],
)
def test_each_config_template_shows_both_fields_and_is_a_valid_config(
    template: str, kind: str
) -> None:
    """``cairn <kind> config`` prints ``bind_mounts`` and ``work_dir`` (a TensorBoard's says it
    has none), and the template validates as it is."""
    assert "bind_mounts:" in template and "work_dir" in template
    config = TaskConfig.model_validate(load_yaml(template, source=kind))
    assert config.bind_mounts == [] and config.work_dir is None


def test_a_stored_config_without_the_new_fields_folds_with_their_defaults() -> None:
    """A TaskRequested recorded before ``bind_mounts`` and ``work_dir`` existed still folds."""
    old = {"description": "", "resources": {"slots": 1}, "idle_timeout": None}
    config = TaskConfig.model_validate(old)
    assert (config.bind_mounts, config.work_dir) == ([], None)
    with pytest.raises(ValidationError):
        TaskConfig.model_validate({**old, "work_dir": "/abs"})
