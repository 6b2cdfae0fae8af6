"""The experiment config (Determined-compatible schema) and its sections."""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, JsonValue, Tag, field_validator, model_validator

from events.config.common import (
    ConfigModel,
    Length,
    NonNegInt,
    PositiveInt,
    field_error,
    issues_error,
    shape_union,
)
from events.config.hyperparameters import (
    Hyperparameters,
    grid_issues,
    normalize_hyperparameters,
)
from events.config.limits import (
    MAX_PORT,
    MAX_RESTARTS,
    MAX_SLOTS,
    MAX_SLOTS_PER_TRIAL,
    MAX_WEIGHT,
)
from events.config.searcher import GridSearcher, SearcherConfig

UINT32_MAX = 2**32 - 1

_SHM_SIZE = re.compile(r"^\d+(\.\d+)?\s*([kKmMgGtT][iI]?)?[bB]?$")


def _env_var(value: str) -> str:
    key, sep, _ = value.partition("=")
    if not sep or not key:
        raise ValueError(f"must look like KEY=VALUE, got {value!r}")
    return value


def _shm_text(value: str) -> str:
    if not _SHM_SIZE.match(value):
        raise ValueError(f"must be a byte count or a size like '4G', got {value!r}")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value!r}")
    return value


AbsPath = Annotated[str, AfterValidator(_absolute)]
EnvVar = Annotated[str, AfterValidator(_env_var)]

Entrypoint = Annotated[
    Annotated[str, Field(min_length=1), Tag("str")]
    | Annotated[list[str], Field(min_length=1), Tag("list")],
    shape_union("a string or a non-empty list of strings"),
]

ShmSize = Annotated[
    Annotated[NonNegInt, Tag("int")] | Annotated[str, AfterValidator(_shm_text), Tag("str")],
    shape_union("a byte count or a size string like '4G'"),
]


class DeviceConfig(ConfigModel):
    """A host device exposed to trial containers."""

    host_path: AbsPath
    container_path: AbsPath
    mode: str = "mrw"


class ResourcesConfig(ConfigModel):
    """What each trial needs and how the experiment competes for the cluster."""

    slots_per_trial: int = Field(1, ge=0, le=MAX_SLOTS_PER_TRIAL)
    max_slots: Annotated[int, Field(ge=0, le=MAX_SLOTS)] | None = None
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT)
    priority: int | None = Field(None, ge=1, le=99)
    resource_pool: str = ""
    shm_size: ShmSize | None = None
    devices: list[DeviceConfig] = Field(default_factory=list)
    is_single_node: bool | None = None
    native_parallel: bool = False

    @model_validator(mode="after")
    def _slots_fit(self) -> ResourcesConfig:
        if self.max_slots is not None and self.max_slots < self.slots_per_trial:
            raise field_error(
                "max_slots",
                f"must be >= slots_per_trial ({self.slots_per_trial}), got {self.max_slots}",
            )
        return self


class _GCPolicy(ConfigModel):
    save_experiment_best: NonNegInt = 0
    save_trial_best: NonNegInt = 1
    save_trial_latest: NonNegInt = 1


class SharedFSStorage(_GCPolicy):
    """Checkpoints on a file system mounted on every agent at ``host_path``."""

    type: Literal["shared_fs"]
    host_path: AbsPath
    storage_path: str | None = None
    propagation: str = "rprivate"
    container_path: str | None = None
    checkpoint_path: str | None = None
    tensorboard_path: str | None = None

    @model_validator(mode="after")
    def _storage_inside_host(self) -> SharedFSStorage:
        path = self.storage_path
        if path is not None and path.startswith("/"):
            inside = posixpath.commonpath([self.host_path, posixpath.normpath(path)])
            if inside != posixpath.normpath(self.host_path):
                raise field_error(
                    "storage_path",
                    f"must be relative or under host_path {self.host_path!r}, got {path!r}",
                )
        elif path is not None and ".." in path.split("/"):
            raise field_error("storage_path", f"must not leave host_path, got {path!r}")
        return self


class DirectoryStorage(_GCPolicy):
    """Checkpoints in a directory already mounted in the trial container."""

    type: Literal["directory"]
    container_path: AbsPath


CheckpointStorage = Annotated[SharedFSStorage | DirectoryStorage, Field(discriminator="type")]


class ImagePerDevice(ConfigModel):
    """A container image per device type."""

    cpu: str | None = None
    cuda: str | None = None
    rocm: str | None = None


class EnvVarsPerDevice(ConfigModel):
    """Environment variables (``KEY=VALUE``) per device type."""

    cpu: list[EnvVar] = Field(default_factory=list)
    cuda: list[EnvVar] = Field(default_factory=list)
    rocm: list[EnvVar] = Field(default_factory=list)


