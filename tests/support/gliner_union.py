"""The GLiNER union's reference: the `gliner` package run on every word window by every member, composed as SIE's
PII redaction study composes the spans (the public `superlinked/pii-redact` YAML's adapter); and the Hub cache a
member is fetched from."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from sie.worker.spans import merge_adjacent

LETTER = r"[^\W\d_]"


def seed_hub_snapshot(cache: Path, repo_id: str, revision: str, files: Path) -> None:
    """`files` as huggingface_hub keeps a snapshot under `cache`: hub/models--org--name/{refs/main,
    snapshots/<commit>/...}."""
    repo = cache / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(files, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)


def reference_union(members: list[tuple[Any, dict]], text: str, labels: list[str], composition: dict) -> list[tuple]:
    """What the study's composition makes of the gliner package's spans, each member (a GLiNER model) run with its
    options (threshold, merge_adjacent_entities): (start, end, label, score) by position."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\w+(?:[-_]\w+)*|\S", text)]
    size, overlap = composition["window_words"], composition["window_overlap"]
    firsts = range(0, max(len(words) - overlap, 1), size - overlap) if len(words) > size else [0]
    windows = [(words[f][0], words[min(f + size, len(words)) - 1][1]) for f in firsts]
    best: dict[tuple[int, int, str], float] = {}
    for model, options in members:
        for start, end in windows:
            (found,) = model.inference([text[start:end]], labels, threshold=options.get("threshold", 0.5))
            if options.get("merge_adjacent_entities"):
                found = merge_adjacent(found, text[start:end])
            for entity in found:
                key = (entity["start"] + start, entity["end"] + start, entity["label"])
                if entity["score"] >= composition["score_floor"]:
                    best[key] = max(best.get(key, 0.0), entity["score"])
    spans = sorted(((s, e, label, score) for (s, e, label), score in best.items()), key=lambda x: x[:2])
    names: dict[str, float] = {}
    for start, end, label, score in spans:
        if label == composition["propagate_label"]:
            for token in re.findall(f"{LETTER}{{{composition['name_min_letters']},}}", text[start:end]):
                names[token] = max(names.get(token, 0.0), score)
    added = [
        (m.start(), m.end(), composition["propagate_label"], score)
        for token, score in sorted(names.items())
        for m in re.finditer(f"(?<!{LETTER}){re.escape(token)}(?!{LETTER})", text)
        if not any(s <= m.start() and m.end() <= e for s, e, _, _ in spans)
    ]
    return sorted(spans + added, key=lambda x: x[:2])
