"""``determined.experimental.client`` is ``cairn.experimental.client``."""

import sys

import cairn.experimental.client

sys.modules[__name__] = cairn.experimental.client
