"""The experiment config schema (Determined-compatible), its parser and its errors."""

from __future__ import annotations

from events.config.common import Length
from events.config.errors import ConfigError, ConfigTooLargeError
from events.config.hyperparameters import (
    CategoricalHP,
    ConstHP,
    DoubleHP,
    Hyperparameter,
    Hyperparameters,
    IntHP,
    LeafHP,
    LogHP,
)
from events.config.ignored import ConfigWarning
from events.config.loading import parse_config
from events.config.models import (
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
from events.config.overrides import apply_overrides
from events.config.safe_yaml import dump_yaml, load_yaml
from events.config.searcher import (
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
