"""cairn: what users import and run (CLI, Core API, local cluster launcher).

Training code written for Determined ports by changing its import line to ``import cairn as det``:
``det.core.init()``, ``det.get_cluster_info()``, ``det.ClusterInfo``, ``det.TrialInfo``,
``det.InvalidHP`` and ``det.LOG_FORMAT`` behave as Determined's do.

The Core API is loaded on first use of one of those names, so ``import cairn`` (which the CLI does
on every command) stays cheap; ``det.core`` works right after ``import cairn as det``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn import core
    from cairn.core import ClusterInfo, InvalidHP, TrialInfo, get_cluster_info

__version__ = "0.1.0"

#: A ``logging`` format for training code: ``logging.basicConfig(format=det.LOG_FORMAT)``.
#: The level leads each line so shipped trial logs can be filtered by it.
LOG_FORMAT = "%(levelname)s: [%(process)d] %(name)s: %(message)s"

# Top-level name -> the cairn.core attribute it stands for (None: the module itself).
_CORE_NAMES: dict[str, str | None] = {
    "core": None,
    "ClusterInfo": "ClusterInfo",
    "TrialInfo": "TrialInfo",
    "InvalidHP": "InvalidHP",
    "get_cluster_info": "get_cluster_info",
}

__all__ = [
    "LOG_FORMAT",
    "ClusterInfo",
    "InvalidHP",
    "TrialInfo",
    "__version__",
    "core",
    "get_cluster_info",
]


def __getattr__(name: str) -> Any:
    """Loads the Core API when one of its top-level names is first used."""
    if name not in _CORE_NAMES:
        raise AttributeError(f"module 'cairn' has no attribute {name!r}")
    module = importlib.import_module("cairn.core")
    attribute = _CORE_NAMES[name]
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_CORE_NAMES))
