"""The config of a task (Determined's command config, the part cairn honours today).

Unknown fields are refused, naming their path, so a user never believes a setting took effect
that cairn does not implement yet. Defaults are written here once; the fold and the scheduler
read them through :class:`TaskConfig`.

``bind_mounts`` are an experiment's (:class:`~events.domain.config.models.BindMount`), under the
same cluster policy (:mod:`events.domain.config.host_requests`). ``work_dir`` is where the task
starts, as a path inside its context directory: the same path then means the same directory to a
process and to a container (which sees the context where the agent keeps it), and no value can
name a directory outside what the user uploaded. The fold validates every stored config again,
so these rules may only ever grow more permissive.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from events.domain.config.experiment_settings import DEFAULT_PRIORITY
from events.domain.config.models import BindMount, path_text

MAX_TASK_SLOTS = 64
"""The most slots one task may ask for (a task runs on one agent)."""

TENSORBOARD_SLOTS = 0
"""The slots a TensorBoard holds unless its config says otherwise (an auxiliary task: it only
reads files and serves pages)."""


class TaskResources(BaseModel):
    """``resources``: how many slots, at which priority, in which pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slots: int = Field(1, ge=0, le=MAX_TASK_SLOTS, description="slots held (0: none)")
    priority: int = Field(DEFAULT_PRIORITY, ge=1, le=99, description="1 is the most important")
    resource_pool: str = Field("", max_length=200, description="pool ('': the default pool)")


class TaskEnvironment(BaseModel):
    """``environment``: variables set in the task's process, as Determined writes them
    (``["NAME=value", ...]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    environment_variables: list[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*=", max_length=10_000)]
    ] = Field(default_factory=list, max_length=200)


MAX_TASK_BIND_MOUNTS = 100
"""The most bind mounts one task may ask for."""


def context_path(value: str) -> str:
    """``value`` if it names a directory inside a task's context: relative, without a ``..``
    component, a NUL or another control character, at most ``MAX_PATH_CHARS`` characters.

    Raises:
        ValueError: saying what was wrong (the value shown cut short).
    """
    path_text(value)
    shown = repr(value[:60])
    if not value.strip():
        raise ValueError("must name a directory of the context (omit it for the context itself)")
    if value.startswith("/"):
        raise ValueError(f"must be a path inside the task's context directory, got {shown}")
    if ".." in value.split("/"):
        raise ValueError(f"must not contain a '..' component, got {shown}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"must not contain a control character, got {shown}")
    return value


_DURATION = re.compile(r"(\d+)(h|m|s)")
_UNIT_SECONDS = {"h": 3600, "m": 60, "s": 1}
MAX_IDLE_TIMEOUT = 366 * 24 * 3600
"""The longest ``idle_timeout`` (a year and a day, in seconds)."""


def duration_seconds(value: str) -> int:
    """Seconds of a Go-style duration (``"30m"``, ``"1h30m"``, ``"45s"``; a bare number is
    seconds).

    Raises:
        ValueError: ``value`` is no such duration.
    """
    text = value.strip()
    if text.isdigit():
        return int(text)
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{value[:40]!r} is not a duration like 30m, 1h30m or 45s")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)


class TaskConfig(BaseModel):
    """A task's config: ``description``, ``resources``, ``environment``, ``bind_mounts``,
    ``work_dir``, ``idle_timeout``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field("", max_length=1000)
    resources: TaskResources = Field(default_factory=TaskResources)
    environment: TaskEnvironment = Field(default_factory=TaskEnvironment)
    bind_mounts: list[BindMount] = Field(
        default_factory=list,
        max_length=MAX_TASK_BIND_MOUNTS,
        description="host directories mounted into the task's container (a task run as a "
        "process gets none), each under the cluster's allowed_bind_mount_roots",
    )
    work_dir: str | None = Field(
        None,
        description="where the task starts: a directory of its context, relative to it "
        "(none: the context directory itself)",
    )
    idle_timeout: str | None = Field(
        None,
        max_length=40,
        description="a notebook or shell with no activity (a notebook's kernels, a shell's "
        "input and output) and no open connection for this long (30m, 1h30m, 45s) is killed; "
        "none: never",
    )

    @field_validator("work_dir")
    @classmethod
    def _inside_context(cls, value: str | None) -> str | None:
        return None if value is None else context_path(value)

    @field_validator("idle_timeout")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None and not 1 <= duration_seconds(value) <= MAX_IDLE_TIMEOUT:
            raise ValueError(f"between 1s and {MAX_IDLE_TIMEOUT}s")
        return value

    @property
    def idle_seconds(self) -> int | None:
        """``idle_timeout`` in seconds (``None``: never idle-killed)."""
        return None if self.idle_timeout is None else duration_seconds(self.idle_timeout)
