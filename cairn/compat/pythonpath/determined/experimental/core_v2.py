"""``determined.experimental.core_v2`` is ``cairn.experimental.core_v2``: one module object, so
``core_v2.train``, ``core_v2.info``, ... set by ``init()`` are the same under both names."""

import sys

import cairn.experimental.core_v2

sys.modules[__name__] = cairn.experimental.core_v2
