"""The experiment config (Determined-compatible schema) and its sections."""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    JsonValue,
    PrivateAttr,
    Tag,
    field_validator,
    model_validator,
)

from events.domain.config.common import (
    ConfigModel,
    Length,
    NonNegInt,
    PositiveInt,
    field_error,
    issues_error,
    shape_union,
)
from events.domain.config.hyperparameters import (
    Hyperparameters,
    grid_issues,
    normalize_hyperparameters,
)
from events.domain.config.ignored import ConfigWarning, ignored_fields
from events.domain.config.limits import (
    MAX_PATH_CHARS,
    MAX_PORT,
    MAX_RESTARTS,
    MAX_SLOTS,
    MAX_SLOTS_PER_TRIAL,
    MAX_WEIGHT,
)
from events.domain.config.searcher import GridSearcher, SearcherConfig

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


def path_text(value: str) -> str:
    """``value`` if it can name a file: no NUL character, at most :data:`MAX_PATH_CHARS`.

    Raises:
        ValueError: saying which (the value shown cut short).
    """
    if "\x00" in value:
        raise ValueError(f"must not contain a NUL character, got {value[:60]!r}")
    if len(value) > MAX_PATH_CHARS:
        raise ValueError(f"must be at most {MAX_PATH_CHARS} characters, got {len(value)}")
    return value


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path, got {value[:60]!r}")
    return path_text(value)


AbsPath = Annotated[str, AfterValidator(_absolute)]
PathText = Annotated[str, Field(min_length=1), AfterValidator(path_text)]
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
    agent_label: str | None = None
    slots: int | None = None

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


def _prefix(value: str | None) -> str | None:
    if value is not None and ".." in value.split("/"):
        raise ValueError(f"must not contain a '..' component, got {value!r}")
    return value


Prefix = Annotated[str | None, AfterValidator(_prefix)]


class S3Storage(_GCPolicy):
    """Checkpoints in an S3-compatible bucket, under ``prefix`` (credentials from the config or,
    when absent, from ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``)."""

    type: Literal["s3"]
    bucket: str = Field(min_length=1)
    access_key: str | None = None
    secret_key: str | None = None
    endpoint_url: str | None = None
    prefix: Prefix = None


class GCSStorage(_GCPolicy):
    """Google Cloud Storage: accepted, not supported (the cluster default storage is used)."""

    type: Literal["gcs"]
    bucket: str = Field(min_length=1)
    prefix: Prefix = None


class AzureStorage(_GCPolicy):
    """Azure Blob Storage: accepted, not supported (the cluster default storage is used)."""

    type: Literal["azure"]
    container: str = Field(min_length=1)
    connection_string: str | None = None
    account_url: str | None = None
    credential: str | None = None

    @model_validator(mode="after")
    def _one_way_in(self) -> AzureStorage:
        if (self.connection_string is None) == (self.account_url is None):
            raise field_error(None, "exactly one of connection_string or account_url must be set")
        if self.connection_string is not None and self.credential is not None:
            raise field_error("credential", "must not be set together with connection_string")
        return self


class ClusterDefaultStorage(_GCPolicy):
    """No ``type``: the cluster's default storage, with this GC policy (as Determined fills in
    the master's ``checkpoint_storage``)."""

    @model_validator(mode="before")
    @classmethod
    def _policy_only(cls, value: Any) -> Any:
        if isinstance(value, dict):
            extra = sorted(k for k in value if k not in _GCPolicy.model_fields)
            if extra:
                raise field_error(
                    "type",
                    f"required with {', '.join(map(str, extra))} (one of shared_fs, directory, "
                    "s3, gcs, azure); without type only the save_* fields may be set",
                )
        return value


def _storage_tag(value: Any) -> str | None:
    if isinstance(value, dict):
        kind = value.get("type")
        return "default" if kind is None else kind if isinstance(kind, str) else None
    if isinstance(value, BaseModel):
        kind = getattr(value, "type", None)
        return "default" if kind is None else str(kind)
    return None


CheckpointStorage = Annotated[
    Annotated[SharedFSStorage, Tag("shared_fs")]
    | Annotated[DirectoryStorage, Tag("directory")]
    | Annotated[S3Storage, Tag("s3")]
    | Annotated[GCSStorage, Tag("gcs")]
    | Annotated[AzureStorage, Tag("azure")]
    | Annotated[ClusterDefaultStorage, Tag("default")],
    Discriminator(_storage_tag),
]
"""A ``checkpoint_storage`` config, chosen by its ``type`` (none: the cluster default)."""


def _gpu_is_cuda(value: Any) -> Any:
    """Determined's older key ``gpu`` means ``cuda`` (used only when ``cuda`` is absent)."""
    if isinstance(value, dict) and "gpu" in value:
        value = dict(value)
        gpu = value.pop("gpu")
        if value.get("cuda") is None:
            value["cuda"] = gpu
    return value


class ImagePerDevice(ConfigModel):
    """A container image per device type (``gpu`` is read as ``cuda``)."""

    cpu: str | None = None
    cuda: str | None = None
    rocm: str | None = None

    _gpu = model_validator(mode="before")(_gpu_is_cuda)


class EnvVarsPerDevice(ConfigModel):
    """Environment variables (``KEY=VALUE``) per device type (``gpu`` is read as ``cuda``)."""

    cpu: list[EnvVar] = Field(default_factory=list)
    cuda: list[EnvVar] = Field(default_factory=list)
    rocm: list[EnvVar] = Field(default_factory=list)

    _gpu = model_validator(mode="before")(_gpu_is_cuda)


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
    """A host directory mounted into the containers of a trial or a task (``host_path`` must lie
    under the cluster's ``allowed_bind_mount_roots``: see
    :mod:`events.domain.config.host_requests`)."""

    host_path: AbsPath
    container_path: PathText
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


