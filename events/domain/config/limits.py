"""How big a config may be, and the numeric bounds of its fields.

Every bound is far above what a real experiment uses (and what Determined's own examples use),
so that a config a person wrote is never refused, while a hostile one cannot make the API, the
searcher or the scheduler do unbounded work or store numbers other components cannot hold.
"""

from __future__ import annotations

from typing import Any

from events.domain.config.errors import ConfigError, ConfigTooLargeError, join_path
from events.log.limits import largest_part
from events.log.storable import find_unstorable

MAX_CONFIG_CHARS = 1024 * 1024
"""Longest config text (and the most characters of text in an already-parsed config)."""
MAX_CONFIG_NODES = 100_000
"""Most values (scalars, lists, mappings) in a config, after YAML aliases are expanded."""
MAX_CONFIG_DEPTH = 64
"""Deepest nesting of lists and mappings in a config."""

MAX_COUNT = 2**53 - 1
"""Largest integer of any config field without a tighter bound: the largest that every JSON
reader (a browser's included) holds exactly, and far beyond any real length or count."""
MAX_TRIALS = 100_000
"""Most trials of one search (``max_trials``, ``max_concurrent_trials``, grid points, ``count``)."""
MAX_TPE_TRIALS = 1_000
"""Most trials of one ``tpe`` search: each suggestion costs time linear in the trials before it
and the searcher replays every suggestion when it restarts."""
MAX_PBT_ROUNDS = 10_000
"""Most rounds of one ``pbt`` search."""
MAX_SLOTS_PER_TRIAL = 4096
MAX_SLOTS = 1_000_000
"""Largest ``resources.max_slots`` (an experiment-wide cap)."""
MAX_RESTARTS = 10_000
MAX_WEIGHT = 1_000_000.0
MAX_RUNGS = 100
"""Most rungs of an ASHA bracket (``num_rungs``, ``max_rungs``, ``bracket_rungs`` items)."""
MAX_DIVISOR = 1000.0
"""Largest ASHA ``divisor``; with :data:`MAX_RUNGS` the rung arithmetic stays a finite float."""
MAX_HP_INT = 2**63 - 1
"""Largest magnitude of an ``int`` hyperparameter bound (a 64-bit integer, as in Determined)."""
MAX_HP_DOUBLE = 1e300
"""Largest magnitude of a ``double``/``log`` hyperparameter bound: ``maxval - minval`` stays
finite, so sampling never produces an infinity."""
MAX_ID = 2**63 - 1
"""Largest id (``source_trial_id``): a PostgreSQL bigint."""
MAX_PORT = 65535
MAX_PATH_CHARS = 4096
"""Longest path a config may name (Linux's ``PATH_MAX``)."""


def _size(doc: Any) -> tuple[int, int]:
    """Counts values and text characters of ``doc``, stopping once past either limit."""
    nodes = chars = 0
    stack = [doc]
    while stack:
        value = stack.pop()
        nodes += 1
        if isinstance(value, str):
            chars += len(value)
        elif isinstance(value, dict):
            for key, child in value.items():
                chars += len(key) if isinstance(key, str) else 0
                stack.append(child)
        elif isinstance(value, list | tuple):
            stack.extend(value)
        if nodes > MAX_CONFIG_NODES or chars > MAX_CONFIG_CHARS:
            break
    return nodes, chars


def check_size(doc: Any) -> None:
    """Refuses an already-parsed config with too many values or too much text.

    Raises:
        ConfigTooLargeError: Past :data:`MAX_CONFIG_NODES` values or :data:`MAX_CONFIG_CHARS`
            characters of text.
    """
    nodes, chars = _size(doc)
    if nodes > MAX_CONFIG_NODES:
        raise ConfigTooLargeError(
            [("<config>", f"has more than {MAX_CONFIG_NODES} values (lists, mappings, scalars)")]
        )
    if chars > MAX_CONFIG_CHARS:
        part, size = largest_part(doc)
        raise ConfigTooLargeError(
            [
                (
                    part or "<config>",
                    f"is {size} bytes; a config holds at most {MAX_CONFIG_CHARS} characters of text",
                )
            ]
        )


def check_storable(doc: Any) -> None:
    """Refuses a config nested too deeply or holding a value the event log cannot store.

    Raises:
        ConfigError: The path of the first such value: nesting past :data:`MAX_CONFIG_DEPTH`, a
            NUL character or lone surrogate in text, a NaN or infinite number.
    """
    found = find_unstorable(doc, max_depth=MAX_CONFIG_DEPTH, finite=True)
    if found is not None:
        path, message = found
        raise ConfigError([(join_path(path), message)])
