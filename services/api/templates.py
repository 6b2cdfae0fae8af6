"""Config templates, folded from their streams (``template-<name>``).

A template is a partial experiment config; ``TemplateSet`` creates or replaces it and
``TemplateRemoved`` removes it. Every user may read every template (they are shared defaults, as
in Determined); only the user who created one, or an admin, may replace or remove it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from events.domain.config import ConfigError, ExperimentConfig
from events.domain.config.merge import merge_under
from events.domain.config.secrets import mask_secrets
from events.domain.types import TemplateRemoved, TemplateSet
from events.log.store import EventStore
from services.api.errors import bad_request, not_found
from services.api.parsing import yaml_off_loop
from services.api.views import Reader, read_facts

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$", re.ASCII)
"""What a template's name looks like (it is part of a stream id)."""
FACTS = ("TemplateSet", "TemplateRemoved")


@dataclass
class TemplateView:
    """A template's stream folded."""

    name: str
    version: int = 0
    exists: bool = False
    owner: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    updated_at: datetime | None = None

    def describe(self) -> dict[str, Any]:
        """The template as the API shows it."""
        return {
            "name": self.name,
            "owner": self.owner,
            "config": mask_secrets(self.config),
            "updated_at": self.updated_at.isoformat() if self.updated_at else None,
        }


def stream_of(name: str) -> str:
    """The stream id of template ``name``."""
    return f"template-{name}"


def check_name(name: str) -> str:
    """``name`` if it is a valid template name; otherwise a 400 naming the field ``name``."""
    if not NAME.match(name):
        raise bad_request(
            "name: a template name is 1 to 100 letters, digits, '_' or '-', starting with a "
            "letter or digit",
            path="name",
        )
    return name


async def load_template(reader: Reader, name: str) -> TemplateView:
    """The template's stream folded (``exists`` is false for an unknown or removed one)."""
    view = TemplateView(name)
    if not NAME.match(name):
        return view
    events, view.version = await read_facts(reader, stream_of(name), FACTS)
    for recorded in events:
        fact = recorded.decode()
        if isinstance(fact, TemplateSet):
            view.exists = True
            view.owner = view.owner or fact.owner
            view.config = dict(fact.config)
            view.updated_at = recorded.recorded_at
        elif isinstance(fact, TemplateRemoved):
            view.exists = False
            view.owner = ""
            view.config = {}
            view.updated_at = recorded.recorded_at
    return view


async def existing_template(reader: Reader, name: str) -> TemplateView:
    """The template, or a 404."""
    view = await load_template(reader, name)
    if not view.exists:
        raise not_found(f"no template {name!r}")
    return view


async def list_templates(store: EventStore) -> list[dict[str, Any]]:
    """Every template that exists, by name (the latest fact of each template stream)."""
    out = []
    for recorded in await store.latest_per_stream("template-", FACTS):
        if recorded.type != "TemplateSet":
            continue
        name = recorded.stream_id.removeprefix("template-")
        out.append((await load_template(store, name)).describe())
    return sorted(out, key=lambda t: str(t["name"]))


def check_partial_config(config: dict[str, Any], prefix: str = "config") -> None:
    """A 400 naming the first top-level key a template may not hold (not a config field)."""
    known = set(ExperimentConfig.model_fields)
    for key in config:
        if key not in known:
            raise bad_request(
                f"{prefix}.{key}: not an experiment config field", path=f"{prefix}.{key}"
            )


async def with_template(
    reader: Reader, name: str, config: str | dict[str, Any]
) -> str | dict[str, Any]:
    """The experiment's config (YAML text or a mapping) merged over template ``name`` (the
    experiment's values win); 400 naming ``template`` when there is no such template.

    YAML that does not parse, or is no mapping, is returned as it is for the config's own
    validation to report. The YAML is parsed off the event loop.
    """
    template = await load_template(reader, name)
    if not template.exists:
        raise bad_request(f"template: no template {name!r}", path="template")
    doc: Any = config
    if isinstance(config, str):
        try:
            doc = await yaml_off_loop(config)
        except ConfigError:
            return config
    if not isinstance(doc, dict):
        return config
    return merge_under(template.config, doc)
