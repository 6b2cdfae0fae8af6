"""``determined.core`` is ``cairn.core``: the same module object, under Determined's name."""

import sys

import cairn.core

sys.modules[__name__] = cairn.core
