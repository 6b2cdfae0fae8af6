"""What a config sets that cairn accepts (it is valid in Determined) but does not act on.

:func:`ignored_fields` names each such path once, with the reason, so that a Determined user
sees at submission what of their config has no effect. It is a pure function of the validated
config: a setting equal to its default (or empty) is not reported, so a config stored with its
defaults filled in gives the same warnings as the text it came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from events.domain.config.models import ExperimentConfig


class ConfigWarning(BaseModel):
    """One accepted-but-ignored setting: its dotted ``path`` and why it has no effect."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


NO_CONTAINERS = "trials run as processes in the agent's environment, not in containers"
NO_PULLS = "agents use the image on their host and pull it only when it is missing"
TRIAL_API = "only Determined's deprecated Trial API used it; Core API code decides this itself"

_TOP_LEVEL: dict[str, str] = {
    "profiling": "turn profiling on from the training code with ctx.profiler.on()",
    "optimizations": TRIAL_API,
    "records_per_epoch": TRIAL_API,
    "scheduling_unit": TRIAL_API,
    "min_validation_period": TRIAL_API,
    "min_checkpoint_period": TRIAL_API,
    "perform_initial_validation": TRIAL_API,
    "checkpoint_policy": TRIAL_API,
    "debug": "cairn has no debug mode for trials",
    "log_policies": "cairn does not match trial logs against log policies",
    "retention_policy": "trial logs are kept as long as the experiment",
    "tensorboard_storage": (
        "deprecated in Determined; TensorBoard files go to the checkpoint storage"
    ),
    "data_layer": "removed from Determined in 0.19.10",
    "pbs": "cairn has no PBS launcher",
    "security": "cairn has no Kerberos support",
}

_RESOURCES: dict[str, str] = {
    "agent_label": "removed from Determined in 0.20.0; use resource_pool",
    "slots": "not used by experiments; use slots_per_trial",
    "is_single_node": "the scheduler decides where a trial's slots are",
    "native_parallel": "deprecated in Determined; launch distributed training from the entrypoint",
}

_ENVIRONMENT: dict[str, str] = {
    "force_pull_image": NO_PULLS,
    "registry_auth": "agents pull images without registry credentials",
    "proxy_ports": "cairn does not proxy ports of trials",
    "ports": "cairn does not proxy ports of trials",
    "pod_spec": "cairn does not run on Kubernetes",
}

_SEARCHER: dict[str, str] = {
    "source_trial_id": "cairn does not warm-start trials; each starts from scratch",
    "source_checkpoint_uuid": "cairn does not warm-start trials; each starts from scratch",
    "stop_once": "deprecated in Determined; ASHA stops trials and never promotes them",
}

_SLURM: dict[str, str] = {
    "gpu_type": (
        "Slurm jobs ask for GPUs by count (--gres=gpu:N); choose a GPU type with the pool's "
        "partition or a --constraint in slurm.sbatch_args"
    ),
}

_SHARED_FS: dict[str, str] = {
    "container_path": "trials read host_path directly (no containers)",
    "checkpoint_path": "trials read host_path directly (no containers)",
    "tensorboard_path": "TensorBoard files go under the checkpoint root",
    "propagation": NO_CONTAINERS,
}

_OTHER_STORAGE = (
    "cairn has no {kind} client; checkpoints go to the cluster's default storage instead"
)


def _set(model: BaseModel, name: str) -> bool:
    """Whether ``model.name`` differs from the field's default (an empty value never counts)."""
    value = getattr(model, name)
    if value is None or value == [] or value == {}:
        return False
    field = type(model).model_fields[name]
    default = field.get_default(call_default_factory=True)
    return bool(value != default)


def _section(model: BaseModel, prefix: str, table: dict[str, str]) -> Iterator[ConfigWarning]:
    for name, reason in table.items():
        if name in type(model).model_fields and _set(model, name):
            yield ConfigWarning(path=f"{prefix}{name}", message=f"ignored: {reason}")


def _device_maps(config: ExperimentConfig) -> Iterator[ConfigWarning]:
    env_vars: Any = config.environment.environment_variables
    if isinstance(env_vars, BaseModel) and getattr(env_vars, "rocm", None):
        yield ConfigWarning(
            path="environment.environment_variables.rocm",
            message="ignored: cairn agents offer CPU and CUDA slots only",
        )


def _storage(config: ExperimentConfig) -> Iterator[ConfigWarning]:
    storage = config.checkpoint_storage
    kind = getattr(storage, "type", None)
    if storage is None:
        return
    if kind in ("gcs", "azure"):
        name = "Google Cloud Storage" if kind == "gcs" else "Azure Blob Storage"
        yield ConfigWarning(
            path="checkpoint_storage",
            message=f"ignored: {_OTHER_STORAGE.format(kind=name)}",
        )
    elif kind == "shared_fs":
        yield from _section(storage, "checkpoint_storage.", _SHARED_FS)


def _integrations(config: ExperimentConfig) -> Iterator[ConfigWarning]:
    """``integrations.pachyderm`` is ignored; ``integrations.webhooks`` is acted on."""
    if config.integrations is not None and config.integrations.pachyderm is not None:
        yield ConfigWarning(
            path="integrations.pachyderm", message="ignored: cairn has no Pachyderm integration"
        )


def ignored_fields(config: ExperimentConfig) -> list[ConfigWarning]:
    """Every setting of ``config`` that cairn accepts but does not act on, one per path.

    Args:
        config: a validated config.

    Returns:
        The warnings in schema order (top level first, then sections).
    """
    out = list(_section(config, "", _TOP_LEVEL))
    out += _section(config.resources, "resources.", _RESOURCES)
    out += _section(config.environment, "environment.", _ENVIRONMENT)
    out += _device_maps(config)
    out += _section(config.searcher, "searcher.", _SEARCHER)
    out += _storage(config)
    out += _integrations(config)
    if config.slurm is not None:
        out += _section(config.slurm, "slurm.", _SLURM)
    return out
