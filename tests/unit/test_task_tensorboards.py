"""TensorBoard tasks: the request's decider and fold, the sync of trials' files into a real local
directory, and the token check in front of TensorBoard's WSGI app."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cairn.core._tensorboard import encode_event, tfrecord
from cairn.tasks.tensorboard_server import TokenGate
from cairn.tasks.tensorboard_sources import (
    TensorboardSourceFile,
    read_sources,
    source_of,
    write_sources,
)
from cairn.tasks.tensorboard_sync import TensorboardSync
from events.domain.aggregates import fold_task
from events.domain.deciders import Refusal
from events.domain.deciders.task import (
    MAX_TENSORBOARD_EXPERIMENTS,
    StartTensorboard,
    decide_start_tensorboard,
)
from events.domain.names import task_stream
from events.domain.types import TaskRequested
from events.domain.types.task import TensorboardSource
from tests.unit.test_planner import Log

TASK = "0123456789abcdef"


def start(*sources: TensorboardSource, **config: Any) -> list[Any] | Refusal:
    command = StartTensorboard(task_id=TASK, owner="alice", sources=sources, config=config)
    return decide_start_tensorboard(fold_task(TASK, []), command)


def test_a_tensorboard_holds_no_slot_unless_asked_and_names_what_it_shows() -> None:
    """The request records the sources, no slot by default (one when the config asks), and a
    description naming the experiments and trials; the fold keeps the sources."""
    events = start(
        TensorboardSource(experiment_id=3),
        TensorboardSource(experiment_id=4, trial_ids=[17, 18]),
        resources={"priority": 10},
    )
    assert not isinstance(events, Refusal)
    (requested,) = events
    assert isinstance(requested, TaskRequested) and requested.kind == "tensorboard"
    assert requested.config["resources"] == {"slots": 0, "priority": 10, "resource_pool": ""}
    assert requested.description == "TensorBoard: experiment 3; trials 17, 18"
    log = Log()
    log.add(task_stream(TASK), requested)
    view = fold_task(TASK, [e for e in log.events if e.stream_id == task_stream(TASK)])
    assert [s.experiment_id for s in view.tensorboard_sources] == [3, 4]
    assert view.tensorboard_sources[1].trial_ids == [17, 18]

    one = start(TensorboardSource(experiment_id=3), resources={"slots": 1})
    assert not isinstance(one, Refusal) and one[0].config["resources"]["slots"] == 1


@pytest.mark.parametrize(
    ("sources", "config", "field"),
    [
        ((), {}, "experiment_ids"),
        (
            tuple(
                TensorboardSource(experiment_id=i)
                for i in range(1, MAX_TENSORBOARD_EXPERIMENTS + 2)
            ),
            {},
            "experiment_ids",
        ),
        ((TensorboardSource(experiment_id=3, trial_ids=list(range(1, 1002))),), {}, "trial_ids"),
        (
            (TensorboardSource(experiment_id=3), TensorboardSource(experiment_id=3)),
            {},
            "experiment_ids",
        ),
        ((TensorboardSource(experiment_id=3),), {"idle_timeout": "5m"}, "config.idle_timeout"),
        (
            (TensorboardSource(experiment_id=3),),
            {"resources": {"slots": -1}},
            "config.resources.slots",
        ),
    ],
)
def test_a_bad_tensorboard_request_is_refused_naming_the_field(
    sources: tuple[TensorboardSource, ...], config: dict[str, Any], field: str
) -> None:
    """No source, too many experiments or trials, one named twice, an idle timeout or a bad
    config is refused with the field at fault."""
    refusal = start(*sources, **config)
    assert isinstance(refusal, Refusal) and refusal.reason == "invalid"
    assert refusal.field == field, refusal


def record(path: Path, step: int, tag: str = "training/loss", value: float = 1.0) -> None:
    """Appends one scalar event to ``path`` (creating it), as a trial's upload grows it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        out.write(tfrecord(encode_event(1.0, step, scalars={tag: value})))


