"""Determined's top-level package, as cairn provides it to training code (``cairn.compat``).

``import determined as det`` gives Determined's public names, each cairn's own object:
``det.core`` (``cairn.core``), ``det.get_cluster_info``, ``det.ClusterInfo``, ``det.TrialInfo``,
``det.InvalidHP``, ``det.LOG_FORMAT``, ``det.__version__``, and the subpackages
``determined.launch`` and ``determined.experimental`` (``client``, ``core_v2``).

If a real ``determined`` lies further along ``sys.path``, this module loads that one in its
place, so cairn's mapping never shadows an installed Determined.
"""

from __future__ import annotations

import sys

from cairn.compat import real_determined_spec

_real = real_determined_spec()
if _real is not None and _real.loader is not None:
    import importlib.util

    _module = importlib.util.module_from_spec(_real)
    sys.modules[__name__] = _module
    _real.loader.exec_module(_module)
else:
    from cairn import LOG_FORMAT, __version__
    from cairn.core import ClusterInfo, InvalidHP, TrialInfo, get_cluster_info
    from determined import core

    __all__ = [
        "LOG_FORMAT",
        "ClusterInfo",
        "InvalidHP",
        "TrialInfo",
        "__version__",
        "core",
        "get_cluster_info",
    ]
