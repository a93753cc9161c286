"""Zero-shot classification by entailment served through the worker against transformers' zero-shot-classification
pipeline on the same tiny random NLI checkpoints: a DeBERTa-v3 one with MNLI's three labels (entailment last), a
BERT one with the binary entailment / not_entailment head of the zeroshot-v2.0 models (entailment first), and a BART
encoder-decoder one (facebook/bart-large-mnli's architecture) with MNLI's labels; scores
within 1e-4 and in the same order, exclusive and multi-label, a single label, the YAML's hypothesis template and a
request's own; what cannot run is refused per item."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ExtractBatchItem
from sie.worker.convert import ConversionError
from sie.worker.convert.encoders import convert_encoder
from support.zero_shot_checkpoints import MNLI_LABELS, save_nli_classifier

TOLERANCE = 1e-4
TEXTS = ["Steve Jobs founded Apple in Cupertino California in 1976.", "The quick brown fox jumps over the lazy dog."]
LABELS = ["person", "organization", "city", "award"]
TEMPLATE = "This text is about {}."
HEADS = {
    "deberta-mnli": ("deberta-v2", MNLI_LABELS),
    "bert-binary": ("bert", {0: "entailment", 1: "not_entailment"}),
    "bart-mnli": ("bart", MNLI_LABELS),
}


@pytest.fixture(scope="module", params=sorted(HEADS))
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_loader) -> tuple[Any, Any]:
    import transformers

    directory = tmp_path_factory.mktemp(request.param)
    backbone, id2label = HEADS[request.param]
    model = save_nli_classifier(directory, backbone, id2label)
    pipeline = transformers.pipeline(
        "zero-shot-classification", model=model, tokenizer=transformers.AutoTokenizer.from_pretrained(directory)
    )
    entry = parse_model_config({
        "sie_id": f"acme/{request.param}", "weights_path": str(directory), "tasks": {"extract": {}},
        "profiles": {"default": {
            "adapter_path": "sie_server.adapters.nli_classification_flash:NLIClassificationFlashAdapter",
            "max_batch_tokens": 4096,
            "adapter_options": {"runtime": {"hypothesis_template": TEMPLATE, "multi_label": False}}}},
    })  # fmt: skip
    return pipeline, model_loader.load(entry, "default", entry.sie_id).adapter


def items(texts: list[str], labels: list[str], **options: Any) -> list[ExtractBatchItem]:
    return [
        ExtractBatchItem(work_item_id=f"c.{index}", request_id="c", item_index=index, total_items=len(texts),
                         timestamp=0.0, item={"text": text}, labels=labels, options=options or None)
        for index, text in enumerate(texts)
    ]  # fmt: skip


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize(("labels", "template"), [(LABELS, None), (["award"], None), (LABELS[:3], "It is {}!")])
def test_scores_equal_the_zero_shot_pipeline(
    served: tuple[Any, Any], multi_label: bool, labels: list[str], template: str | None
) -> None:
    pipeline, adapter = served
    options = {"multi_label": multi_label} | ({"hypothesis_template": template} if template else {})
    results = adapter.extract(items(TEXTS, labels, **options)).items
    for text, result in zip(TEXTS, results, strict=True):
        assert result.ok, result.error
        expected = pipeline(text, labels, hypothesis_template=template or TEMPLATE, multi_label=multi_label)
        ours = result.result["classifications"]
        assert [c["label"] for c in ours] == expected["labels"]
        assert np.allclose([c["score"] for c in ours], expected["scores"], atol=TOLERANCE, rtol=0)
        if not multi_label and len(labels) > 1:
            assert abs(sum(c["score"] for c in ours) - 1.0) <= 1e-5
        assert result.result["entities"] == [] and result.input_tokens > 0


def test_what_cannot_run_is_refused_per_item(served: tuple[Any, Any]) -> None:
    _, adapter = served
    batch = [
        *items([TEXTS[0]], []),
        *items([" "], LABELS),
        *items([TEXTS[0]], LABELS, hypothesis_template="no placeholder"),
        *items([TEXTS[0]], LABELS, threshold=0.5),
        *items([TEXTS[1]], LABELS),
    ]
    results = adapter.extract(batch).items
    assert [result.error_code for result in results[:4]] == ["INVALID_INPUT"] * 4
    assert "labels" in results[0].error and "hypothesis_template" in results[2].error
    assert "threshold" in results[3].error and results[4].ok


def test_a_bart_classifier_converts_to_transformers_logits_on_a_padded_batch(tmp_path: Path) -> None:
    """The BART graph alone: encoder, shifted decoder, the last <eos> of rows of different lengths (right padding,
    as the adapter pads), against BartForSequenceClassification; a head other than seq-cls is refused."""
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer

    model = save_nli_classifier(tmp_path, "bart", MNLI_LABELS)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    pairs = [(TEXTS[0], "This text is about a person."), ("Paris", "It is a city."), (TEXTS[1], "Fox.")]
    encoded = [tokenizer.encode(premise, hypothesis).ids for premise, hypothesis in pairs]
    width = max(map(len, encoded))
    ids = np.array([row + [0] * (width - len(row)) for row in encoded])
    mask = np.array([[1] * len(row) + [0] * (width - len(row)) for row in encoded])
    converted = convert_encoder(tmp_path, tmp_path / "bart.onnx", "seq-cls")
    assert converted.labels == ("contradiction", "neutral", "entailment")
    session = ort.InferenceSession(str(converted.path), providers=["CPUExecutionProvider"])
    (ours,) = session.run(["logits"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    for row, tokens in enumerate(encoded):  # transformers, one row at a time: no padding on its side
        with torch.no_grad():
            theirs = model(input_ids=torch.tensor([tokens])).logits[0].numpy()
        assert float(np.abs(ours[row] - theirs).max()) <= TOLERANCE, row
    with pytest.raises(ConversionError, match="head 'mean' is not built for BART"):
        convert_encoder(tmp_path, tmp_path / "mean.onnx", "mean")
    config = json.loads((tmp_path / "config.json").read_text())
    for option, message in [({"activation_function": "relu"}, "activation_function 'relu'"),
                            ({"normalize_before": True}, "normalize_before True")]:  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(config | option))
        with pytest.raises(ConversionError, match=message):
            convert_encoder(tmp_path, tmp_path / "odd.onnx", "seq-cls")
