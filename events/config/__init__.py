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
from events.config.loading import parse_config
from events.config.models import (
    BindMount,
    CheckpointStorage,
    DirectoryStorage,
    EnvironmentConfig,
    ExperimentConfig,
    ReproducibilityConfig,
    ResourcesConfig,
    SharedFSStorage,
)
from events.config.overrides import apply_overrides
from events.config.safe_yaml import dump_yaml, load_yaml
from events.config.searcher import (
    AdaptiveASHASearcher,
    AsyncHalvingSearcher,
    GridSearcher,
    HalvingSearcher,
    RandomSearcher,
    SearcherConfig,
    SingleSearcher,
)

__all__ = [
    "AdaptiveASHASearcher",
    "AsyncHalvingSearcher",
    "BindMount",
    "CategoricalHP",
    "CheckpointStorage",
    "ConfigError",
    "ConfigTooLargeError",
    "ConstHP",
    "DirectoryStorage",
    "DoubleHP",
    "EnvironmentConfig",
    "ExperimentConfig",
    "GridSearcher",
    "HalvingSearcher",
    "Hyperparameter",
    "Hyperparameters",
    "IntHP",
    "LeafHP",
    "Length",
    "LogHP",
    "RandomSearcher",
    "ReproducibilityConfig",
    "ResourcesConfig",
    "SearcherConfig",
    "SharedFSStorage",
    "SingleSearcher",
    "apply_overrides",
    "dump_yaml",
    "load_yaml",
    "parse_config",
]
