"""`sie run --help` through the CLI: the roles, and each role's flags grouped by concern."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from sie.cli.main import app
from sie.settings import ROLES, describe_groups, describe_settings, flag_paths

runner = CliRunner()
FLAG_LINE = re.compile(r"^  (--[a-z0-9-]+)  \((.*)\)$", re.MULTILINE)


def _flag_lines(output: str) -> list[tuple[str, str]]:
    return FLAG_LINE.findall(output)


def test_help_lists_every_role_and_every_flag_with_its_roles() -> None:
    result = runner.invoke(app, ["run", "--help"])
    assert result.exit_code == 0, result.output
    roles_block = result.output.split("Roles:\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split()[0] for line in roles_block.splitlines()] == list(ROLES)
    listed = _flag_lines(result.output)
    declared = [doc for doc in describe_settings() if doc.flag]
    assert [flag for flag, _ in listed] == [doc.flag for doc in declared]
    for (_, facts), doc in zip(listed, declared, strict=True):
        expected = "every role" if len(doc.roles) == len(ROLES) else "roles: " + ", ".join(doc.roles)
        assert facts.endswith(expected) and f"env {doc.env}" in facts


def test_flags_are_grouped_under_their_settings_group() -> None:
    output = runner.invoke(app, ["run", "--help"]).output
    titles = [group.title for group in describe_groups()]
    headings = [line[:-1] for line in output.splitlines() if line[:-1] in titles and line.endswith(":")]
    assert headings == titles
    nats_section = output.split("\nNATS:\n", 1)[1].split("\n\n", 1)[0]
    nats_flags = [doc.flag for doc in describe_settings() if doc.group == "nats" and doc.flag]
    assert [flag for flag, _ in _flag_lines(nats_section)] == nats_flags


@pytest.mark.parametrize("role", ROLES)
def test_role_help_lists_exactly_the_flags_the_role_accepts(role: str) -> None:
    result = runner.invoke(app, ["run", "--role", role, "--help"])
    assert result.exit_code == 0, result.output
    listed = _flag_lines(result.output)
    assert sorted({flag for flag, _ in listed}) == sorted(flag_paths(role))
    assert not any("roles:" in facts or "every role" in facts for _, facts in listed)


def test_help_for_an_unknown_role_is_refused() -> None:
    result = runner.invoke(app, ["run", "--role=nope", "-h"])
    assert result.exit_code == 2
    assert "no role 'nope'" in result.output
