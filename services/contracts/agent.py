"""The agent <-> API gateway protocol (``docs/protocol.md``): one pydantic model per request
body, query and answer, which the gateway validates and serializes and the agent builds and
parses.

Why here: the agent holds no database credential and must not import the gateway (its routes
pull in the store, the auth keys and every table), and the gateway must not import the agent (its
runtimes, confinement, Docker). This package is no service: it imports pydantic and
:mod:`events.domain` only, so both sides import it and neither imports the other.

Invariants:

- A field is added here, once, and both sides see it; a model is never restated in a route or in
  the agent.
- The agent refuses a :class:`SpecResponse` with a field this module does not name (the gateway
  and its agents are one release), and every malformed field is a :class:`pydantic.ValidationError`
  naming it.
- Request bodies ignore unknown fields (an older agent's report keeps working).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from events.domain.types.agent import Slot

_INCARNATION_PATTERN = r"^[A-Za-z0-9_-]*$"
_INCARNATION_LENGTH = 64
_ID_LENGTH = 200
_ALLOCATION_ID_PATTERN = r"^[A-Za-z0-9-][A-Za-z0-9_.:@-]*$"
"""An allocation id as an agent names one (a trial's ``17.2``, a task's ``task-<id>.<run>``)."""


# --- joining, registration, heartbeats: /api/v1/agents/{agent_id}/... ---


class JoinBody(BaseModel):
    """No fields: the agent id is in the path, the join token in ``Authorization``."""


class JoinResponse(BaseModel):
    """The agent's own credential: keep it (mode 0600) and present ``token`` from now on;
    ``nats_creds`` (when the bus requires credentials) is the ``.creds`` file of its NATS user,
    whose replies arrive below ``inbox_prefix``."""

    agent_id: str
    token: str
    nats_creds: str | None
    inbox_prefix: str


class RegisterBody(BaseModel):
    """What an agent offers: its slots, pool and host; ``incarnation`` names this start of it;
    ``reserved_for``, the one allocation an ephemeral agent (a Slurm job's) was started for."""

    resource_pool: str = "default"
    slots: list[Slot]
    hostname: str = ""
    incarnation: str = Field("", max_length=_INCARNATION_LENGTH, pattern=_INCARNATION_PATTERN)
    reserved_for: str | None = Field(
        None, min_length=1, max_length=_ID_LENGTH, pattern=_ALLOCATION_ID_PATTERN
    )
    idempotency_key: str | None = None


class RegisterResponse(BaseModel):
    """Whether a new ``AgentRegistered`` was appended (``false``: already registered as such)."""

    agent_id: str
    changed: bool


class HeartbeatBody(BaseModel):
    """The allocations the agent is running right now, as of its heartbeat number ``seq`` in
    process ``incarnation`` (``seq`` 0: unnumbered)."""

    running: list[str] = Field(default_factory=list)
    incarnation: str = Field("", max_length=_INCARNATION_LENGTH, pattern=_INCARNATION_PATTERN)
    seq: int = Field(0, ge=0, le=2**62)
    idempotency_key: str | None = None


class HeartbeatResponse(BaseModel):
    """``registered: false`` tells the agent it was declared lost and must register again."""

    registered: bool


class LeavingBody(BaseModel):
    """The agent process ``incarnation`` is shutting down (before it stops its runs)."""

    incarnation: str = Field("", max_length=_INCARNATION_LENGTH, pattern=_INCARNATION_PATTERN)
    idempotency_key: str | None = None


# --- one run: /api/v1/allocations/{allocation_id}/... ---


class SpecQuery(BaseModel):
    """Which agent asks (its slot ids are returned; all slots when omitted)."""

    agent_id: str | None = None


class TensorboardSpecSource(BaseModel):
    """One experiment a TensorBoard task reads: its trials (``None``: all of them) and its
    ``checkpoint_storage`` as a trial of it gets it (credentials included; ``None``: the
    cluster's default storage)."""

    model_config = ConfigDict(extra="forbid")

    experiment_id: int
    trial_ids: list[int] | None
    checkpoint_storage: dict[str, Any] | None


class SpecResponse(BaseModel):
    """Everything an agent needs to launch the run (see docs/protocol.md).

    Unknown fields are an error: an agent launching a run must not silently drop what the
    gateway meant it to honour.
    """

    model_config = ConfigDict(extra="forbid")

    active: bool
    allocation_id: str
    trial_id: int
    """The trial this run belongs to (0 for a task's run: see ``task_id``)."""
    experiment_id: int
    """The trial's experiment (0 for a task's run)."""
    run_id: int
    entrypoint: str | list[str] | None
    code_ref: str | None
    hparams: dict[str, Any]
    trial_seed: int
    latest_checkpoint: str | None
    steps_completed: int
    token: str
    checkpoint_storage: dict[str, Any] | None
    environment_variables: dict[str, str]
    slot_ids: list[str]
    placements: dict[str, list[str]]
    config: dict[str, Any]
    user: str
    cluster_id: str
    agent_user_group: dict[str, Any] | None = None
    """The unix identity the run's code runs as (``agent_uid``, ``agent_gid``, ``agent_user``,
    ``agent_group``, ``linked``): the owner's, assigned on first use unless an admin linked
    the owner to an account."""
    task_id: str | None = None
    """Set for a task's run (a command): the agent runs ``entrypoint`` as the owner, like a
    trial's, but gives it no token, hyperparameters or TensorBoard directory."""
    serve_token: str | None = None
    """For a task that serves HTTP (a notebook, a TensorBoard, a shell): the token its server requires of every request
    (the API's proxy adds it); never shown to users or written to the log."""
    task_kind: str | None = None
    """A task's kind: ``command`` runs ``entrypoint``; ``notebook`` runs JupyterLab,
    ``tensorboard`` TensorBoard and ``shell`` cairn's terminal server, each on a port the agent
    picks, reported with
    ``POST /allocations/{id}/ready`` once it accepts connections."""
    tensorboard_sources: list[TensorboardSpecSource] = Field(default_factory=list)
    """What a ``tensorboard`` task shows (empty for any other run)."""


class StartedBody(BaseModel):
    """The agent launched the run's process.

    ``incarnation`` names the agent process; ``listed_from`` is the first of its heartbeat numbers
    that lists this allocation (every later one does too, until the exit is reported).
    """

    agent_id: str
    incarnation: str = Field("", max_length=_INCARNATION_LENGTH, pattern=_INCARNATION_PATTERN)
    listed_from: int | None = Field(None, ge=1, le=2**62)
    idempotency_key: str | None = None


class ReadyBody(BaseModel):
    """A task's server accepts connections at ``address``:``port`` on the agent."""

    agent_id: str
    address: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:_-]+$")
    port: int = Field(ge=1, le=65535)
    idempotency_key: str | None = None


