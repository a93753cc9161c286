"""The environment of a child `sie run --role ROLE` that must run with this process's settings: the flags this
process was given reach the child as the variables they stand for, so the child needs no command line of its own.
And the environment `sie run` re-executes itself in for malloc's huge pages (SIE_MALLOC_HUGE_PAGES).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Final

import attrs

from sie.settings._load import Settings, SettingsError
from sie.settings._spec import SPEC_KEY, Env


def child_environment(
    settings: Settings,
    role: str,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """`environ` (default: this process's) with every setting `role` reads written as its variable, the value
    taken from `overrides` (keyed by field path, e.g. `worker.devices`) where given, else from `settings`.

    Aliases are dropped; a None or empty value removes the variable, which the child reads as the default.
    """
    given = dict(overrides or {})
    child = dict(os.environ if environ is None else environ)
    for group_field in attrs.fields(Settings):
        values = getattr(settings, group_field.name)
        for field in attrs.fields(group_field.type):
            spec: Env = field.metadata[SPEC_KEY]
            path = f"{group_field.name}.{field.name}"
            if role not in spec.roles:
                if path in given:
                    raise SettingsError([f"{path} is not read by role {role!r}; a child of that role ignores it"])
                continue
            for name in (spec.name, *spec.aliases):
                child.pop(name, None)
            value = given.pop(path) if path in given else getattr(values, field.name)
            if value is not None and value != ():
                child[spec.name] = spec.parse.render(value)
    if given:
        raise SettingsError([f"unknown setting {path!r} in a child's overrides" for path in sorted(given)])
    return child


# The glibc tunable that makes malloc advise transparent huge pages for what it maps (glibc 2.35+; older ones ignore
# it), and the environment variable glibc reads tunables from, once, as a process starts.
HUGE_PAGES_TUNABLE: Final = "glibc.malloc.hugetlb=1"
TUNABLES_VARIABLE: Final = "GLIBC_TUNABLES"


# The roles SIE_MALLOC_HUGE_PAGES=auto turns huge pages on for: the one that only runs models.
HUGE_PAGES_ROLES: Final = ("worker",)


def wants_huge_pages(setting: str, role: str) -> bool:
    """Whether a process of `role` asks malloc for huge pages under SIE_MALLOC_HUGE_PAGES `setting`."""
    return setting == "on" or (setting == "auto" and role in HUGE_PAGES_ROLES)


def huge_pages_environment(libc: str, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment (default: this process's) to re-execute in so that malloc uses huge pages: GLIBC_TUNABLES
    with HUGE_PAGES_TUNABLE added to what it holds. None when there is nothing to do: the C library is not glibc
    (`libc`, as `platform.libc_ver` names it), or a `glibc.malloc.hugetlb` value is set already (the re-executed
    process itself, or the operator's own choice, which is kept)."""
    environ = os.environ if environ is None else environ
    tunables = environ.get(TUNABLES_VARIABLE, "")
    if libc != "glibc" or "glibc.malloc.hugetlb=" in tunables:
        return None
    return {**environ, TUNABLES_VARIABLE: f"{tunables}:{HUGE_PAGES_TUNABLE}" if tunables else HUGE_PAGES_TUNABLE}
