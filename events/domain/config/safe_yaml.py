"""The one YAML reader of user configs: safe, YAML 1.2 floats, and bounded.

A YAML alias refers to an anchored node instead of repeating it, so a few hundred bytes of nested
aliases ("billion laughs") describe a document of billions of values; validating or storing it
expands them all. The loader here counts every value the document expands to while it composes
the node graph, and refuses the document once that count, its nesting or its text length passes
the limits in :mod:`events.domain.config.limits`, before anything is built from it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.error import MarkedYAMLError
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import Node, ScalarNode

from events.domain.config.errors import ConfigError, ConfigTooLargeError
from events.domain.config.limits import (
    MAX_CONFIG_CHARS,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    check_size,
)

MAX_INT_CHARS = 100
"""Longest integer scalar; longer ones (past every bound anyway) are refused unparsed."""


class _LimitError(MarkedYAMLError):
    """The document is past a limit: nesting, alias expansion, a self-referring alias or an
    overlong integer."""


class _TooManyNodesError(_LimitError):
    """The document has more values than allowed, without counting alias expansions."""


class _Loader(yaml.SafeLoader):
    """Safe loader that reads ``1e-4`` as a float (as YAML 1.2 and Determined do) and refuses
    documents past the size, nesting and alias-expansion limits."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        # Values the document expands to so far (an alias adds its anchor's expanded size).
        self._values = 0
        # Open lists/mappings around the node being composed, and the deepest level reached.
        self._depth = 0
        self._deepest = 0
        # Per anchored node: (expanded values, expanded height); absent while it is composed.
        self._expanded: dict[int, tuple[int, int]] = {}

    def _count(self, values: int, mark: Any, alias: str | None) -> None:
        self._values += values
        if self._values <= MAX_CONFIG_NODES:
            return
        if alias is not None:
            raise _LimitError(
                None,
                None,
                f"alias *{alias} makes the document expand to more than {MAX_CONFIG_NODES} values",
                mark,
            )
        raise _TooManyNodesError(
            None, None, f"the document has more than {MAX_CONFIG_NODES} values", mark
        )

    def _reach(self, depth: int, mark: Any, alias: str | None) -> None:
        self._deepest = max(self._deepest, depth)
        if depth > MAX_CONFIG_DEPTH:
            via = f" (through alias *{alias})" if alias is not None else ""
            raise _LimitError(
                None, None, f"nested more than {MAX_CONFIG_DEPTH} levels deep{via}", mark
            )

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        """Composes one node as PyYAML does, counting values, nesting and alias expansions."""
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]
        mark: Any = event.start_mark
        if isinstance(event, AliasEvent):
            node = super().compose_node(parent, index)
            expanded = self._expanded.get(id(node))
            if expanded is None:
                raise _LimitError(
                    None,
                    None,
                    f"alias *{event.anchor} refers to a collection that contains it",
                    mark,
                )
            values, height = expanded
            self._reach(self._depth + height, mark, event.anchor)
            self._count(values, mark, event.anchor)
            return node
        collection = isinstance(event, SequenceStartEvent | MappingStartEvent)
        level = self._depth + collection  # the nesting level this node itself reaches
        self._reach(level, mark, None)
        self._count(1, mark, None)
        before_values, before_deepest = self._values, self._deepest
        self._deepest = self._depth = level
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= collection
        if event.anchor is not None:
            height = self._deepest - self._depth
            self._expanded[id(node)] = (self._values - before_values + 1, height)
        self._deepest = max(self._deepest, before_deepest)
        return node

    def construct_yaml_int(self, node: ScalarNode) -> int:
        """An integer scalar; one longer than :data:`MAX_INT_CHARS` is refused unparsed."""
        if isinstance(node.value, str) and len(node.value) > MAX_INT_CHARS:
            raise _LimitError(
                None, None, f"integer longer than {MAX_INT_CHARS} characters", node.start_mark
            )
        value: int = super().construct_yaml_int(node)
        return value


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


class _Dumper(yaml.SafeDumper):
    """Safe dumper that quotes strings :class:`_Loader` would read as floats (``'1e5'``)."""


_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
for _cls in (_Loader, _Dumper):
    _cls.yaml_implicit_resolvers = {
        key: list(value) for key, value in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))


def dump_yaml(data: Any) -> str:
    """YAML text that :func:`load_yaml` reads back as ``data`` (keys in the given order)."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


_PARSE_AT_MOST = 4 * MAX_CONFIG_CHARS
"""Longer text is refused unread; text up to this is parsed (within the node limits) so that a
refusal can name the part of the config that makes it too large."""


def load_yaml(text: str, source: str = "<config>") -> Any:
    """Parses YAML text safely, within the config limits.

    Args:
        text: The YAML document.
        source: Where it came from, the path of every error (a file name, ``<config>``).

    Raises:
        ConfigTooLargeError: The text is longer than :data:`MAX_CONFIG_CHARS` or holds more than
            :data:`MAX_CONFIG_NODES` values.
        ConfigError: The text is not valid YAML, nests deeper than :data:`MAX_CONFIG_DEPTH`, or
            its aliases expand past :data:`MAX_CONFIG_NODES` values; the message gives line and
            column.
    """
    too_long = ConfigTooLargeError(
        [(source, f"is {len(text)} characters long, more than {MAX_CONFIG_CHARS}")]
    )
    if len(text) > _PARSE_AT_MOST:
        raise too_long
    try:
        doc = yaml.load(text, Loader=_Loader)
        if len(text) > MAX_CONFIG_CHARS:
            check_size(doc)  # names the part that makes it large, if one does
            raise too_long
        return doc
    except _TooManyNodesError as exc:
        raise ConfigTooLargeError([(source, f"{_where(exc)}{exc.problem}")]) from None
    except _LimitError as exc:
        raise ConfigError([(source, f"{_where(exc)}{exc.problem}")]) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([(source, f"invalid YAML: {_where(exc)}{problem}")]) from None
