"""The docs: README.md is the landing page, docs/ the site (mkdocs.yml). The settings page is current, every page is in
the nav, README's links resolve, no page points at work items or files outside this repository, and the site builds
with --strict."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))

# What a page for users of this repository never says: numbered work items and the planning documents, seeds and
# contracts they cite, which live outside the repository.
INTERNAL = [
    re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    re.compile(r"\bwave[- ]?(\d|one|two|three)\b|\b(first|second|third) wave\b", re.IGNORECASE),
    re.compile(r"\bseeds? 0\d\d\b", re.IGNORECASE),
    re.compile(r"\bseeds/", re.IGNORECASE),
    re.compile(r"\.\./shared"),
    re.compile(r"\b(DESIGN|STYLE|contracts)\.md\b", re.IGNORECASE),
    re.compile(r"\bcontracts [A-Z]\b"),
    re.compile(r"§\s?\d"),
]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


class _NavLoader(yaml.SafeLoader):
    """mkdocs.yml as data: any `!!python/...` tag a Markdown extension's option may carry reads as null."""


_NavLoader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in _nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def _slug(heading: str) -> str:
    """The anchor GitHub and mkdocs' toc both give a heading of plain words (backticks and punctuation dropped)."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[ ]+", "-", text).strip("-")


def _anchors(markdown: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return {_slug(match) for match in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


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


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    config = yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_NavLoader)
    assert config["docs_dir"] == "docs"
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"
    assert sorted(nav) == PAGES, (
        f"left out of the nav: {sorted(set(PAGES) - set(nav))}; not a page: {sorted(set(nav) - set(PAGES))}"
    )


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{page}" for page in PAGES)])
def test_pages_cite_no_work_items_or_files_outside_the_repository(page: str) -> None:
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    found = [
        f"{page}:{number}: {line.strip()}"
        for number, line in enumerate(lines, 1)
        if any(p.search(line) for p in INTERNAL)
    ]
    assert not found, "speak to a user of this repository instead:\n" + "\n".join(found)


def test_readme_links_resolve() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [target for target in LINK.findall(readme) if not re.match(r"[a-z]+:", target)]
    assert targets, "the README links to no page"
    broken = []
    for target in targets:
        path, _, fragment = target.partition("#")
        file = (REPO / path) if path else REPO / "README.md"
        if not file.resolve().is_relative_to(REPO) or not file.is_file():
            broken.append(f"{target}: no such file in the repository")
        elif fragment and file.suffix == ".md" and fragment not in _anchors(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, "\n".join(broken)


@pytest.mark.timeout(120)
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the `docs` extra (mkdocs) is not installed")
def test_docs_site_builds_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml")]
        + ["--site-dir", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "status-page.png").is_file()
