"""Contract vectors for hashing and id normalisation (contracts Part A §2.3, Part B §3.6)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sie.catalog import Catalog, load_catalog, load_yaml, normalize_model_id, parse_bundle, parse_model_config
from sie.catalog.hashing import bundle_config_canonical_json

STOCK_MINILM_YAML = """\
sie_id: sentence-transformers/all-MiniLM-L6-v2
hf_id: sentence-transformers/all-MiniLM-L6-v2
hf_revision: 1110a243fdf4706b3f48f1d95db1a4f5529b4d41
inputs: {text: true, image: false, audio: false, video: false}
tasks:
  encode: {dense: {dim: 384}, sparse: null, multivector: null}
  score: null
  extract: null
max_sequence_length: 256
profiles:
  default:
    max_batch_tokens: 16384
    compute_precision: null
    adapter_path: sie_server.adapters.sentence_transformer:SentenceTransformerDenseAdapter
    adapter_options:
      loadtime:
        trust_remote_code: false
      runtime:
        pooling: mean
        normalize: true
  candle:
    extends: default
    adapter_path: sie_server_rust.adapters.candle:CandleEmbeddingAdapter
    adapter_options:
      runtime:
        pooling: mean
        normalize: true
"""

STOCK_MINILM_CANONICAL = (
    b'[{"profiles":[{"config":{"adapter_options":{"loadtime":{"trust_remote_code":false},'
    b'"runtime":{"normalize":true,"pooling":"mean"}},"adapter_path":"sie_server.adapters.sentence_transformer:'
    b'SentenceTransformerDenseAdapter","compute_precision":null,"max_batch_tokens":16384},"name":"default"}],'
    b'"revision":"1110a243fdf4706b3f48f1d95db1a4f5529b4d41","sie_id":"sentence-transformers/all-MiniLM-L6-v2"}]'
)


def _bundle(name: str, priority: int, adapters: list[str], engine: str | None = None):
    data = {"name": name, "priority": priority, "adapters": adapters}
    if engine:
        data["engine"] = engine
    return parse_bundle(data)


@pytest.fixture()
def stock_minilm():
    return parse_model_config(load_yaml(STOCK_MINILM_YAML), "all-MiniLM-L6-v2.yaml")


def test_default_bundle_canonical_bytes_and_hash(stock_minilm) -> None:
    default = _bundle("default", 10, ["sie_server.adapters.sentence_transformer"])
    canonical = bundle_config_canonical_json(default, [stock_minilm])
    assert canonical == STOCK_MINILM_CANONICAL
    catalog = Catalog([default], [stock_minilm])
    assert catalog.bundle_config_hash("default") == ("b34bdac36fb2882c67587534f9ba43f68278654b1513b5d5d820b979cf902ac4")


def test_candle_profile_inherits_through_extends(stock_minilm) -> None:
    candle = _bundle("candle", 30, ["sie_server_rust.adapters.candle"], engine="candle")
    catalog = Catalog([candle], [stock_minilm])
    assert catalog.bundle_config_hash("candle") == ("e16da9ead150827b02262f36c485da5d35af4e09568a61b291e18939c10c51ed")


def test_bundle_without_matching_models_hashes_empty(stock_minilm) -> None:
    other = _bundle("sglang", 20, ["sie_server.adapters.sglang.generation"])
    assert Catalog([other], [stock_minilm]).bundle_config_hash("sglang") == ""


def test_pool_scope_keeps_only_the_models_of_that_pool(stock_minilm) -> None:
    default = _bundle("default", 10, ["sie_server.adapters.sentence_transformer"])
    other = parse_model_config(
        load_yaml(STOCK_MINILM_YAML.replace("all-MiniLM-L6-v2\n", "x-L6\n", 1) + "pool: GPU-A\n")
    )
    catalog = Catalog([default], [stock_minilm, other])
    assert catalog.bundle_config_hash("default", "default") == (
        "b34bdac36fb2882c67587534f9ba43f68278654b1513b5d5d820b979cf902ac4"
    )
    assert catalog.bundle_config_hash("default", "gpu-a") not in (
        "",
        catalog.bundle_config_hash("default", "default"),
    )
    assert catalog.bundle_pool_config_hashes["default"].keys() == {"default", "gpu-a"}


def test_adapter_options_canonicalisation_collapses_falsy_values(stock_minilm) -> None:
    default = _bundle("default", 10, ["sie_server.adapters.bert_flash"])
    yaml_text = """\
sie_id: zzz/model
hf_id: zzz/model
profiles:
  default:
    adapter_path: sie_server.adapters.bert_flash:B
    max_batch_tokens: 4096
    compute_precision: float16
    adapter_options: {loadtime: {}, runtime: {}, flag: 0}
"""
    model = parse_model_config(load_yaml(yaml_text))
    canonical = bundle_config_canonical_json(default, [model])
    assert b'"adapter_options":null' in canonical


public_hashes = {
    "bundles_hash": "7d444c66818e44aa3ba47af7074c717222241eb565fa4b7a863c1046a8ceedd7",
    "default": "9729ccf4045feee1d8d7bb888bb42499091dbf52d9e2a409fa4a92d1162896de",
    "one_model_fingerprint": "800fd40b4aa23495af41d646042919e3d743d3ef9cdcc67a1d8ed400d781b7b4",
}


def test_public_catalogue_loads_unchanged_and_matches_hashes(public_catalog_dir: Path) -> None:
    catalog = load_catalog(public_catalog_dir / "bundles", public_catalog_dir / "models")
    assert len(catalog.models) == 213
    assert len(catalog.bundles) == 11
    assert catalog.bundles_hash == public_hashes["bundles_hash"]
    assert catalog.bundle_config_hashes["default"] == public_hashes["default"]
    # unknown fields the public files carry are kept
    assert "deps" in catalog.bundles["default"].extra
    assert catalog.bundles["default"].is_default


def test_one_model_catalogue_fingerprint(public_catalog_dir: Path) -> None:
    full = load_catalog(public_catalog_dir / "bundles", public_catalog_dir / "models")
    one = Catalog(full.bundles.values(), [full.models["sentence-transformers/all-MiniLM-L6-v2"]])
    assert one.bundle_config_hashes_hash == public_hashes["one_model_fingerprint"]


def test_canonical_string_digest_matches_vector() -> None:
    assert hashlib.sha256(STOCK_MINILM_CANONICAL).hexdigest().startswith("b34bdac3")


@pytest.mark.parametrize(
    ("model_id", "token"),
    [
        ("BAAI/bge-m3", "BAAI__bge-m3"),
        ("vidore/colqwen2.5-v0.2", "vidore__colqwen2_dot_5-v0_dot_2"),
        ("Qwen/Qwen3-Embedding-0.6B", "Qwen__Qwen3-Embedding-0_dot_6B"),
        ("sentence-transformers/all-MiniLM-L6-v2", "sentence-transformers__all-MiniLM-L6-v2"),
        ("a*b", "a_b"),
        ("a>b", "a_b"),
        ("a b", "a_b"),
    ],
)
def test_normalize_model_id_vectors(model_id: str, token: str) -> None:
    assert normalize_model_id(model_id) == token
