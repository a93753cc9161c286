"""`sie run` settings by role: which role a command line asks for, its flags as setting paths, and the
settings that role refuses because no code of it reads them (a flag or variable is never silently ignored).

Settings of different roles may share a flag: `--host` and `--port` bind each role's own listener.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sie.settings._docs import describe_settings
from sie.settings._load import Settings, SettingsError, load_settings, unrecognised_variables
from sie.settings._spec import ROLES

ROLE_FLAG = "--role"
ROLE_VARIABLE = "SIE_ROLE"
DEFAULT_ROLE = "all"


_DECLARED = describe_settings()


def flag_paths(role: str) -> dict[str, str]:
    """`{flag: setting path}` of every flag `sie run --role ROLE` accepts."""
    return {doc.flag: doc.path for doc in _DECLARED if doc.flag and role in doc.roles}


def _roles_of_flag(flag: str) -> list[str]:
    return [role for role in ROLES if any(doc.flag == flag and role in doc.roles for doc in _DECLARED)]


def _is_boolean(flag: str) -> bool:
    return any(doc.flag == flag and doc.type == "boolean" for doc in _DECLARED)


def _role_flag(arguments: list[str]) -> str | None:
    """The value of `--role` on the command line, lowercased; None when it is not given."""
    for index, argument in enumerate(arguments):
        flag, equals, value = argument.partition("=")
        if flag == ROLE_FLAG:
            given = value if equals else (arguments[index + 1] if index + 1 < len(arguments) else "")
            return given.strip().lower()
    return None


def requested_role(arguments: list[str], environ: Mapping[str, str]) -> str:
    """The role a command line runs: `--role` wins over SIE_ROLE, which wins over `all`."""
    given = _role_flag(arguments)
    if given is not None:
        return given
    return (environ.get(ROLE_VARIABLE) or "").strip().lower() or DEFAULT_ROLE


def parse_flags(arguments: list[str], role: str) -> dict[str, str]:
    """`--flag value`, `--flag=value` and bare boolean `--flag` → `{setting path: text}` for `role`.

    Raises SettingsError naming each unknown flag, each flag of another role and each flag without a value.
    """
    known = flag_paths(role)
    overrides: dict[str, str] = {}
    problems: list[str] = []
    index = 0
    while index < len(arguments):
        flag, equals, value = arguments[index].partition("=")
        if not equals:
            if _is_boolean(flag) and _bare(arguments, index):
                value = "true"
            elif index + 1 < len(arguments):
                index += 1
                value = arguments[index]
            else:
                problems.append(f"option {flag} needs a value")
                break
        if flag in known:
            overrides[known[flag]] = value
        else:
            problems.append(_unknown_flag(flag, role))
        index += 1
    if problems:
        raise SettingsError(problems)
    return overrides


def _bare(arguments: list[str], index: int) -> bool:
    # A boolean flag with no `=value` takes the next argument only when it is not another flag.
    return index + 1 == len(arguments) or arguments[index + 1].startswith("--")


def _unknown_flag(flag: str, role: str) -> str:
    roles = _roles_of_flag(flag)
    if roles:
        return f"option {flag} does not apply to role {role!r}; it is read by role {', '.join(roles)}"
    return f"unknown option {flag!r}; docs/settings.md lists every option and the roles that read it"


def inapplicable_variables(role: str, environ: Mapping[str, str]) -> list[str]:
    """One problem line per `SIE_*` variable set in `environ` whose setting `role` never reads.

    Names outside `SIE_*` (HOSTNAME, POD_NAME) belong to the platform and are never refused.
    """
    problems = []
    for doc in _DECLARED:
        if role in doc.roles:
            continue
        for name in (doc.env, *doc.aliases):
            if name.startswith("SIE_") and (environ.get(name) or "").strip():
                roles = ", ".join(doc.roles)
                problems.append(f"{name} does not apply to role {role!r} (it is read by role {roles}); unset it")
    return problems


def load_role_settings(arguments: list[str], environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of `sie run ARGUMENTS`: the role's flags over the environment over defaults.

    Raises SettingsError listing every problem: bad values, unknown flags and variables, and flags or
    variables that the chosen role does not read.
    """
    source = os.environ if environ is None else environ
    role = requested_role(arguments, source)
    if role not in ROLES:
        # The loader reports a bad role the way it reports any bad value, naming the flag or the variable.
        given = _role_flag(arguments)
        return load_settings(source, {"process.role": given} if given is not None else {})
    problems: list[str] = []
    try:
        overrides = parse_flags(arguments, role)
    except SettingsError as exc:
        problems.extend(exc.problems)
        overrides = {}
    problems.extend(inapplicable_variables(role, source))
    problems.extend(
        f"{name} is not a setting of this version (a typo, or a feature not built yet); unset it"
        for name in unrecognised_variables(source)
    )
    try:
        settings = load_settings(source, overrides)
    except SettingsError as exc:
        problems[:0] = exc.problems
    if problems:
        raise SettingsError(problems)
    return settings
