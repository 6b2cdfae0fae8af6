"""The experiment config schema (Determined-compatible), its parser and its errors."""

from __future__ import annotations

from events.domain.config.common import Length
from events.domain.config.errors import ConfigError, ConfigTooLargeError
from events.domain.config.hyperparameters import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    Hyperparameter,
    Hyperparameters,
    IntHP,
    LeafHP,
    LogHP,
)
from events.domain.config.ignored import ConfigWarning
from events.domain.config.loading import parse_config
from events.domain.config.models import (
    AzureStorage,
    BindMount,
    CheckpointStorage,
    ClusterDefaultStorage,
    DirectoryStorage,
    EnvironmentConfig,
    ExperimentConfig,
    GCSStorage,
    LogPolicy,
    ReproducibilityConfig,
    ResourcesConfig,
    S3Storage,
    SharedFSStorage,
)
from events.domain.config.overrides import apply_overrides
from events.domain.config.safe_yaml import dump_yaml, load_yaml
from events.domain.config.searcher import (
    AdaptiveASHASearcher,
    AsyncHalvingSearcher,
    CustomSearcher,
    GridSearcher,
    HalvingSearcher,
    PBTSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
    TPESearcher,
)

__all__ = [
    "AdaptiveASHASearcher",
    "AsyncHalvingSearcher",
    "AzureStorage",
    "BindMount",
    "CategoricalHP",
    "CheckpointStorage",
    "ClusterDefaultStorage",
    "ConfigError",
    "ConfigTooLargeError",
    "ConfigWarning",
    "ConstHP",
    "CustomSearcher",
    "DirectoryStorage",
    "DoubleHP",
    "EnvironmentConfig",
    "ExperimentConfig",
    "GCSStorage",
    "GridSearcher",
    "HalvingSearcher",
    "Hyperparameter",
    "Hyperparameters",
    "IntHP",
    "LeafHP",
    "Length",
    "LogHP",
    "LogPolicy",
    "PBTSearcher",
    "RandomSearcher",
    "ReproducibilityConfig",
    "ResourcesConfig",
    "S3Storage",
    "SearcherConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "TPESearcher",
    "apply_overrides",
    "dump_yaml",
    "load_yaml",
    "parse_config",
]
