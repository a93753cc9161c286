"""YAML text in and out (ruamel.yaml, YAML 1.2 safe loader); parse errors become ConfigErrors."""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from sie.catalog.errors import ConfigError


def _safe_yaml() -> YAML:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False  # keep the author's key order when dumping
    return yaml


def load_yaml(text: str, source: str = "<yaml>") -> Any:
    """Parse one YAML document into plain dicts/lists/scalars; a syntax error names the source."""
    try:
        return _safe_yaml().load(text)
    except YAMLError as exc:
        raise ConfigError(f"Invalid YAML: {exc}", source=source) from exc


def dump_yaml(data: Any) -> str:
    """Serialise plain data as block-style YAML, keys in insertion order."""
    stream = io.StringIO()
    _safe_yaml().dump(data, stream)
    return stream.getvalue()
