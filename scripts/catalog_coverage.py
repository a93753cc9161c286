"""How much of a model catalogue this SIE serves, per adapter module: how many YAMLs route to one of our adapter
kinds, how many of those are of an encoder family our converter builds and is checked against transformers, and why
each other one is not served.

    .venv/bin/python scripts/catalog_coverage.py                # this project's config/models
    .venv/bin/python scripts/catalog_coverage.py --public       # the public sie-server 0.10.1 wheel's catalogue
    .venv/bin/python scripts/catalog_coverage.py DIR_OR_WHEEL [--details]

The architecture of a YAML's checkpoint is its `config.json` `model_type`, which the YAML does not carry: it is read
from a local `weights_path`, else taken from what the public adapter module is written for (`ARCHITECTURE_OF`,
from the module names of sie-server 0.10.1: `xlm_roberta_flash` serves XLM-R, ...), else, for the decoder models
the public catalogue serves through modules of many architectures (`sglang.*`, `qwen2_flash`, ...), from the
`model_type` each model's published `config.json` names (`ARCHITECTURE_OF_MODEL`, which also names those of the
encoder models behind modules of many architectures: `sentence_transformer`, `pytorch_embedding`, the Rust `candle`,
`splade_flash`, `colbert`). A YAML none of these places routes, and its family is decided when the worker reads its
`config.json` (an unsupported one fails that load by name).
Each YAML is counted by its default profile, or its first one where it has no default (then it is served as the
variant `model:profile` only, as the catalogue rules say).
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from sie.catalog import CatalogErrors, ConfigError, load_yaml, parse_model_config  # noqa: E402
from sie.catalog.adapters import ADAPTER_KINDS, UNSERVED_MODULES, adapter_module  # noqa: E402
from sie.worker.convert.families import CONVERTED_MODEL_TYPES  # noqa: E402
from sie.worker.convert.names import (  # noqa: E402
    DECODER_MODEL_TYPES,
    GLICLASS_MODEL_TYPE,
    GLINER_BI_SPAN_MODEL_TYPE,
    GLINER_RELEX_MODEL_TYPE,
    GLINER_SPAN_MODEL_TYPE,
    GLINER_TOKEN_MODEL_TYPE,
    GLIREL_MODEL_TYPE,
)

PUBLIC_WHEEL = REPO / ".cache" / "wheels" / "sie_server-0.10.1-py3-none-any.whl"
MODELS_IN_WHEEL = "sie_server/models/"

# What the report calls a GLiNER2 checkpoint of the span architecture (config.json: model_type extractor).
GLINER2_SPAN = "extractor (span)"
GLINER2_BOUNDARY = "extractor (boundary)"

# The architecture a public adapter module is written for (its name says so); "" where it serves many.
ARCHITECTURE_OF = {
    "sie_server.adapters.bert_flash": "bert",
    "sie_server.adapters.bert_flash_cross_encoder": "bert",  # and XLM-R (bge-reranker-v2-m3): read config.json
    "sie_server.adapters.xlm_roberta_flash": "xlm-roberta",
    "sie_server.adapters.stablebridge_pruner": "xlm-roberta",  # bge-reranker-v2-m3 and its pruning head
    "sie_server.adapters.modernbert_flash": "modernbert",
    "sie_server.adapters.modernbert_flash_cross_encoder": "modernbert",
    "sie_server.adapters.colbert_modernbert_flash.adapter": "modernbert",
    "sie_server.adapters.nomic_flash": "nomic_bert",  # nomic-embed-text-v2-moe: NomicBERT with experts
    "sie_server.adapters.rope_flash": "new",  # GTE v1.5 "new" architecture (remote code)
    "sie_server.adapters.colbert_rotary_flash": "xlm-roberta",  # jina-colbert-v2: rotary flash XLM-R (jina_flash.py)
    "sie_server.adapters.gte_sparse_flash": "new",
    "sie_server.adapters.jina_flash_cross_encoder": "xlm-roberta",  # jina-reranker-v2: XLM-R with flash attention
    "sie_server.adapters.bge_m3_flash": "xlm-roberta",
    "sie_server.adapters.bge_m3_flag": "xlm-roberta",
    # GLiNER checkpoints name their architecture in gliner_config.json; this module's are span models, but for the
    # ones ARCHITECTURE_OF_MODEL names
    "sie_server.adapters.gliner": GLINER_SPAN_MODEL_TYPE,
    "sie_server.adapters.gliner_bi": GLINER_BI_SPAN_MODEL_TYPE,
    # a union of GLiNER models: its own checkpoint (a span model) and members of the architectures the gliner kind
    # serves (superlinked/pii-redact: urchade/gliner_multi_pii-v1 with numind/NuNER_Zero, token-level)
    "sie_server.adapters.gliner_union.adapter": GLINER_SPAN_MODEL_TYPE,
    # GLiNER2 checkpoints (config.json model_type `extractor`): the span architecture converts (gliner2.py); the
    # GLiNER2.5 ones ARCHITECTURE_OF_MODEL names are boundary checkpoints, refused at load naming it
    "sie_server.adapters.gliner2.adapter": GLINER2_SPAN,
    "sie_server.adapters.gliner2.classification": GLINER2_SPAN,
    "sie_server.adapters.gliner2.entities": GLINER2_SPAN,
    # GLiNER2.5-Decide typed decisions: span checkpoints (DeBERTa-v3-large, Ettin's ModernBERT) but the multilingual
    # boundary one ARCHITECTURE_OF_MODEL names
    "sie_server.adapters.gliner2.decide": GLINER2_SPAN,
    # GLiClass checkpoints' config.json model_type; the graph builds uni-encoders on any backbone family converted
    # here (another architecture_type fails its load naming it)
    "sie_server.adapters.gliclass": GLICLASS_MODEL_TYPE,
    # GLiREL checkpoints (glirel_config.json, the backbone's config beside them): relations between given entities
    "sie_server.adapters.glirel": GLIREL_MODEL_TYPE,
    # CLIP and SigLIP transformers checkpoints (the FixRes SigLIP 2 ones are SiglipModel checkpoints too); the
    # open_clip-layout ones ARCHITECTURE_OF_MODEL names
    "sie_server.adapters.clip": "clip",
    "sie_server.adapters.siglip.adapter": "siglip",
}


# The zero-shot architectures the converter builds (a GLiNER's gliner_config.json, a GLiClass config.json, GLiREL).
ZERO_SHOT_MODEL_TYPES = (
    GLINER2_SPAN,
    GLINER_SPAN_MODEL_TYPE,
    GLINER_BI_SPAN_MODEL_TYPE,
    GLINER_TOKEN_MODEL_TYPE,
    GLINER_RELEX_MODEL_TYPE,
    GLICLASS_MODEL_TYPE,
    GLIREL_MODEL_TYPE,
)
# The image–text architectures the converter builds (`convert/clip.py`; open_clip's SigLIPs `convert/open_clip.py`).
IMAGE_TEXT_MODEL_TYPES = ("clip", "siglip", "open_clip")

# The `model_type` of the decoder checkpoints the public catalogue names (their published config.json), by hf_id.
ARCHITECTURE_OF_MODEL = {
    "Qwen/Qwen3-0.6B": "qwen3",
    "Qwen/Qwen3-4B-Instruct-2507": "qwen3",
    "Qwen/Qwen3Guard-Gen-0.6B": "qwen3",
    "Qwen/Qwen3Guard-Gen-4B": "qwen3",
    "Qwen/Qwen3-Embedding-0.6B": "qwen3",
    "Qwen/Qwen3-Embedding-4B": "qwen3",
    "Qwen/Qwen3-Embedding-8B": "qwen3",
    "Qwen/Qwen3-Reranker-0.6B": "qwen3",
    "Qwen/Qwen3-Reranker-4B": "qwen3",
    "tencent/R3-embedding-0.6b": "qwen3",
    "tencent/R3-rerank-0.6b": "qwen3",
    "Qwen/Qwen3-VL-8B-Instruct": "qwen3_vl",  # a vision-language model: its Qwen3 language model, for text
    "Qwen/Qwen3-VL-Embedding-2B": "qwen3_vl",  # the same, each text written into its chat template
    "Qwen/Qwen3-VL-Reranker-2B": "qwen3_vl",  # its language model scoring text pairs
    "Qwen/Qwen3.5-4B": "qwen3_5",  # hybrid linear attention
    "Qwen/Qwen3.6-27B": "qwen3_5",  # the same hybrid family, scaled up (its YAML says so)
    "topk-io/topk-embed-v1-small": "qwen3_5",  # TopK-Embed: Qwen3.5-2B attending both ways, a token projection
    "topk-io/topk-embed-v1-xsmall": "qwen3_5",  # on Qwen3.5-0.8B
    "NovaSearch/stella_en_1.5B_v5": "qwen2",
    "Alibaba-NLP/gte-Qwen2-1.5B-instruct": "qwen2",
    "Alibaba-NLP/gte-Qwen2-7B-instruct": "qwen2",
    "mixedbread-ai/mxbai-rerank-base-v2": "qwen2",
    "mixedbread-ai/mxbai-rerank-large-v2": "qwen2",
    "zeroentropy/zerank-2-reranker": "qwen3",  # zerank-2 is a Qwen3 causal LM scored by one token's logit
    "intfloat/e5-mistral-7b-instruct": "mistral",
    "Salesforce/SFR-Embedding-Mistral": "mistral",
    "Salesforce/SFR-Embedding-2_R": "mistral",
    "Linq-AI-Research/Linq-Embed-Mistral": "mistral",
    "defog/sqlcoder-7b-2": "llama",
    "google/embeddinggemma-300m": "gemma3_text",
    "google/translategemma-4b-it": "gemma3",  # Gemma 3 with its vision tower
    "ibm-granite/granite-guardian-3.0-2b": "granite",
    # Gemma 4 (sglang.gemma): its language model, for text; the 26B-A4B's mixture-of-experts blocks are not built
    "google/gemma-4-E2B-it": "gemma4",
    "google/gemma-4-E4B-it": "gemma4",
    "google/gemma-4-31B-it": "gemma4",
    "google/gemma-4-26B-A4B-it": "gemma4 (mixture of experts)",
    "tencent/Hy-MT2-1.8B": "hunyuan_v1_dense",
    # GLiNER checkpoints of other architectures than the span model (the public adapter's own notes say which)
    "numind/NuNER_Zero": GLINER_TOKEN_MODEL_TYPE,  # token-level
    "knowledgator/gliner-relex-large-v1.0": GLINER_RELEX_MODEL_TYPE,  # joint entities and relations
    # GLiNER2.5 boundary checkpoints (gliner2's model table): the converter builds GLiNER2's span architecture only
    "fastino/gliner2.5-small-v1": GLINER2_BOUNDARY,
    "fastino/gliner2.5-base-v1": GLINER2_BOUNDARY,
    "fastino/GLiNER2.5-multi-Decide": GLINER2_BOUNDARY,  # mDeBERTa-v3-base, boundary (its YAML says so)
    # the NLI zero-shot classifiers (nli_classification_flash serves several encoder architectures)
    "MoritzLaurer/ModernBERT-base-zeroshot-v2.0": "modernbert",
    "MoritzLaurer/deberta-v3-base-zeroshot-v2.0": "deberta-v2",
    "MoritzLaurer/deberta-v3-large-zeroshot-v2.0": "deberta-v2",
    "cross-encoder/nli-deberta-v3-base": "deberta-v2",
    "facebook/bart-large-mnli": "bart",  # an encoder-decoder
    # SigLIP YAMLs served by open_clip (`backend: open_clip`): checkpoints in open_clip's layout (ViT-B-16-SigLIP:
    # a timm SigLIP ViT and open_clip's text tower), no transformers config.json
    "Marqo/marqo-fashionSigLIP": "open_clip",
    "Marqo/marqo-ecommerce-embeddings-B": "open_clip",
    # pytorch_embedding: GritLM is a Mistral its YAML runs with `is_causal: false`; NVIDIA's bidirectional Llama
    # (`llama_bidirec`); NV-Embed-v2 (`nvembed`: a Mistral attending both ways, then latent-attention pooling)
    "GritLM/GritLM-7B": "mistral",
    "nvidia/llama-embed-nemotron-8b": "llama_bidirec",
    "Hyukkyu/nv-embed-v2": "nvembed",  # the YAML serves this mirror of nvidia/NV-Embed-v2
    "answerdotai/ModernBERT-base": "modernbert",
    # sentence_transformer's encoders (arctic-embed-m-v2.0: GTE "new" code under `model_type: gte`)
    "Snowflake/snowflake-arctic-embed-m-v2.0": "gte",
    "ibm-granite/granite-embedding-english-r2": "modernbert",
    "sentence-transformers/all-MiniLM-L6-v2": "bert",
    # the Rust candle module's encoders (JinaBERT v2 is `bert` with ALiBi positions)
    "BAAI/bge-base-en-v1.5": "bert",
    "BAAI/bge-large-en-v1.5": "bert",
    "BAAI/bge-small-en-v1.5": "bert",
    "BAAI/bge-small-zh-v1.5": "bert",
    "WhereIsAI/UAE-Large-V1": "bert",
    "answerdotai/ModernBERT-large": "modernbert",
    "jinaai/jina-embeddings-v2-base-code": "bert",
    "jinaai/jina-embeddings-v2-base-de": "bert",
    "jinaai/jina-embeddings-v2-base-en": "bert",
    "jinaai/jina-embeddings-v2-base-es": "bert",
    "jinaai/jina-embeddings-v2-base-zh": "bert",
    "jinaai/jina-embeddings-v2-small-en": "bert",
    "nomic-ai/nomic-embed-text-v1.5": "nomic_bert",
    "thenlper/gte-base": "bert",
    "thenlper/gte-large": "bert",
    "thenlper/gte-small": "bert",
    # ColBERT checkpoints of the `colbert` module
    "answerdotai/answerai-colbert-small-v1": "bert",
    "colbert-ir/colbertv2.0": "bert",
    "mixedbread-ai/mxbai-colbert-large-v1": "bert",
    # SPLADE checkpoints of `splade_flash` (the OpenSearch distilled ones are DistilBERTs, granite's sparse a RoBERTa)
    "naver/splade-cocondenser-selfdistil": "bert",
    "naver/splade-v3": "bert",
    "prithivida/Splade_PP_en_v2": "bert",
    "rasyosef/splade-mini": "bert",
    "ibm-granite/granite-embedding-30m-sparse": "roberta",
    "opensearch-project/opensearch-neural-sparse-encoding-v1": "bert",
    "opensearch-project/opensearch-neural-sparse-encoding-v2-distill": "distilbert",
    "opensearch-project/opensearch-neural-sparse-encoding-doc-v2-distill": "distilbert",
    "opensearch-project/opensearch-neural-sparse-encoding-doc-v2-mini": "bert",
    "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-distill": "distilbert",
}


def yaml_texts(source: Path) -> Iterator[tuple[str, str]]:
    """`(name, text)` of every model YAML in a catalogue directory (its `models/`, or the directory itself) or a
    wheel (`sie_server/models/*.yaml`)."""
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            for name in sorted(wheel.namelist()):
                if name.startswith(MODELS_IN_WHEEL) and name.endswith((".yaml", ".yml")):
                    yield name.removeprefix(MODELS_IN_WHEEL), wheel.read(name).decode()
        return
    directory = source / "models" if (source / "models").is_dir() else source
    for path in sorted(directory.glob("*.y*ml")):
        yield path.name, path.read_text(encoding="utf-8")


def architecture(data: dict, module: str) -> str:
    """The checkpoint's `model_type`: a local `weights_path`'s config.json, else what the module implies, else the
    published one of a known decoder model; "" when none says."""
    weights = data.get("weights_path")
    if isinstance(weights, str) and (Path(weights) / "config.json").is_file():
        return str(json.loads((Path(weights) / "config.json").read_text()).get("model_type", ""))
    return ARCHITECTURE_OF_MODEL.get(str(data.get("hf_id") or "")) or ARCHITECTURE_OF.get(module, "")


def status_of(name: str, text: str) -> tuple[str, str, str]:
    """`(module, architecture, status)`; status is `converted family`, `routed` (family decided at load) or a
    reason it is not served."""
    try:
        data = load_yaml(text, name)
        model = parse_model_config(data, source=name)
    except (CatalogErrors, ConfigError) as exc:
        return "(does not parse)", "", f"not served: {str(exc).splitlines()[0]}"
    profile = "default" if "default" in model.profiles else next(iter(model.profiles))
    module = adapter_module(model.resolve_profile(profile).adapter_path)
    arch = architecture(data, module)
    if module not in ADAPTER_KINDS:
        return module, arch, f"not served: {UNSERVED_MODULES.get(module, 'no SIE adapter for this module')}"
    if not arch:
        return module, arch, "routed"
    if arch in (*CONVERTED_MODEL_TYPES, *DECODER_MODEL_TYPES, *ZERO_SHOT_MODEL_TYPES, *IMAGE_TEXT_MODEL_TYPES):
        return module, arch, "converted family"
    return module, arch, f"not served: the converter does not build model_type {arch!r} yet"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", nargs="?", type=Path, default=REPO / "config", help="catalogue directory or wheel")
    parser.add_argument("--public", action="store_true", help=f"the public catalogue ({PUBLIC_WHEEL.name})")
    parser.add_argument("--details", action="store_true", help="list every YAML that is not served, with its reason")
    args = parser.parse_args(argv)
    source = PUBLIC_WHEEL if args.public else args.source
    if not source.exists():
        raise SystemExit(f"{source} does not exist (`make test` downloads the public wheel into .cache/wheels)")
    rows: dict[str, Counter[str]] = defaultdict(Counter)
    architectures: dict[str, set[str]] = defaultdict(set)
    refused: list[tuple[str, str]] = []
    for name, text in yaml_texts(source):
        module, arch, status = status_of(name, text)
        rows[module]["yamls"] += 1
        architectures[module].add(arch or "?")
        if status == "converted family":
            rows[module]["routed"] += 1
            rows[module]["converted"] += 1
        elif status == "routed":
            rows[module]["routed"] += 1
        else:
            refused.append((name, status))
    print(f"catalogue: {source}")
    print("| adapter module | architecture | YAMLs | routed | of a converted family |")
    print("|---|---|---|---|---|")
    for module, counts in sorted(rows.items(), key=lambda item: (-item[1]["routed"], -item[1]["yamls"], item[0])):
        arch = ", ".join(sorted(architectures[module]))
        print(f"| {module} | {arch} | {counts['yamls']} | {counts['routed']} | {counts['converted']} |")
    total = sum(counts["yamls"] for counts in rows.values())
    routed = sum(counts["routed"] for counts in rows.values())
    converted = sum(counts["converted"] for counts in rows.values())
    print(f"| **all** | | {total} | {routed} | {converted} |")
    if args.details:
        print("\nnot served:")
        for name, status in refused:
            print(f"- {name}: {status.removeprefix('not served: ')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
