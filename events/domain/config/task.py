"""The config of a task (Determined's command config, the part cairn honours today).

Unknown fields are refused, naming their path, so a user never believes a setting took effect
that cairn does not implement yet. Defaults are written here once; the fold and the scheduler
read them through :class:`TaskConfig`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from events.domain.config.experiment_settings import DEFAULT_PRIORITY

MAX_TASK_SLOTS = 64
"""The most slots one task may ask for (a task runs on one agent)."""


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


class TaskConfig(BaseModel):
    """A task's config: ``description``, ``resources``, ``environment``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field("", max_length=1000)
    resources: TaskResources = Field(default_factory=TaskResources)
    environment: TaskEnvironment = Field(default_factory=TaskEnvironment)
