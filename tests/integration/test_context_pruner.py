"""The public stablebridge-pruner-highlighter YAML (a context pruner: bge-reranker-v2-m3 scoring, a pruning head
trained apart) against its public adapter's recipe run with transformers and torch on a tiny random XLM-RoBERTa
cross-encoder and a head saved by torch.save as a training checkpoint: scores, the summary and every span with its
label and mean probability."""

from __future__ import annotations

import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pytest

from sie.catalog import load_yaml, parse_model_config
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from support.context_pruner import HIDDEN, INTERMEDIATE, Reference, save_pruner
from support.worker_items import extract_items

TOLERANCE = 1e-4
YAML = "sugiv__stablebridge-pruner-highlighter.yaml"


@pytest.fixture(scope="module")
def pruner(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Reference]:
    root = tmp_path_factory.mktemp("pruner")
    return root, save_pruner(root)


def load(model_loader: ModelLoader, public_wheel: Path, root: Path, **loadtime: Any) -> Any:
    """The public YAML as it is, its checkpoint and head here, sized for the tiny encoder."""
    with zipfile.ZipFile(public_wheel) as wheel:
        text = wheel.read(f"sie_server/models/{YAML}").decode()
    data = load_yaml(text, YAML) | {"weights_path": str(root / "model")}
    data["profiles"]["default"]["adapter_options"]["loadtime"] |= {
        "pruning_head_path": str(root / "head"), "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, **loadtime,
    }  # fmt: skip
    model = parse_model_config(data)
    return model_loader.load(model, "default", model.sie_id)


def test_a_context_pruner_scores_pairs_as_its_cross_encoder(
    pruner: tuple[Path, Reference], model_loader: ModelLoader, public_wheel: Path
) -> None:
    root, reference = pruner
    loaded = load(model_loader, public_wheel, root)
    try:
        documents = ["w1 w2 w3", "w20 w21", "w5"]
        item = SimpleNamespace(query_item={"text": "w1 w2"}, score_items=[{"text": d} for d in documents],
                               options=None, instruction=None)  # fmt: skip
        (result,) = loaded.adapter.score([item]).items
        assert result.ok, result.error
        ours = {row["item_id"]: row["score"] for row in result.result}
        for index, expected in enumerate(reference.scores("w1 w2", documents)):
            assert abs(ours[f"item-{index}"] - expected) <= TOLERANCE
    finally:
        loaded.close()


def test_a_context_pruner_extracts_the_public_recipes_spans(
    pruner: tuple[Path, Reference], model_loader: ModelLoader, public_wheel: Path
) -> None:
    """Spans of each label, their mean probabilities and the summary equal the recipe's, at the profile's thresholds
    and at a request's own; the instruction is the query (none: an empty one)."""
    root, reference = pruner
    loaded = load(model_loader, public_wheel, root)
    passages = [" ".join(f"w{(7 * index + 3 * row) % 90}" for index in range(12 + 5 * row)) for row in range(3)]
    labels: set[str] = set()
    try:
        for instruction, thresholds in ((None, {}), ("w4 w8", {"prune_threshold": 0.3, "highlight_threshold": 0.7})):
            items = extract_items(passages, [], **thresholds)
            items = [attrs.evolve(item, instruction=instruction) for item in items]
            prune, highlight = thresholds.get("prune_threshold", 0.6), thresholds.get("highlight_threshold", 0.9)
            for passage, result in zip(passages, loaded.adapter.extract(items).items, strict=True):
                assert result.ok, result.error
                ours = result.result["entities"]
                expected = reference.entities(instruction or "", passage, prune, highlight)
                assert [(e["label"], e["start"], e["end"], e["text"]) for e in ours] == [
                    (e["label"], e["start"], e["end"], e["text"]) for e in expected
                ]  # fmt: skip
                assert max(abs(a["score"] - b["score"]) for a, b in zip(ours, expected, strict=True)) <= TOLERANCE
                labels |= {entity["label"] for entity in ours}
        assert labels == {"summary", "pruned", "kept", "highlight"}  # the thresholds cut the passages' tokens
    finally:
        loaded.close()


def test_a_pruning_head_that_does_not_fit_fails_the_load_naming_it(
    pruner: tuple[Path, Reference], model_loader: ModelLoader, public_wheel: Path
) -> None:
    root, _ = pruner
    with pytest.raises(ModelLoadError, match=r"classifier.0.weight is \[16, 32\], not \[8, 32\]"):
        load(model_loader, public_wheel, root, intermediate_size=8)
    with pytest.raises(ModelLoadError, match="no missing.pt in"):
        load(model_loader, public_wheel, root, pruning_head_file="missing.pt")
