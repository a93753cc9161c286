"""`sie run` settings by role: which role a command line asks for, its flags as setting paths, and what the role
does with what it does not read. A flag it does not read is refused (it was typed for this process), and so is an
`SIE_*` variable that is no setting at all (a typo: the closest setting is suggested). An `SIE_*` variable that is
a setting of another role only is ignored and named once at start-up: a shared environment (a Compose `env_file`,
a shell with several roles' variables exported) must not stop a role.

Settings of different roles may share a flag: `--host` and `--port` bind each role's own listener.
"""

from __future__ import annotations

import difflib
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


def _foreign_names(role: str, environ: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """`{name: roles that read it}` for each `SIE_*` variable set in `environ` whose setting `role` never reads.
    Names outside `SIE_*` (HOSTNAME, POD_NAME) belong to the platform and are never among them."""
    foreign = {}
    for doc in _DECLARED:
        if role in doc.roles:
            continue
        for name in (doc.env, *doc.aliases):
            if name.startswith("SIE_") and (environ.get(name) or "").strip():
                foreign[name] = doc.roles
    return foreign


def ignored_variables(role: str, environ: Mapping[str, str] | None = None) -> list[str]:
    """`NAME (read by role a, b)` for each `SIE_*` variable set in `environ` (default: the process environment) whose
    setting `role` never reads: the role ignores them (its settings keep their defaults)."""
    source = os.environ if environ is None else environ
    return [f"{name} (read by role {', '.join(roles)})" for name, roles in _foreign_names(role, source).items()]


def ignored_variables_note(role: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The one start-up log line naming the variables `role` ignores, or None when there are none."""
    ignored = ignored_variables(role, environ)
    if not ignored:
        return None
    return f"role {role!r} ignores settings of other roles set in its environment: {'; '.join(ignored)}"


def _unknown_variable(name: str) -> str:
    known = [doc.env for doc in _DECLARED] + [alias for doc in _DECLARED for alias in doc.aliases]
    closest = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {closest[0]}?" if closest else ""
    return f"{name} is not a setting of this version (a typo, or a feature not built yet); unset it{hint}"


def load_role_settings(arguments: list[str], environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of `sie run ARGUMENTS`: the role's flags over the environment over defaults.

    Raises SettingsError listing every problem: bad values, unknown flags and variables, and flags that the chosen
    role does not read. Variables of other roles are not problems (`ignored_variables_note` names them).
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
    problems.extend(_unknown_variable(name) for name in unrecognised_variables(source))
    foreign = _foreign_names(role, source)
    own = {name: value for name, value in source.items() if name not in foreign}  # the others are ignored, not read
    try:
        settings = load_settings(own, overrides)
    except SettingsError as exc:
        problems[:0] = exc.problems
    if problems:
        raise SettingsError(problems)
    return settings
