"""Print the settings reference generated from `sie.settings` as Markdown.

`--write` updates docs/settings.md, the one generated copy (the docs site's Settings page; the README links to it);
`--check` exits 1 when it is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sie.settings import render_settings_markdown

REPO = Path(__file__).resolve().parent.parent
DOC_PATH = REPO / "docs" / "settings.md"


def main(argv: list[str] | None = None) -> int:
    """Print, write or check the settings reference; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {DOC_PATH}")
    action.add_argument("--check", action="store_true", help=f"fail when {DOC_PATH} is stale")
    args = parser.parse_args(argv)
    markdown = render_settings_markdown()
    if args.write:
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(markdown, encoding="utf-8")
        return 0
    if args.check:
        current = DOC_PATH.read_text(encoding="utf-8") if DOC_PATH.exists() else ""
        if current != markdown:
            print("docs/settings.md is stale; run: python scripts/gen_settings_doc.py --write", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