LogAction = Literal["exclude_node", "cancel_retries"]


class LegacyLogAction(ConfigModel):
    """The older form of a log policy's action: ``{type: cancel_retries}``."""

    type: LogAction


class LogPolicy(ConfigModel):
    """A regex over trial logs and what to do when it matches.

    The current form names the policy (``name``; ``pattern: null`` disables a default one); the
    older form has no name and needs ``pattern`` and ``action`` (an action as ``{type: ...}``).
    """

    name: str | None = None
    pattern: str | None = None
    action: (
        Annotated[
            Annotated[LogAction, Tag("str")] | Annotated[LegacyLogAction, Tag("map")],
            shape_union("'exclude_node', 'cancel_retries' or a mapping {type: <one of them>}"),
        ]
        | None
    ) = None

    @model_validator(mode="before")
    @classmethod
    def _named_or_legacy(cls, value: Any) -> Any:
        legacy = isinstance(value, dict) and value.get("name") is None
        if legacy and (value.get("pattern") is None or value.get("action") is None):
            raise field_error(None, "must set name, or (the older form) both pattern and action")
        return value


class RetentionPolicy(ConfigModel):
    """How long trial logs are kept."""

    log_retention_days: int | None = Field(None, ge=-1, le=32767)


def _sbatch_arg(value: str) -> str:
    """``value`` if a config may pass it to ``sbatch`` (see ``sbatch_arg_problem``).

    Raises:
        ValueError: naming the problem (the value shown cut short).
    """
    # Imported here: resource_pools imports this module (for AbsPath).
    from events.domain.config.resource_pools import sbatch_arg_problem

    problem = sbatch_arg_problem(value)
    if problem is not None:
        raise ValueError(f"{problem}, got {value[:60]!r}")
    return value


SbatchArg = Annotated[str, AfterValidator(_sbatch_arg)]


class SlurmConfig(ConfigModel):
    """How the trials of an experiment in a Slurm-backed resource pool are submitted
    (``docs/slurm.md``); in any other pool the section has no effect.

    Attributes:
        slots_per_node: the most slots a trial takes on one node (``None``: the pool's).
        gpu_type: accepted for Determined compatibility, not used (reported as ignored).
        sbatch_args: ``sbatch`` options added to each job after the pool's; none may set what
            cairn sets (``SBATCH_ARGS_CAIRN_SETS`` in
            :mod:`events.domain.config.resource_pools`) or hold a newline.
    """

    slots_per_node: PositiveInt | None = None
    gpu_type: str | None = None
    sbatch_args: list[SbatchArg] = Field(default_factory=list, max_length=64)


class PBSConfig(ConfigModel):
    """PBS launcher options (Determined's HPC launcher)."""

    slots_per_node: PositiveInt | None = None
    pbsbatch_args: list[str] = Field(default_factory=list)


class KerberosConfig(ConfigModel):
    """Kerberos settings of the long-unused ``security`` section."""

    config_file: str


class SecurityConfig(ConfigModel):
    """The long-unused ``security`` section."""

    kerberos: KerberosConfig | None = None


class PachydermPachd(ConfigModel):
    """Where pachd is."""

    host: str
    port: int


class PachydermProxy(ConfigModel):
    """The proxy in front of pachd."""

    scheme: str
    host: str
    port: int


class PachydermDataset(ConfigModel):
    """The Pachyderm commit an experiment trains on."""

    project: str
    repo: str
    commit: str
    branch: str
    token: str


class PachydermConfig(ConfigModel):
    """A Pachyderm integration."""

    pachd: PachydermPachd
    proxy: PachydermProxy
    dataset: PachydermDataset


class WebhooksConfig(ConfigModel):
    """Which webhooks fire for the experiment."""

    webhook_id: list[int] | None = None
    webhook_name: list[str] | None = None
    exclude: bool | None = None


class IntegrationsConfig(ConfigModel):
    """Third-party integrations."""

    pachyderm: PachydermConfig | None = None
    webhooks: WebhooksConfig | None = None


class ExperimentConfig(ConfigModel):
    """A whole experiment config. Build it with :func:`events.domain.config.parse_config`."""

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
    retention_policy: RetentionPolicy | None = None
    integrations: IntegrationsConfig | None = None
    tensorboard_storage: dict[str, JsonValue] | None = None
    data_layer: dict[str, JsonValue] | None = None
    slurm: SlurmConfig | None = None
    pbs: PBSConfig | None = None
    security: SecurityConfig | None = None

    _warnings: tuple[ConfigWarning, ...] = PrivateAttr(default=())

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return normalize_hyperparameters(value)

    @property
    def warnings(self) -> tuple[ConfigWarning, ...]:
        """What this config sets that cairn accepts but ignores, one warning per path."""
        return self._warnings

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        issues: list[tuple[tuple[str | int, ...], str]] = []
        if isinstance(self.searcher, GridSearcher):
            issues += [(("hyperparameters", *p), m) for p, m in grid_issues(self.hyperparameters)]
        if issues:
            raise issues_error(issues)
        self._warnings = tuple(ignored_fields(self))
        return self

    def to_dict(self) -> dict[str, Any]:
        """The full config as plain JSON data (defaults included); ``parse_config`` inverts it."""
        return self.model_dump(mode="json")

    @property
    def experiment_seed(self) -> int | None:
        """Shortcut for ``reproducibility.experiment_seed``."""
        return self.reproducibility.experiment_seed