class IdleBody(BaseModel):
    """A task's server has had no activity and no open connection for ``idle_seconds``."""

    agent_id: str
    idle_seconds: int = Field(ge=0, le=2**31)
    idempotency_key: str | None = None


class ExitedBody(BaseModel):
    """The run's process ended with ``exit_code``.

    ``agent_shutdown`` says the agent stopped the run because the agent itself was shutting
    down (absent from older agents' reports): the platform ended the run, not the trial.
    """

    agent_id: str
    exit_code: int
    message: str = ""
    idempotency_key: str | None = None
    agent_shutdown: bool = False


class PendingPreemptionBody(BaseModel):
    """The resource manager that started agent ``agent_id`` signalled it (``reason``: e.g. a
    SIGTERM from ``scancel``): the run is to checkpoint and give its slots back."""

    agent_id: str = Field(min_length=1, max_length=_ID_LENGTH)
    reason: str = Field("", max_length=_ID_LENGTH)
    idempotency_key: str | None = Field(None, max_length=500)


class ReportResponse(BaseModel):
    """Whether this report appended events (``duplicate``: an earlier report already did)."""

    allocation_id: str
    appended: list[str]
    duplicate: bool
    outcome: str | None = None


class LogLine(BaseModel):
    """One line of a trial process's output."""

    ts: datetime | None = None
    rank: int | None = Field(None, ge=0, le=2**31 - 1)
    stream: Literal["stdout", "stderr"] = "stdout"
    line: str


class LogsBody(BaseModel):
    """A batch of log lines; a repeated ``idempotency_key`` is ignored."""

    lines: list[LogLine]
    idempotency_key: str = Field(min_length=1, max_length=500)


class LogsResponse(BaseModel):
    """How many lines were stored (0 for a repeated batch)."""

    inserted: int


class PreemptionQuery(BaseModel):
    """How long to wait for a signal (capped at 60 s; 0 answers at once)."""

    timeout_seconds: float = Field(0, ge=0, allow_inf_nan=False)


class PreemptionResponse(BaseModel):
    """Whether the run should checkpoint and exit, and whether it is still the trial's current
    run (``current: false``: it was declared lost or has exited, so nothing it reports is
    accepted and it should stop at once)."""

    preempt: bool
    current: bool = True


# --- a gang's rendezvous: /api/v1/allocations/{allocation_id}/rendezvous ---


class RendezvousJoinBody(BaseModel):
    """An agent of the run's gang is ready and reachable at ``address:port``."""

    agent_id: str = Field(min_length=1, max_length=255)
    address: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:_\-\[\]%]+$")
    port: int = Field(ge=1, le=65535)
    idempotency_key: str | None = Field(None, max_length=500)


class RendezvousQuery(BaseModel):
    """Who asks (its node rank is answered) and how long to wait for completion (capped 60 s)."""

    agent_id: str | None = Field(None, max_length=255)
    timeout_seconds: float = Field(0, ge=0, allow_inf_nan=False)


class RendezvousResponse(BaseModel):
    """The state of the rendezvous; ``chief_*`` only once it is ``complete``; ``current: false``
    when the run has ended or was replaced (whoever waits should give up)."""

    allocation_id: str
    current: bool
    complete: bool
    nodes: list[str]
    joined: list[str]
    num_nodes: int
    world_size: int
    chief_address: str | None
    chief_port: int | None
    node_rank: int | None
    rank_offset: int | None
    local_size: int | None
