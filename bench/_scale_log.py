"""A synthetic year of a busy lab's log, for ``python -m bench scale``.

The log is shaped as cairn writes it (see the golden histories under ``tests/fixtures/golden``):
agents register and workspaces and projects are made first; then experiments arrive through the
year, :data:`CONCURRENT` at a time, each with :data:`TRIALS_PER_EXPERIMENT` trials whose streams
interleave (allocation, start, training reports every 100 steps, a validation every 500, a
checkpoint every 1000, exit, release, final state), audited API requests, and now and then a
task. Every payload comes from the real event models: each shape is built once as a model and
dumped to JSON, and events of that shape are the dump with their ids and values replaced. The
trials' requests (ids, hyperparameters, seeds) are those the real search method decides for the
experiment's config. ``recorded_at`` is spread evenly over the year in position order.

:func:`generate` yields the rows in chunks ready for ``COPY`` into ``events``.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import zip_longest
from typing import Any

from bench.event_store import INSERT_COLUMNS
from events.domain.config import parse_config
from events.domain.names import agent_stream, experiment_stream, task_stream, trial_stream
from events.domain.search import Create, make_method
from events.domain.types import (
    AgentRegistered,
    CheckpointSaved,
    ExperimentStateChanged,
    ExperimentSubmitted,
    LeaderElected,
    ProjectCreated,
    RequestAccepted,
    RequestRejected,
    SlotsAllocated,
    SlotsReleased,
    TaskAllocated,
    TaskExited,
    TaskRequested,
    TaskStarted,
    TrialExited,
    TrialRequested,
    TrialStarted,
    TrialStateChanged,
    ValidationReported,
    WorkloadCompleted,
    WorkspaceCreated,
)
from events.domain.types.audit import AUDIT_STREAM
from events.domain.types.teams import TEAMS_STREAM
from events.log.envelope import Event

COLUMNS = (*INSERT_COLUMNS, "recorded_at")
"""The ``events`` columns the rows fill (``position`` is the table's own, in COPY order)."""

TRIALS_PER_EXPERIMENT = 10
CONCURRENT = 20
"""Experiments running at once; their streams interleave in the log."""
AGENTS = 125
SLOTS_PER_AGENT = 8
TASK_SLOTS = 100
"""The last slots of the cluster, kept for tasks so that they never meet a trial's slot."""
WORKSPACES = 5
PROJECTS_PER_WORKSPACE = 4
USERS = 50
TASK_EVERY = 5
"""One experiment in this many comes with a task (a command evaluating it)."""
FAIL_EVERY = 10
"""One trial in this many fails (exit code 1, state ERROR)."""
CONFIG_SHAPES = 4
"""Distinct experiment configs (each a different search seed)."""
MEAN_EVENTS_PER_EXPERIMENT = 475
"""About how many events one experiment brings (its streams, its trials', its audit, tasks)."""
YEAR = timedelta(days=365)

Row = tuple[uuid.UUID, str, int, str, int, str, str, datetime]
Item = tuple[str, str, int, str, str]
"""(stream_id, type, schema_version, payload JSON, metadata JSON) before stamping."""


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class Template:
    """One event shape: the model's type, version and JSON dump, filled per event."""

    type: str
    version: int
    fields: dict[str, Any]

    @classmethod
    def of(cls, event: Event) -> Template:
        """The shape of ``event`` (built once with the real model)."""
        return cls(event.event_type, event.schema_version, event.model_dump(mode="json"))

    def fill(self, stream_id: str, meta: str, **values: Any) -> Item:
        """An item of this shape on ``stream_id`` with ``values`` over the template's."""
        return (stream_id, self.type, self.version, _dumps({**self.fields, **values}), meta)


def _config(shape: int, trials: int) -> dict[str, Any]:
    """An experiment config as the gateway stores it (validated, defaults filled in)."""
    raw = {
        "name": "resnet-sweep",
        "description": "a sweep of the lab's model",
        "entrypoint": "python3 train.py",
        "hyperparameters": {
            "lr": {"type": "log", "base": 10, "minval": -5, "maxval": -1},
            "batch_size": {"type": "categorical", "vals": [32, 64, 128]},
            "layers": {"type": "int", "minval": 2, "maxval": 8},
            "dropout": {"type": "double", "minval": 0.0, "maxval": 0.5},
        },
        "searcher": {
            "name": "random",
            "metric": "validation_loss",
            "smaller_is_better": True,
            "max_trials": trials,
            "max_concurrent_trials": trials,
        },
        "resources": {"slots_per_trial": 1},
        "checkpoint_storage": {"type": "shared_fs", "host_path": "/lab/checkpoints"},
        "reproducibility": {"experiment_seed": 1000 + shape},
        "max_restarts": 0,
    }
    return parse_config(raw).model_dump(mode="json")


def _requests(config: dict[str, Any]) -> list[Create]:
    """The trials the real search method asks for first, for this config."""
    method = make_method(parse_config(config))
    return [op for op in method.initial_operations() if isinstance(op, Create)]


@dataclass
class Shapes:
    """The templates, built once from the real models."""

    configs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[list[Create]] = field(default_factory=list)
    submitted: Template | None = None

    def __post_init__(self) -> None:
        self.configs = [_config(s, TRIALS_PER_EXPERIMENT) for s in range(CONFIG_SHAPES)]
        self.requests = [_requests(c) for c in self.configs]
        self.submitted = Template.of(ExperimentSubmitted(experiment_id=1, config={}))
        self.requested = Template.of(
            TrialRequested(
                experiment_id=1, trial_id=1, seq=1, request_id="r", hparams={}, trial_seed=0
            )
        )
        self.exp_state = Template.of(
            ExperimentStateChanged(experiment_id=1, state="COMPLETED", reason="", actor="")
        )
        self.allocated = Template.of(
            SlotsAllocated(trial_id=1, allocation_id="1.1", placements={}, run_id=1)
        )
        self.started = Template.of(
            TrialStarted(
                trial_id=1, allocation_id="1.1", run_id=1, agent_id="a", agent_incarnation="x"
            )
        )
        self.workload = Template.of(
            WorkloadCompleted(trial_id=1, run_id=1, steps_completed=1, metrics={})
        )
        self.validation = Template.of(
            ValidationReported(trial_id=1, run_id=1, steps_completed=1, metrics={})
        )
        self.checkpoint = Template.of(
            CheckpointSaved(
                trial_id=1,
                run_id=1,
                uuid="u",
                steps_completed=1,
                resources={"model.pt": 94_371_840, "optimizer.pt": 188_743_680},
                metadata={},
            )
        )
        self.exited = Template.of(
            TrialExited(trial_id=1, run_id=1, allocation_id="1.1", outcome="completed", exit_code=0)
        )
        self.released = Template.of(SlotsReleased(trial_id=1, allocation_id="1.1", placements={}))
        self.trial_state = Template.of(TrialStateChanged(trial_id=1, state="COMPLETED"))
        self.accepted = Template.of(
            RequestAccepted(method="PATCH", route="", path="", status=200, experiment_id=None)
        )
        self.rejected = Template.of(
            RequestRejected(
                method="POST", route="", path="", status=403, message="", experiment_id=None
            )
        )
        self.task_requested = Template.of(
            TaskRequested(
                task_id="0" * 16,
                kind="command",
                owner="u",
                config={
                    "description": "evaluate",
                    "resources": {"slots": 1, "priority": 42, "resource_pool": ""},
                    "environment": {"environment_variables": []},
                },
                argv=["python3", "evaluate.py"],
                description="evaluate",
                workspace_id=1,
            )
        )
        self.task_allocated = Template.of(
            TaskAllocated(task_id="0" * 16, allocation_id="a", placements={})
        )
        self.task_started = Template.of(
            TaskStarted(task_id="0" * 16, allocation_id="a", agent_id="a")
        )
        self.task_exited = Template.of(
            TaskExited(task_id="0" * 16, allocation_id="a", outcome="completed", exit_code=0)
        )


@dataclass(frozen=True)
class Plan:
    """How big the log is: experiments (each with its trials) for about ``events`` events."""

    events: int
    experiments: int

    @classmethod
    def for_events(cls, events: int) -> Plan:
        """The plan of a log of about ``events`` events."""
        return cls(events, max(1, events // MEAN_EVENTS_PER_EXPERIMENT))

    @property
    def trials(self) -> int:
        """Trials in the log."""
        return self.experiments * TRIALS_PER_EXPERIMENT


def _meta(**values: Any) -> str:
    return _dumps({k: v for k, v in values.items() if v is not None})


class Generator:
    """Builds the log's events in position order; one instance per log (it keeps versions)."""

    def __init__(self, plan: Plan, *, seed: int = 7, end: datetime | None = None) -> None:
        self.plan = plan
        self.rng = random.Random(seed)
        self.shapes = Shapes()
        self.end = end or datetime.now(UTC).replace(microsecond=0)
        self.start = self.end - YEAR
        self.step = YEAR / max(1, plan.events)
        self.count = 0
        self.audit_version = 0
        self.teams_version = 0
        self.agents = [f"node-{a:03d}" for a in range(AGENTS)]
        self.incarnations = {a: uuid.UUID(int=self.rng.getrandbits(128)).hex for a in self.agents}
        self.slots = [(a, str(s)) for a in self.agents for s in range(SLOTS_PER_AGENT)]
        self.users = [f"user{u:02d}" for u in range(USERS)]
        self.trial_id = 0

    # -- stamping --------------------------------------------------------------------------

    def _rows(self, items: list[Item], versions: dict[str, int]) -> list[Row]:
        rows: list[Row] = []
        for stream_id, typ, version, payload, meta in items:
            stream_version = versions.get(stream_id, 0) + 1
            versions[stream_id] = stream_version
            recorded = self.start + self.step * self.count
            self.count += 1
            rows.append(
                (uuid.uuid4(), stream_id, stream_version, typ, version, payload, meta, recorded)
            )
        return rows

    # -- the cluster's beginnings ------------------------------------------------------------

    def _prologue(self) -> list[Item]:
        items: list[Item] = [
            Template.of(LeaderElected(lease=lease, holder=f"svc-{lease}:1")).fill(
                f"lease-{lease}", "{}"
            )
            for lease in ("relay", "scheduler", "searcher")
        ]
        for agent in self.agents:
            event = AgentRegistered(
                agent_id=agent,
                hostname=agent,
                incarnation=self.incarnations[agent],
                resource_pool="default",
                slots=[
                    {"slot_id": str(s), "device": "cuda", "name": f"gpu{s}"}
                    for s in range(SLOTS_PER_AGENT)
                ],
            )
            items.append(Template.of(event).fill(agent_stream(agent), _meta(actor="agent")))
        for w in range(WORKSPACES):
            workspace_id = 2 + w
            items.append(
                Template.of(
                    WorkspaceCreated(workspace_id=workspace_id, name=f"team-{w}", owner="admin")
                ).fill(TEAMS_STREAM, _meta(actor="admin"))
            )
            for p in range(PROJECTS_PER_WORKSPACE):
                project_id = 2 + w * PROJECTS_PER_WORKSPACE + p
                items.append(
                    Template.of(
                        ProjectCreated(
                            project_id=project_id,
                            workspace_id=workspace_id,
                            name=f"project-{p}",
                            description="",
                            owner="admin",
                        )
                    ).fill(TEAMS_STREAM, _meta(actor="admin"))
                )
        return items

    # -- one experiment --------------------------------------------------------------------

    def _trial(self, exp: int, trial_id: int, slot: tuple[str, str], failed: bool) -> list[Item]:
        s = self.shapes
        rng = self.rng
        stream = trial_stream(trial_id)
        agent, slot_id = slot
        alloc = f"{trial_id}.1"
        placements = {agent: [slot_id]}
        actor = f"trial:{trial_id}"
        items = [
            s.allocated.fill(stream, "{}", trial_id=trial_id, allocation_id=alloc,
                             placements=placements),
            s.started.fill(
                stream,
                _meta(actor=f"agent:{agent}", causation_id=f"started:{alloc}:{agent}"),
                trial_id=trial_id, allocation_id=alloc, agent_id=agent,
                agent_incarnation=self.incarnations[agent],
            ),
        ]  # fmt: skip
        steps = 100 * rng.randint(10, 60)
        if failed:
            steps = 100 * rng.randint(1, 10)
        decay = rng.uniform(300, 3000)
        seq = 0
        for step in range(100, steps + 1, 100):
            loss = 2.3 * decay / (decay + step) + rng.random() * 0.02
            seq += 1
            meta = _meta(actor=actor, causation_id=f"{alloc}:{seq}")
            items.append(
                s.workload.fill(
                    stream, meta, trial_id=trial_id, steps_completed=step,
                    metrics={"loss": round(loss, 5), "lr": 0.001, "grad_norm": round(rng.random(), 4)},
                )
            )  # fmt: skip
            if step % 500 == 0:
                seq += 1
                meta = _meta(actor=actor, causation_id=f"{alloc}:{seq}")
                items.append(
                    s.validation.fill(
                        stream, meta, trial_id=trial_id, steps_completed=step,
                        metrics={"validation_loss": round(loss * 1.1, 5),
                                 "accuracy": round(1 - loss / 2.5, 5)},
                    )
                )  # fmt: skip
            if step % 1000 == 0:
                seq += 1
                meta = _meta(actor=actor, causation_id=f"{alloc}:{seq}")
                items.append(
                    s.checkpoint.fill(
                        stream, meta, trial_id=trial_id, steps_completed=step,
                        uuid=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                        metadata={"steps_completed": step, "trial_id": trial_id},
                    )
                )  # fmt: skip
        agent_meta = _meta(actor=f"agent:{agent}", causation_id=f"exited:{alloc}:{agent}")
        items += [
            s.exited.fill(
                stream, agent_meta, trial_id=trial_id, allocation_id=alloc,
                outcome="failed" if failed else "completed", exit_code=1 if failed else 0,
            ),
            s.released.fill(stream, agent_meta, trial_id=trial_id, allocation_id=alloc,
                            placements=placements),
            s.trial_state.fill(stream, "{}", trial_id=trial_id,
                               state="ERROR" if failed else "COMPLETED",
                               reason="failed" if failed else "exited"),
        ]  # fmt: skip
        return items

    def _experiment(self, exp: int, window_index: int) -> list[Item]:
        """The experiment's events in order, its trials' streams interleaved."""
        s = self.shapes
        rng = self.rng
        shape = exp % CONFIG_SHAPES
        owner = self.users[rng.randrange(USERS)]
        project_id = 2 + rng.randrange(WORKSPACES * PROJECTS_PER_WORKSPACE)
        stream = experiment_stream(exp)
        remote = f"10.0.{rng.randrange(256)}.{rng.randrange(256)}"
        config = {**s.configs[shape], "name": f"{owner}-sweep-{exp}"}
        assert s.submitted is not None
        head: list[Item] = [
            s.submitted.fill(
                stream,
                _meta(actor=owner, request_id=uuid.uuid4().hex, remote=remote),
                experiment_id=exp, config=config, owner=owner, project_id=project_id,
                code_ref=f"sha256:{rng.getrandbits(256):064x}",
            )
        ]  # fmt: skip
        trials: list[list[Item]] = []
        for seq, create in enumerate(s.requests[shape], start=1):
            self.trial_id += 1
            trial_id = self.trial_id
            head.append(
                s.requested.fill(
                    stream, "{}", experiment_id=exp, trial_id=trial_id, seq=seq,
                    request_id=create.request_id, hparams=create.hparams,
                    trial_seed=create.trial_seed,
                )
            )  # fmt: skip
            slot = self.slots[window_index * TRIALS_PER_EXPERIMENT + seq - 1]
            trials.append(self._trial(exp, trial_id, slot, failed=trial_id % FAIL_EVERY == 0))
        body = [item for group in zip_longest(*trials) for item in group if item is not None]
        audit = [
            s.accepted.fill(
                AUDIT_STREAM, _meta(actor=owner, request_id=uuid.uuid4().hex, remote=remote),
                method="PATCH", route="/api/v1/experiments/{experiment_id}",
                path=f"/api/v1/experiments/{exp}", experiment_id=exp,
            ),
            s.rejected.fill(
                AUDIT_STREAM,
                _meta(actor=self.users[(self.users.index(owner) + 1) % USERS],
                      request_id=uuid.uuid4().hex, remote=remote),
                route="/api/v1/experiments/{experiment_id}/kill",
                path=f"/api/v1/experiments/{exp}/kill", experiment_id=exp,
                message=f"experiment {exp} is {owner}'s",
            ),
        ]  # fmt: skip
        middle = len(body) // 2
        tail = [
            s.exp_state.fill(stream, "{}", experiment_id=exp, state="STOPPING_COMPLETED",
                             reason="search finished", actor="searcher"),
            s.exp_state.fill(stream, "{}", experiment_id=exp, state="COMPLETED",
                             reason="all trials done", actor=""),
        ]  # fmt: skip
        items = head + body[:middle] + audit[:1] + body[middle:] + audit[1:] + tail
        if exp % TASK_EVERY == 0:
            items += self._task(exp, owner, window_index)
        return items

    def _task(self, exp: int, owner: str, window_index: int) -> list[Item]:
        s = self.shapes
        task_id = f"{exp:016x}"
        stream = task_stream(task_id)
        agent, slot_id = self.slots[-TASK_SLOTS + window_index % TASK_SLOTS]
        alloc = f"task-{task_id}.1"
        meta = _meta(actor=owner)
        agent_meta = _meta(actor=f"agent:{agent}")
        return [
            s.task_requested.fill(stream, meta, task_id=task_id, owner=owner,
                                  description=f"evaluate experiment {exp}",
                                  workspace_id=2 + exp % WORKSPACES),
            s.task_allocated.fill(stream, "{}", task_id=task_id, allocation_id=alloc,
                                  placements={agent: [slot_id]}),
            s.task_started.fill(stream, agent_meta, task_id=task_id, allocation_id=alloc,
                                agent_id=agent),
            s.task_exited.fill(stream, agent_meta, task_id=task_id, allocation_id=alloc),
        ]  # fmt: skip

    # -- the whole log ---------------------------------------------------------------------

    def chunks(self) -> Iterator[list[Row]]:
        """The log's rows in position order, one chunk per window of concurrent experiments."""
        versions: dict[str, int] = {}
        yield self._rows(self._prologue(), versions)
        exp = 0
        while exp < self.plan.experiments:
            window = range(exp + 1, min(exp + CONCURRENT, self.plan.experiments) + 1)
            streams = [self._experiment(e, i) for i, e in enumerate(window)]
            # Experiments of a window overlap: each starts a little after the one before.
            merged: list[Item] = []
            offsets = [i * 7 for i in range(len(streams))]
            longest = max(len(x) + o for x, o in zip(streams, offsets, strict=True))
            for k in range(longest):
                for items, offset in zip(streams, offsets, strict=True):
                    if 0 <= k - offset < len(items):
                        merged.append(items[k - offset])
            # audit-api and the teams stream are shared: their versions follow the log order
            yield self._rows(merged, versions)
            for stream_id in list(versions):
                if stream_id not in (AUDIT_STREAM, TEAMS_STREAM) and not stream_id.startswith(
                    ("agent-", "lease-")
                ):
                    del versions[stream_id]  # a window's streams are done
            exp += len(window)


def generate(plan: Plan, *, seed: int = 7, end: datetime | None = None) -> Iterator[list[Row]]:
    """The rows of a log of about ``plan.events`` events, in chunks, position order."""
    return Generator(plan, seed=seed, end=end).chunks()
