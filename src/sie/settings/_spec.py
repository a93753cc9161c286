"""How a settings field is declared: its environment variable, parser, CLI flag, one-line doc, the roles
that read it and the modules that read it.

Group classes declare every field once with `setting(Env(...), default)`; the loader, the flag parser and
the docs generator read the same attrs metadata back, so there is no second list to keep in step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from sie.settings._parsers import Parser

# Every role `sie run --role` starts (`all` runs gateway, sidecar and worker in one process).
ROLES = ("gateway", "config", "sidecar", "worker", "all")
SPEC_KEY = "sie.settings.spec"
FACTORY_KEY = "sie.settings.factory"
TITLE_KEY = "sie.settings.title"

# A default computed from the environment the loader was given (host names, cache directories).
DefaultFactory = Callable[[Mapping[str, str]], Any]


def _derive_flag(env: str) -> str:
    return "--" + env.removeprefix("SIE_").lower().replace("_", "-")


@attrs.frozen
class Env:
    """Where one setting comes from, who reads it and how it is documented.

    `flag` defaults to the variable without `SIE_`, lowercased and dashed; `None` means no flag (secrets).
    Settings of different roles may share a flag (`--port` is the gateway's, the config service's or the
    sidecar's probe port, by role). `aliases` are older or compatible names read, in order, when `name` is
    unset. `roles` are the roles whose code reads the setting: any other role refuses it. `read_by` names
    the modules that read it, so a test can prove that no declared setting is inert.
    """

    name: str
    parse: Parser
    doc: str
    flag: str | None = attrs.field()
    aliases: tuple[str, ...] = ()
    shown_default: str | None = None
    secret: bool = False
    roles: tuple[str, ...] = attrs.field(
        kw_only=True, validator=attrs.validators.deep_iterable(attrs.validators.in_(ROLES))
    )
    read_by: tuple[str, ...] = attrs.field(kw_only=True, validator=attrs.validators.min_len(1))

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
