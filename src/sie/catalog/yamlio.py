"""YAML text in and out (ruamel.yaml, YAML 1.2 safe loader). `load_yaml` is the one way the package reads YAML:
it returns JSON-shaped data only (string keys; str, int, float, bool, null, lists, mappings) and refuses a hostile
document with a ConfigError before it can grow: nesting deeper than MAX_DEPTH (counted through aliases), aliases
that repeat more than MAX_ALIAS_EXPANSION nodes and characters ("billion laughs"), recursive aliases, and values
JSON cannot carry (binary, sets, ordered maps, non-string keys, integers beyond 64 bits). Dates stay text.
"""

from __future__ import annotations

import io
from typing import Any, Final

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.error import YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sie.catalog.errors import ConfigError

# A model config nests about six levels; JSON encoders and our own walkers stay far from their recursion limits.
MAX_DEPTH: Final = 64
# Nodes plus scalar characters that aliases may repeat beyond the text itself: generous for anchors that share
# a profile's settings, tiny next to the hundreds of megabytes a 1 KB alias bomb expands to.
MAX_ALIAS_EXPANSION: Final = 100_000

_TAG = "tag:yaml.org,2002:"
_STRING_KEY_TAGS: Final = frozenset({f"{_TAG}str", f"{_TAG}merge"})
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what JSON encoders (orjson, msgpack) carry as integers
_MAX_INT_TEXT: Final = 200  # longer than any 64-bit literal, even in binary with separators: refused unconverted
_REFUSED_TAGS: Final = ("binary", "set", "omap", "pairs")


class _RefusedYAMLError(Exception):
    """A document this loader will not build; the message says which bound or rule it breaks."""


def _where(node: Node) -> str:
    return f"line {node.start_mark.line + 1}"


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [child for pair in node.value for child in pair]
    return []


def _own_weight(node: Node) -> int:
    return 1 + len(node.value) if isinstance(node, ScalarNode) else 1


def _check_keys(node: Node) -> None:
    if not isinstance(node, MappingNode):
        return
    for key, _value in node.value:
        if not isinstance(key, ScalarNode) or str(key.tag) not in _STRING_KEY_TAGS:
            raise _RefusedYAMLError(f"mapping keys must be strings ({_where(key)}); quote the key")


def _check_graph(root: Node) -> None:
    """Measure the composed node graph once per shared node (iteratively, so depth costs no stack): refuse a
    cycle, an expanded depth over MAX_DEPTH, aliases repeating over MAX_ALIAS_EXPANSION, or non-string keys."""
    measured: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded weight, expanded depth)
    open_nodes: set[int] = set()  # the current path: meeting one again is a recursive alias
    unique_weight = 0
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if expanded:
            open_nodes.discard(key)
            children = [measured[id(child)] for child in _children(node)]
            depth = 1 + max((child_depth for _, child_depth in children), default=0)
            if depth > MAX_DEPTH:
                raise _RefusedYAMLError(f"aliases nest the document deeper than {MAX_DEPTH} levels ({_where(node)})")
            weight = _own_weight(node) + sum(child_weight for child_weight, _ in children)
            measured[key] = (min(weight, 2**62), depth)
            unique_weight += _own_weight(node)
        elif key in open_nodes:
            raise _RefusedYAMLError(f"recursive alias ({_where(node)})")
        elif key not in measured:
            _check_keys(node)
            open_nodes.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in _children(node))
    expansion = measured[id(root)][0] - unique_weight
    if expansion > MAX_ALIAS_EXPANSION:
        raise _RefusedYAMLError(
            f"aliases repeat {expansion} nodes and characters, more than the {MAX_ALIAS_EXPANSION} allowed"
        )


class _BoundedComposer(Composer):
    """ruamel's composer, with the composed graph checked before anything is constructed from it."""

    def compose_document(self) -> Any:
        node = super().compose_document()
        if node is not None:
            _check_graph(node)
        return node


class _PlainConstructor(SafeConstructor):
    """The safe constructor limited to what JSON carries: 64-bit integers, dates kept as their text."""

    def construct_yaml_int(self, node: ScalarNode) -> int:
        value = None if len(node.value) > _MAX_INT_TEXT else super().construct_yaml_int(node)
        if value is None or not _INT_MIN <= value <= _INT_MAX:
            raise _RefusedYAMLError(f"integer {node.value[:40]!r} does not fit in 64 bits ({_where(node)})")
        return value

    def construct_yaml_timestamp(self, node: ScalarNode, values: Any = None) -> str:
        return str(self.construct_scalar(node))

    def refuse_tag(self, node: Node) -> None:
        tag = str(node.tag).replace(_TAG, "!!")
        raise _RefusedYAMLError(f"YAML tag {tag} is not allowed in configs ({_where(node)})")


_PlainConstructor.add_constructor(f"{_TAG}int", _PlainConstructor.construct_yaml_int)
_PlainConstructor.add_constructor(f"{_TAG}timestamp", _PlainConstructor.construct_yaml_timestamp)
for _name in _REFUSED_TAGS:
    _PlainConstructor.add_constructor(f"{_TAG}{_name}", _PlainConstructor.refuse_tag)


def _safe_yaml() -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # keep the author's key order when dumping
    return yaml


def _bounded_yaml() -> YAML:
    yaml = _safe_yaml()
    yaml.Composer = _BoundedComposer
    yaml.Constructor = _PlainConstructor
    yaml.max_depth = MAX_DEPTH  # ruamel stops composing here, before Python's recursion limit
    return yaml


def load_yaml(text: str, source: str = "<yaml>") -> Any:
    """Parse one YAML document into plain JSON-shaped data; a syntax error or a refused document names the source."""
    try:
        return _bounded_yaml().load(text)
    except MaxDepthExceededError as exc:
        raise ConfigError(f"Refused YAML: it nests deeper than {MAX_DEPTH} levels", source=source) from exc
    except _RefusedYAMLError as exc:
        raise ConfigError(f"Refused YAML: {exc}", source=source) from exc
    except YAMLError as exc:
        raise ConfigError(f"Invalid YAML: {exc}", source=source) from exc
    except (ValueError, KeyError, TypeError) as exc:
        # The safe constructor converts tagged scalars with int(), float(), datetime() and a bool table, which
        # raise these for values like `!!int abc`, `!!bool maybe` or a 5000-digit integer.
        raise ConfigError(f"Invalid YAML value: {exc}", source=source) from exc


def dump_yaml(data: Any) -> str:
    """Serialise plain data as block-style YAML, keys in insertion order."""
    stream = io.StringIO()
    _safe_yaml().dump(data, stream)
    return stream.getvalue()
