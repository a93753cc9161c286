"""How a settings field is declared: its environment variable, parser, CLI flag and one-line doc.

Group classes declare every field once with `setting(Env(...), default)`; the loader and the docs
generator read the same attrs metadata back, so there is no second list to keep in step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from sie.settings._parsers import Parser

SPEC_KEY = "sie.settings.spec"
FACTORY_KEY = "sie.settings.factory"
TITLE_KEY = "sie.settings.title"

# A default computed from the environment the loader was given (host names, cache directories).
DefaultFactory = Callable[[Mapping[str, str]], Any]


def _derive_flag(env: str) -> str:
    return "--" + env.removeprefix("SIE_").lower().replace("_", "-")


@attrs.frozen
class Env:
    """Where one setting comes from and how it is documented.

    `flag` defaults to the variable without `SIE_`, lowercased and dashed; `None` means no flag (secrets).
    `aliases` are older or compatible names read, in order, when `name` is unset.
    """

    name: str
    parse: Parser
    doc: str
    flag: str | None = attrs.field()
    aliases: tuple[str, ...] = ()
    shown_default: str | None = None
    secret: bool = False

    @flag.default
    def _flag_from_name(self) -> str:
        return _derive_flag(self.name)


def _mask(value: object) -> str:
    return "'***'" if value else repr(value)


def setting(spec: Env, default: Any = attrs.NOTHING, *, factory: DefaultFactory | None = None) -> Any:
    """Declare one field of a settings group; `factory` computes the default from the environment."""
    metadata = {SPEC_KEY: spec, FACTORY_KEY: factory}
    shown: Any = _mask if spec.secret else True
    if factory is not None:
        return attrs.field(factory=lambda: factory(os.environ), metadata=metadata, repr=shown)
    return attrs.field(default=default, metadata=metadata, repr=shown)


def group(cls: type, title: str) -> Any:
    """Declare one settings group inside `Settings`, with the title its docs section carries."""
    return attrs.field(factory=cls, metadata={TITLE_KEY: title})
