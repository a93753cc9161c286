"""The text of `sie run --help`: the roles, then every flag grouped by settings concern, with its type, default
and the roles that read it; `sie run --role ROLE --help` lists only that role's flags.

Drawn from the settings declarations (`describe_settings`), the same source as docs/settings.md, so the two
never disagree. Plain text, so it reads the same in a terminal, a pipe and a container log.
"""

from __future__ import annotations

import textwrap
from typing import Final

from sie.settings import ROLES, SettingDoc, describe_groups, describe_settings

ROLE_SUMMARIES: Final = {
    "gateway": "the HTTP API: routes each request to a lane, publishes its work, collects the results",
    "config": "the config service: the only writer of model configuration",
    "sidecar": "consumes one lane: admission, tokenization, batching, dispatch to the worker",
    "worker": "loads ONNX models and runs the sidecar's batches (no HTTP)",
    "all": "gateway, sidecar and worker in one process, no NATS needed (the default)",
}
_WIDTH: Final = 100
_INDENT: Final = "      "


def render_run_help(role: str | None) -> str:
    """`sie run --help` with every role's flags (role None), or `sie run --role ROLE --help` with ROLE's."""
    chosen = [doc for doc in describe_settings() if doc.flag and (role is None or role in doc.roles)]
    sections = [_usage(role), _roles()]
    for group in describe_groups():
        rows = [_flag(doc, show_roles=role is None) for doc in chosen if doc.group == group.name]
        if rows:
            sections.append(f"{group.title}:\n" + "\n".join(rows))
    return "\n\n".join(sections) + "\n"


def _usage(role: str | None) -> str:
    scope = "every flag, with the roles that read it" if role is None else f"the flags of role {role!r}"
    lines = [
        "Usage: sie run [--role ROLE] [--FLAG VALUE | --FLAG=VALUE ...]",
        "",
        "Run one SIE role. A flag wins over its SIE_* variable, which wins over the default; a flag the role does",
        "not read, or an SIE_* variable that is no setting, is refused (exit status 2); SIE_* variables of other",
        "roles are ignored and named at start-up. Boolean flags take --flag or --flag=false.",
        f"Below: {scope}; docs/settings.md lists them too.",
    ]
    return "\n".join(lines)


def _roles() -> str:
    width = max(map(len, ROLES))
    return "Roles:\n" + "\n".join(f"  {name.ljust(width)}  {ROLE_SUMMARIES[name]}" for name in ROLES)


def _flag(doc: SettingDoc, *, show_roles: bool) -> str:
    facts = [doc.type, f"default {doc.default}", f"env {doc.env}"]
    if show_roles:
        facts.append("every role" if len(doc.roles) == len(ROLES) else "roles: " + ", ".join(doc.roles))
    heading = f"  {doc.flag}  ({'; '.join(facts)})"
    body = textwrap.fill(doc.doc, _WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT)
    return f"{heading}\n{body}"
