"""Bundles: a named, prioritised set of adapter modules that one kind of worker can run (seed 000 §16.1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen
class Bundle:
    """One bundle YAML. Lower priority wins when several bundles can run a model."""

    name: str
    priority: int
    adapters: tuple[str, ...]
    engine: str = "pytorch"
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    raw: Mapping[str, Any] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def is_default(self) -> bool:
        return bool(self.extra.get("default"))

    def runs(self, module: str | None) -> bool:
        """Whether an adapter module is in this bundle."""
        return module is not None and module in self.adapters