Image = Annotated[
    Annotated[str, Field(min_length=1), Tag("str")] | Annotated[ImagePerDevice, Tag("map")],
    shape_union("an image name or a mapping of cpu/cuda/rocm to image names"),
]
EnvVars = Annotated[
    Annotated[list[EnvVar], Tag("list")] | Annotated[EnvVarsPerDevice, Tag("map")],
    shape_union("a list of KEY=VALUE strings or a mapping of cpu/cuda/rocm to such lists"),
]


class EnvironmentConfig(ConfigModel):
    """The runtime environment of trial processes."""

    image: Image | None = None
    environment_variables: EnvVars = Field(default_factory=list)
    force_pull_image: bool = False
    registry_auth: dict[str, JsonValue] | None = None
    proxy_ports: list[dict[str, JsonValue]] = Field(default_factory=list)
    ports: dict[str, Annotated[int, Field(ge=0, le=MAX_PORT)]] = Field(default_factory=dict)
    pod_spec: dict[str, JsonValue] | None = None
    add_capabilities: list[str] = Field(default_factory=list)
    drop_capabilities: list[str] = Field(default_factory=list)


class ReproducibilityConfig(ConfigModel):
    """Seeds; ``experiment_seed`` drives the searcher's random generator."""

    experiment_seed: int | None = Field(None, ge=0, le=UINT32_MAX)


class BindMount(ConfigModel):
    """A host directory mounted into trial containers."""

    host_path: AbsPath
    container_path: str = Field(min_length=1)
    read_only: bool = False
    propagation: str = "rprivate"


class ProfilingConfig(ConfigModel):
    """System/timing profiling of a trial."""

    enabled: bool = False
    begin_on_batch: NonNegInt = 0
    end_after_batch: NonNegInt | None = None
    sync_timings: bool = True

    @model_validator(mode="after")
    def _window(self) -> ProfilingConfig:
        end = self.end_after_batch
        if end is not None and end < self.begin_on_batch:
            raise field_error(
                "end_after_batch", f"must be >= begin_on_batch ({self.begin_on_batch}), got {end}"
            )
        return self


class OptimizationsConfig(ConfigModel):
    """Deprecated distributed-training knobs, accepted for compatibility."""

    aggregation_frequency: PositiveInt = 1
    average_aggregated_gradients: bool = True
    average_training_metrics: bool = True
    gradient_compression: bool = False
    grad_updates_size_file: str | None = None
    mixed_precision: str = "O0"
    tensor_fusion_threshold: NonNegInt = 64
    tensor_fusion_cycle_time: NonNegInt = 5
    auto_tune_tensor_fusion: bool = False


class LogPolicy(ConfigModel):
    """A regex over trial logs and what to do when it matches."""

    name: str | None = None
    pattern: str | None = None
    action: Literal["exclude_node", "cancel_retries"] | None = None


class ExperimentConfig(ConfigModel):
    """A whole experiment config. Build it with :func:`events.config.parse_config`."""

    name: str | None = None
    description: str | None = None
    labels: list[str] = Field(default_factory=list)
    workspace: str = ""
    project: str = ""
    entrypoint: Entrypoint | None = None
    hyperparameters: Hyperparameters = Field(default_factory=dict)
    searcher: SearcherConfig
    resources: ResourcesConfig = ResourcesConfig()
    max_restarts: int = Field(5, ge=0, le=MAX_RESTARTS)
    checkpoint_storage: CheckpointStorage | None = None
    checkpoint_policy: Literal["best", "all", "none"] = "best"
    environment: EnvironmentConfig = EnvironmentConfig()
    reproducibility: ReproducibilityConfig = ReproducibilityConfig()
    data: dict[str, JsonValue] = Field(default_factory=dict)
    bind_mounts: list[BindMount] = Field(default_factory=list)
    min_validation_period: Length = Length(batches=0)
    min_checkpoint_period: Length = Length(batches=0)
    records_per_epoch: NonNegInt = 0
    scheduling_unit: PositiveInt = 100
    perform_initial_validation: bool = False
    profiling: ProfilingConfig = ProfilingConfig()
    optimizations: OptimizationsConfig = OptimizationsConfig()
    debug: bool = False
    preemption_timeout: NonNegInt | None = None
    log_policies: list[LogPolicy] = Field(default_factory=list)

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return normalize_hyperparameters(value)

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if isinstance(self.searcher, GridSearcher):
            issues += [(("hyperparameters", *p), m) for p, m in grid_issues(self.hyperparameters)]
        if issues:
            raise issues_error(issues)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The full config as plain JSON data (defaults included); ``parse_config`` inverts it."""
        return self.model_dump(mode="json")

    @property
    def experiment_seed(self) -> int | None:
        """Shortcut for ``reproducibility.experiment_seed``."""
        return self.reproducibility.experiment_seed
