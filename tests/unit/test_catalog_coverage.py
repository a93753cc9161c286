"""scripts/catalog_coverage.py on the public sie-server 0.10.1 catalogue (the wheel `make test` downloads) and on a
directory: per adapter module, how many YAMLs route here and how many are of a converted family."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import catalog_coverage  # noqa: E402


def rows(output: str) -> dict[str, list[str]]:
    table = [line.strip("|").split("|") for line in output.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in table}


def test_the_public_catalogue_counts_every_yaml_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert catalog_coverage.main(["--public", "--details"]) == 0
    output = capsys.readouterr().out
    table = rows(output)
    assert table["**all**"][1] == "213"  # every YAML of the wheel, counted once
    assert table["sie_server.adapters.xlm_roberta_flash"] == ["xlm-roberta", "3", "3", "3"]
    assert table["sie_server.adapters.bert_flash"][2:] == ["6", "6"]
    # GLiNER span models, the token-level NuNER Zero and the relation-extraction model
    assert table["sie_server.adapters.gliner"][1:] == ["18", "18", "18"]
    assert "gliner-relex-large-v1.0.yaml" not in output
    # NLI zero-shot classifiers on DeBERTa-v3, ModernBERT and BART (facebook/bart-large-mnli)
    assert table["sie_server.adapters.nli_classification_flash"][1:] == ["5", "5", "5"]
    assert table["sie_server.adapters.gliclass"] == ["GLiClass", "20", "20", "20"]
    # generation: Qwen3.5-4B (hybrid linear attention) and Qwen3-VL-8B (its Qwen3 language model, for text) are built
    assert table["sie_server.adapters.sglang.generation"][1:] == ["11", "11", "11"]  # Qwen3.6-27B: a Qwen3.5
    # Gemma 4: E2B, E4B and 31B; the 26B-A4B's mixture-of-experts blocks are not built
    assert table["sie_server.adapters.sglang.gemma"] == ["gemma4, gemma4 (mixture of experts)", "4", "3", "3"]
    assert table["sie_server.adapters.qwen3_vl_reranker.adapter"] == ["qwen3_vl", "1", "1", "1"]
    assert table["sie_server.adapters.stablebridge_pruner"] == ["xlm-roberta", "1", "1", "1"]
    assert "Qwen__Qwen3.5-4B.yaml" not in output and "Qwen__Qwen3-VL-8B-Instruct.yaml" not in output
    assert table["sie_server.adapters.qwen3_vl_embedding"] == ["qwen3_vl", "1", "1", "1"]
    # TopK-Embed's text path on Qwen3.5 (its page images are refused per item)
    assert table["sie_server.adapters.topk_embed.adapter"] == ["qwen3_5", "2", "2", "2"]
    assert table["sie_server.adapters.gliner_bi"] == ["gliner_bi_encoder_span", "5", "5", "5"]
    assert table["sie_server.adapters.glirel"] == ["glirel", "1", "1", "1"]
    assert table["sie_server.adapters.gliner_union.adapter"] == ["gliner_uni_encoder_span", "1", "1", "1"]
    # CLIP and SigLIP transformers checkpoints, and the Marqo ones in open_clip's layout
    assert table["sie_server.adapters.clip"] == ["clip", "4", "4", "4"]
    assert table["sie_server.adapters.jina_flash_cross_encoder"] == ["xlm-roberta", "1", "1", "1"]  # jina_flash.py
    assert table["sie_server.adapters.colbert_rotary_flash"] == ["xlm-roberta", "1", "1", "1"]  # rotary jina_flash.py
    assert table["sie_server.adapters.nomic_flash"] == ["nomic_bert", "1", "1", "1"]  # v2-moe: rotary_glu.py experts
    assert table["sie_server.adapters.siglip.adapter"][1:] == ["6", "6", "6"]
    assert "marqo-fashionSigLIP.yaml" not in output
    assert "no SIE adapter for this module" in output
    # GLiNER2's span checkpoints convert; the GLiNER2.5 boundary ones and the typed-decision module are named, not built
    assert table["sie_server.adapters.gliner2.adapter"] == ["extractor (span)", "2", "2", "2"]
    assert table["sie_server.adapters.gliner2.classification"] == ["extractor (span)", "1", "1", "1"]
    assert table["sie_server.adapters.gliner2.entities"][1:] == ["3", "1", "1"]
    assert "fastino__gliner2.5-base-v1.yaml: the converter does not build model_type 'extractor (boundary)'" in output
    # GLiNER2.5-Decide: the span checkpoints serve typed decisions, the multilingual boundary one is named
    assert table["sie_server.adapters.gliner2.decide"][1:] == ["3", "2", "2"]
    assert (
        "fastino__GLiNER2.5-multi-Decide.yaml: the converter does not build model_type 'extractor (boundary)'" in output
    )
    assert "fastino__GLiNER2.5-Decide.yaml" not in output


def test_a_directory_catalogue_reads_the_architecture_from_a_local_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    (weights / "config.json").write_text('{"model_type": "funnel"}')
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.yaml").write_text(
        f"sie_id: acme/m\nweights_path: {weights}\ntasks: {{encode: {{dense: {{dim: 8}}}}}}\n"
        "profiles:\n  default: {adapter_path: 'sie.adapters.dense:X', max_batch_tokens: 8}\n"
    )
    (tmp_path / "models" / "b.yaml").write_text("sie_id: [broken\n")
    assert catalog_coverage.main([str(tmp_path), "--details"]) == 0
    output = capsys.readouterr().out
    assert rows(output)["sie.adapters.dense"] == ["funnel", "1", "0", "0"]
    assert "a.yaml: the converter does not build model_type 'funnel' yet" in output
    assert "- b.yaml: " in output
