"""Docs generated from code stay current: the settings tables in docs/settings.md and README.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_settings_tables_are_current(repo_root: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(repo_root / "scripts" / "gen_settings_doc.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_readme_shows_the_two_commands_first(repo_root: Path) -> None:
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    first_block = readme.split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "run"], ["make", "test"]]
