"""Credentials inside a config, masked wherever a config is shown.

The log keeps a config as submitted (a trial needs its storage credentials), so everything that
shows a config to a person (API responses, the event stream, CLI output, logs) shows it through
:func:`mask_secrets`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MASK = "********"
"""What a secret value is shown as."""

_STORAGE_SECRETS = ("access_key", "secret_key", "connection_string", "credential")

SECRET_PATHS: tuple[tuple[str, ...], ...] = (
    *(("checkpoint_storage", key) for key in _STORAGE_SECRETS),
    *(("tensorboard_storage", key) for key in _STORAGE_SECRETS),
    *(
        ("environment", "registry_auth", key)
        for key in ("password", "auth", "identitytoken", "registrytoken")
    ),
    ("integrations", "pachyderm", "dataset", "token"),
)
"""Where a config holds a credential."""

CONFIG_EVENTS = frozenset({"ExperimentSubmitted", "ExperimentContinued", "TemplateSet"})
"""Event types whose payload carries a (possibly partial) config under ``config``."""


def _masked(node: Any, path: tuple[str, ...]) -> Any:
    if not path or not isinstance(node, Mapping) or path[0] not in node:
        return node
    head, rest = path[0], path[1:]
    out = dict(node)
    if rest:
        out[head] = _masked(node[head], rest)
    elif node[head] is not None:
        out[head] = MASK
    return out


def mask_secrets(config: Any) -> Any:
    """A copy of ``config`` with every credential it holds replaced by :data:`MASK`.

    Args:
        config: a config, a partial one (a template), or anything else (returned as is).

    Returns:
        The config with the values at :data:`SECRET_PATHS` masked; the input is not modified.
    """
    for path in SECRET_PATHS:
        config = _masked(config, path)
    return config


def mask_payload(event_type: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """An event payload as it may be shown: a carried config has its credentials masked."""
    out = dict(payload)
    if event_type in CONFIG_EVENTS and "config" in out:
        out["config"] = mask_secrets(out["config"])
    return out
