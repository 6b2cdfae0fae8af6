"""cairn's experimental Python APIs, in the shape of Determined's ``determined.experimental``.

- :mod:`cairn.experimental.client`: the SDK (``login``, ``create_experiment``,
  ``get_experiment``, ``Experiment.wait()``, ``Trial.iter_metrics()``, ``Checkpoint.download()``,
  ...), built on the REST API at ``/api/v1``; ``docs/sdk.md`` describes it.
- :mod:`cairn.experimental.core_v2`: the singleton-style Core API (``core_v2.init(config=...)``,
  ``core_v2.train``, ``core_v2.checkpoint``, ...), which is also ``determined.experimental.core_v2``.

Both are imported on first use, so ``import cairn.experimental`` costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn.experimental import client, core_v2

__all__ = ["client", "core_v2"]


def __getattr__(name: str) -> Any:
    """Imports ``client`` or ``core_v2`` when first used."""
    if name not in __all__:
        raise AttributeError(f"module 'cairn.experimental' has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")