def test_sync_copies_new_files_appends_grown_ones_and_keeps_to_the_named_trials(
    tmp_path: Path,
) -> None:
    """From a real storage directory: each trial's files land under ``trial_<id>``; a grown
    file gets only its new bytes appended to the same local file (TensorBoard keeps reading
    it), a new one appears whole; an unnamed trial, an upload in progress and a symbolic link
    out of the storage are not copied."""
    root = tmp_path / "ckpt"
    source = source_of(5, None, {"type": "shared_fs", "host_path": str(root)}, tmp_path / "x")
    assert source.directory == str(root / "tensorboard" / "experiment" / "5")
    trials = Path(source.directory) / "trial"
    record(trials / "11" / "events.out.tfevents.1.a", 1)
    record(trials / "12" / "sub" / "events.out.tfevents.1.b", 1)
    (trials / "11" / ".events.out.tfevents.2.a.77.partial").write_bytes(b"half")
    secret = tmp_path / "secret"
    secret.write_text("not a trial's")
    os.symlink(secret, trials / "11" / "events.out.tfevents.9.link")
    logdir = tmp_path / "work" / "logdir"

    sync = TensorboardSync([source], logdir)
    first = sync.sync()
    assert sorted(p.relative_to(logdir).as_posix() for p in first.created) == [
        "trial_11/events.out.tfevents.1.a",
        "trial_12/sub/events.out.tfevents.1.b",
    ]
    assert not first.failed
    local = logdir / "trial_11" / "events.out.tfevents.1.a"
    inode = local.stat().st_ino
    assert sync.sync().created == []  # nothing changed

    record(trials / "11" / "events.out.tfevents.1.a", 2)
    record(trials / "11" / "events.out.tfevents.3.a", 1, tag="late")
    second = sync.sync()
    assert second.appended == [local]
    assert second.created == [logdir / "trial_11" / "events.out.tfevents.3.a"]
    assert local.read_bytes() == (trials / "11" / "events.out.tfevents.1.a").read_bytes()
    assert local.stat().st_ino == inode  # appended to, never replaced
    assert sorted(p.name for p in logdir.rglob("*") if p.is_file()) == [
        "events.out.tfevents.1.a",
        "events.out.tfevents.1.b",
        "events.out.tfevents.3.a",
    ]

    only = TensorboardSync(
        [TensorboardSourceFile(experiment_id=5, trial_ids=[12], directory=source.directory)],
        tmp_path / "only",
    )
    only.sync()
    assert [p.parent.parent.name for p in (tmp_path / "only").rglob("events.*")] == ["trial_12"]


def test_a_source_that_cannot_be_read_is_reported_and_the_others_still_sync(
    tmp_path: Path,
) -> None:
    """A bucket nobody answers for fails its source only, saying where (retried next time);
    the other source's files are copied."""
    good = tmp_path / "good"
    record(good / "trial" / "1" / "events.out.tfevents.1.a", 1)
    unreachable = {"type": "s3", "bucket": "gone", "endpoint_url": "http://127.0.0.1:9",
                   "access_key": "a", "secret_key": "never-shown-42"}  # fmt: skip
    sources = [
        source_of(1, None, unreachable, tmp_path),
        TensorboardSourceFile(experiment_id=2, directory=str(good)),
    ]
    report = TensorboardSync(sources, tmp_path / "logdir").sync()
    assert len(report.failed) == 1
    assert "experiment 1 (s3://gone/tensorboard/experiment/1/trial)" in report.failed[0]
    assert "never-shown-42" not in report.failed[0]
    assert (tmp_path / "logdir" / "trial_1" / "events.out.tfevents.1.a").is_file()


def test_the_sources_file_is_private_and_round_trips(tmp_path: Path) -> None:
    """The agent's sources file is mode 0600 and reads back as written."""
    sources = [source_of(7, [1], {"type": "s3", "bucket": "b", "secret_key": "k"}, tmp_path)]
    path = write_sources(tmp_path, sources)
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_sources(path).sources == sources


def test_the_token_gate_lets_only_the_proxys_token_through() -> None:
    """Without the token, with a wrong one, or with a bearer header the app behind is never
    called (403); with ``Authorization: token <t>`` it answers."""
    calls: list[str] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        calls.append(environ["PATH_INFO"])
        start_response("200 OK", [])
        return [b"scalars"]

    gate = TokenGate(app, "s3cret")
    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        statuses.append(status)

    for header in (None, "token wrong", "Bearer s3cret", "token s3cret "):
        environ = {"PATH_INFO": "/data"} | ({"HTTP_AUTHORIZATION": header} if header else {})
        gate(environ, start_response)
    assert statuses == ["403 Forbidden"] * 4 and calls == []
    assert gate({"PATH_INFO": "/data", "HTTP_AUTHORIZATION": "token s3cret"}, start_response) == [
        b"scalars"
    ]
    assert calls == ["/data"]
    with pytest.raises(ValueError):
        TokenGate(app, "")
