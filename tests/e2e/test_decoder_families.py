"""Decoder families served end to end: `sie run --role all` over YAMLs shaped like the public catalogue's Qwen3
ones, each pointing at a tiny random Qwen3 checkpoint in a local `weights_path` — a chat model (`sglang.generation`),
an embedder (`qwen2_flash`, last-token pooling with an instruction template), an NV-Embed (the public
`pytorch_embedding` YAML's shape: a bidirectional Mistral, latent-attention pooling without the instruction) and a
reranker
(`qwen2_flash_cross_encoder`, the Qwen3-Reranker prompt) — asked through the `openai` client (chat completions,
streamed too, and the Responses API) and the public sie-sdk (encode, score); a chat model of every other decoder
family (Llama, Mistral, Qwen2, Granite, Gemma 3, Qwen3.5) through chat completions, and the DeBERTa-v3 models: a
cross-encoder through the SDK's score, and the zero-shot models in the public catalogue's YAML shapes through the
SDK's extract with labels of each request's own: a GLiNER extractor (through this package's client too), a GLiNER
relation extractor (relation types by option), a GLiClass classifier (with label groups), an
NLI classifier, a GLiREL relation extractor over the entities each item names, a GLiNER2 model (entities, and a
guard's classification), and a union of two GLiNER models
(its member fetched from the offline Hub cache). Greedy text equals
`transformers.generate` on the same checkpoint and rendered prompt; vectors and scores equal transformers ≤ 1e-4,
entities, relations and classifications equal the `gliner`, `gliner2`, `gliclass` and `glirel` packages' and
transformers'
zero-shot pipeline.
Marked slow: it starts a server process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher import REPO, serving_all
from sie.catalog import dump_yaml
from sie.client import SIEClient
from support.context_pruner import HIDDEN, INTERMEDIATE, save_pruner
from support.decoder_checkpoints import save_base_model, save_causal_lm, write_tokenizer
from support.gliner_union import reference_union, seed_hub_snapshot
from support.nvembed_checkpoint import TEMPLATE, public_yaml, recipe_ids, reference_vector, save_nvembed
from support.qwen3_vl_recipes import RERANK_INSTRUCTION, embedding, reference_tokenizer, rerank_score, save_qwen3_vl
from support.topk_checkpoint import OUTPUT_DIM, save_topk
from support.zero_shot_checkpoints import save_gliclass, save_gliner, save_gliner2, save_glirel, save_nli_classifier

pytestmark = pytest.mark.slow

CHAT, EMBED, RERANK = "tiny/qwen3-chat", "tiny/qwen3-embedding", "tiny/qwen3-reranker"
NVEMBED = "tiny/nv-embed"
# the other families' chat models, served and checked over HTTP like the Qwen3 one
OTHER_CHATS = {f"tiny/{family}-chat": family for family in ("llama", "mistral", "qwen2", "granite", "gemma3",
                                                            "qwen3_5", "gemma4")}  # fmt: skip
# the public module each chat model's YAML names: Gemma 4's own (sglang.gemma), sglang.generation for the others
GENERATION_MODULES = {"gemma4": "sie_server.adapters.sglang.gemma:SGLangGemmaAdapter"}
GENERATION_MODULE = "sie_server.adapters.sglang.generation:SGLangGenerationAdapter"
DEBERTA = "tiny/deberta-v3-reranker"
QWEN3_VL_EMBED, QWEN3_VL_RERANK = "tiny/qwen3-vl-embedding", "tiny/qwen3-vl-reranker"  # one Qwen3-VL checkpoint
TOPK = "tiny/topk-embed"
PRUNER = "tiny/stablebridge-pruner"  # the public stablebridge_pruner module: a cross-encoder and its pruning head
GLINER = "tiny/gliner-deberta-v3"
RELEX = "tiny/gliner-relex"  # the public knowledgator/gliner-relex-large-v1.0 YAML's shape
GLICLASS = "tiny/gliclass-deberta-v3"
NLI = "tiny/nli-deberta-v3"
GLIREL = "tiny/glirel-deberta-v3"
# the public gliner2.adapter and gliner2.classification YAMLs' shapes (and the first reading 512 tokens at once)
GLINER2, GLINER2_LONG, GUARD = "tiny/gliner2", "tiny/gliner2-long", "tiny/gliguard"
DECIDE = "tiny/gliner2-decide"  # the public fastino/GLiNER2.5-Decide YAML's shape, over the GLiNER2 checkpoint
UNION, MEMBER = "tiny/gliner-union", "tiny/token-gliner"  # the public superlinked/pii-redact YAML's shape
MEMBER_REVISION = "c90187673f464518dca09f41689184ed6976242c"
UNION_OPTIONS = {"score_floor": 0.45, "window_words": 12, "window_overlap": 3, "propagate_label": "person",
                 "name_min_letters": 3, "default_labels": ["person", "city"]}  # fmt: skip
INSTRUCTION = "w7 w8"
TOLERANCE = 1e-4


def write_yaml(  # noqa: PLR0913 - one YAML's fields
    models_dir: Path, sie_id: str, weights: Path, tasks: dict, adapter_path: str, options: dict, max_length: int = 96
) -> None:
    data = {"sie_id": sie_id, "weights_path": str(weights), "max_sequence_length": max_length, "tasks": tasks,
            "profiles": {"default": {"adapter_path": adapter_path, "max_batch_tokens": 2048,
                                     "adapter_options": options}}}  # fmt: skip
    (models_dir / f"{sie_id.replace('/', '__')}.yaml").write_text(dump_yaml(data))


class Served:
    def __init__(self, url: str, root: Path, models: dict[str, Any]) -> None:
        self.url, self.root, self.models = url, root, models


def write_recipe_models(root: Path, models_dir: Path) -> dict[str, Any]:
    """The models of the public modules with recipes of their own (Qwen3-VL embedding and reranker on one checkpoint,
    TopK-Embed, the stablebridge context pruner) and their YAMLs; their references by name."""
    models: dict[str, Any] = {}
    models[QWEN3_VL_EMBED] = save_qwen3_vl(root / "weights" / "qwen3-vl")
    write_yaml(models_dir, QWEN3_VL_EMBED, root / "weights" / "qwen3-vl", {"encode": {"dense": {"dim": 32}}},
               "sie_server.adapters.qwen3_vl_embedding:Qwen3VLEmbeddingAdapter", {})  # fmt: skip
    write_yaml(models_dir, QWEN3_VL_RERANK, root / "weights" / "qwen3-vl", {"score": {}},
               "sie_server.adapters.qwen3_vl_reranker.adapter:Qwen3VLRerankerAdapter",
               {"loadtime": {"default_instruction": RERANK_INSTRUCTION}})  # fmt: skip
    (root / "weights" / "topk").mkdir(parents=True)
    models[TOPK] = save_topk(root / "weights" / "topk")
    topk_tasks = {"encode": {"multivector": {"dim": OUTPUT_DIM}}, "score": {}}
    write_yaml(models_dir, TOPK, root / "weights" / "topk", topk_tasks,
               "sie_server.adapters.topk_embed.adapter:TopkEmbedAdapter", {})  # fmt: skip
    models[PRUNER] = save_pruner(root / "weights" / "pruner")
    write_yaml(models_dir, PRUNER, root / "weights" / "pruner" / "model", {"score": {}, "extract": {}},
               "sie_server.adapters.stablebridge_pruner:StablebridgePrunerAdapter",
               {"loadtime": {"pruning_head_path": str(root / "weights" / "pruner" / "head"), "hidden_size": HIDDEN,
                             "intermediate_size": INTERMEDIATE}, "runtime": {"prune_threshold": 0.5}})  # fmt: skip
    return models


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("decoders")
    models_dir = root / "models"
    models_dir.mkdir()
    weights = {name: root / "weights" / name.replace("/", "__") for name in (CHAT, EMBED, RERANK)}
    models = {
        CHAT: save_causal_lm(weights[CHAT], "qwen3"),
        EMBED: save_base_model(weights[EMBED], "qwen3", seed=1),
        RERANK: save_causal_lm(weights[RERANK], "qwen3", seed=2),
    }
    chat_tasks = {"generate": {"context_length": 96, "max_output_tokens": 32}}
    for name, family in {CHAT: "qwen3", **OTHER_CHATS}.items():
        directory = root / "weights" / name.replace("/", "__")
        if name != CHAT:
            models[name] = save_causal_lm(directory, family)
        write_yaml(models_dir, name, directory, chat_tasks, GENERATION_MODULES.get(family, GENERATION_MODULE), {})
    models[NVEMBED] = save_nvembed(root / "weights" / "nvembed")
    (models_dir / "tiny__nv-embed.yaml").write_text(dump_yaml(public_yaml(root / "weights" / "nvembed", NVEMBED)))
    models[DEBERTA] = save_deberta_cross_encoder(root / "weights" / "deberta")
    write_yaml(models_dir, DEBERTA, root / "weights" / "deberta", {"score": {}},
               "sie_server.adapters.cross_encoder:CrossEncoderAdapter", {})  # fmt: skip
    models |= write_recipe_models(root, models_dir)
    models[GLINER] = save_gliner(root / "weights" / "gliner")
    write_yaml(models_dir, GLINER, root / "weights" / "gliner" / "gliner", {"extract": {}},
               "sie_server.adapters.gliner:GLiNERAdapter", {"runtime": {"threshold": 0.27}})  # fmt: skip
    models[RELEX] = save_gliner(root / "weights" / "relex", relations_layer="dot")
    write_yaml(models_dir, RELEX, root / "weights" / "relex" / "gliner", {"extract": {}},
               "sie_server.adapters.gliner:GLiNERAdapter", {"runtime": {"relation_threshold": 0.5}})  # fmt: skip
    models[GLICLASS] = save_gliclass(root / "weights" / "gliclass", pooling_strategy="first", prompt_first=True,
                                     embed_class_token=False)  # fmt: skip
    write_yaml(models_dir, GLICLASS, root / "weights" / "gliclass", {"extract": {}},
               "sie_server.adapters.gliclass:GLiClassAdapter",
               {"loadtime": {"classification_type": "single-label"}, "runtime": {"threshold": 0.0}})  # fmt: skip
    models[NLI] = save_nli_classifier(root / "weights" / "nli", seed=5)
    write_yaml(models_dir, NLI, root / "weights" / "nli", {"extract": {}},
               "sie_server.adapters.nli_classification_flash:NLIClassificationFlashAdapter",
               {"runtime": {"hypothesis_template": "This text is about {}.", "multi_label": False}})  # fmt: skip
    models[GLIREL] = save_glirel(root / "weights" / "glirel")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):  # the backbone's, beside the checkpoint
        shutil.copy(root / "weights" / "glirel" / "backbone" / name, root / "weights" / "glirel" / "glirel" / name)
    write_yaml(models_dir, GLIREL, root / "weights" / "glirel" / "glirel", {"extract": {}},
               "sie_server.adapters.glirel:GLiRELAdapter", {"runtime": {"threshold": 0.1}})  # fmt: skip
    models[GLINER2] = save_gliner2(root / "weights" / "gliner2", seed=3)
    write_yaml(models_dir, GLINER2, root / "weights" / "gliner2" / "gliner2", {"extract": {}},
               "sie_server.adapters.gliner2.adapter:GLiNER2Adapter", {})  # fmt: skip
    write_yaml(models_dir, DECIDE, root / "weights" / "gliner2" / "gliner2", {"extract": {}},
               "sie_server.adapters.gliner2.decide:GLiNER2DecideAdapter",
               {"loadtime": {"cuda_graphs": "bucketed"}}, max_length=512)  # fmt: skip
    # the same weights reading 512 tokens at once: a structure's prompt and a sentence in one window, as gliner2 reads
    write_yaml(models_dir, GLINER2_LONG, root / "weights" / "gliner2" / "gliner2", {"extract": {}},
               "sie_server.adapters.gliner2.adapter:GLiNER2Adapter", {}, max_length=512)  # fmt: skip
    guard = {"classification_task": "prompt_safety", "default_labels": ["safe", "unsafe"], "multi_label": False,
             "positive_label": "unsafe"}  # fmt: skip
    write_yaml(models_dir, GUARD, root / "weights" / "gliner2" / "gliner2", {"extract": {}},
               "sie_server.adapters.gliner2.classification:GLiNER2ClassificationAdapter",
               {"loadtime": guard})  # fmt: skip
    # A union: the GLiNER checkpoint above and a token-level member the server fetches from its Hub cache.
    models[MEMBER] = save_gliner(root / "weights" / "member", span_mode="token_level", seed=7)
    seed_hub_snapshot(root / "cache", MEMBER, MEMBER_REVISION, root / "weights" / "member" / "gliner")
    members = [{"model": MEMBER, "revision": MEMBER_REVISION, "options": {"merge_adjacent_entities": True}}]
    write_yaml(models_dir, UNION, root / "weights" / "gliner" / "gliner", {"extract": {}},
               "sie_server.adapters.gliner_union.adapter:GLiNERUnionAdapter",
               {"loadtime": {"members": members}, "runtime": UNION_OPTIONS})  # fmt: skip
    embed_options = {"loadtime": {"causal": True}, "runtime": {
        "pooling": "last", "normalize": True, "query_template": "Instruct: {instruction}\nQuery:{text}",
        "default_instruction": INSTRUCTION}}  # fmt: skip
    write_yaml(models_dir, EMBED, weights[EMBED], {"encode": {"dense": {"dim": 32}}},
               "sie_server.adapters.qwen2_flash:Qwen2FlashAdapter", embed_options)  # fmt: skip
    rerank_options = {"loadtime": {"yes_token": "yes", "no_token": "no", "input_format": "qwen3",
                                   "score_mode": "log_softmax", "default_instruction": INSTRUCTION}}  # fmt: skip
    write_yaml(models_dir, RERANK, weights[RERANK], {"score": {}},
               "sie_server.adapters.qwen2_flash_cross_encoder.adapter:Qwen2FlashCrossEncoderAdapter",
               rerank_options)  # fmt: skip
    # Offline, as a deployment without the Hub: the union's member comes from the cache's hub/ snapshot.
    env = {"SIE_MODELS_DIR": str(models_dir), "SIE_MODEL_CACHE": str(root / "cache"), "SIE_HF_FALLBACK": "false"}
    with serving_all(root / "server.log", ["--bundles-dir", str(REPO / "config" / "bundles")], env) as url:
        yield Served(url, root, models)


def save_deberta_cross_encoder(directory: Path) -> Any:
    """A DeBERTa-v3-shaped cross-encoder (one label), random, with a word-level tokenizer that joins a pair as
    `[CLS] a [SEP] b [SEP]`."""
    import torch
    import transformers

    from support.encoder_checkpoints import write_tokenizer as write_encoder_tokenizer

    config = transformers.DebertaV2Config(
        hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48, vocab_size=99,
        max_position_embeddings=64, relative_attention=True, position_buckets=8, max_relative_positions=16,
        pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False,
        type_vocab_size=0, pad_token_id=0, num_labels=1,
    )  # fmt: skip
    torch.manual_seed(3)
    model = transformers.DebertaV2ForSequenceClassification(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(directory)
    write_encoder_tokenizer(directory, "distilbert")  # BERT-style specials, no token types
    return model


def reference_text(served: Served, prompt: str, tokens: int, name: str = CHAT) -> str:
    import torch

    tokenizer = write_tokenizer(served.root / "reference-tokenizer")
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        out = served.models[name].generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens,
                                           do_sample=False, pad_token_id=0)  # fmt: skip
    return tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)


def test_the_openai_client_chats_as_transformers_generates(served: Served) -> None:
    import openai

    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=120, max_retries=3) as client:
        messages = [{"role": "user", "content": "w3 w4 w5"}]
        # the checkpoint's chat template renders one user turn and opens the assistant's
        expected = reference_text(served, "<|im_start|>user w3 w4 w5<|im_end|><|im_start|>assistant", 16)
        reply = client.chat.completions.create(model=CHAT, messages=messages, temperature=0, max_tokens=16)
        assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "length"
        stream = client.chat.completions.create(
            model=CHAT, messages=messages, temperature=0, max_tokens=16, stream=True
        )
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected
        response = client.responses.create(model=CHAT, input="w3 w4 w5", temperature=0, max_output_tokens=16)
        assert response.output_text == expected and response.status == "incomplete"
        streamed = client.responses.create(
            model=CHAT, input="w3 w4 w5", temperature=0, max_output_tokens=16, stream=True
        )
        assert "".join(event.delta for event in streamed if event.type == "response.output_text.delta") == expected


def queries_and_documents(public_sdk, url: str, model: str, texts: list[str]) -> tuple[list, list]:  # noqa: ANN001
    """The public SDK's encode of `texts` as queries, then as documents."""
    client = public_sdk.SIEClient(url, timeout_s=120)
    try:
        queries = client.encode(model, [{"text": t} for t in texts], is_query=True, wait_for_capacity=True)
        documents = client.encode(model, [{"text": t} for t in texts], wait_for_capacity=True)
    finally:
        client.close()
    return queries, documents


def test_the_public_sdk_encodes_with_the_instruction_template_and_last_token(served: Served, public_sdk) -> None:
    import torch

    texts = ["w1 w2 w3", "w9"]
    queries, documents = queries_and_documents(public_sdk, served.url, EMBED, texts)
    tokenizer = write_tokenizer(served.root / "embed-tokenizer", end_with_eos=True)
    for text, query, document in zip(texts, queries, documents, strict=True):
        for seen, result in ((f"Instruct: {INSTRUCTION}\nQuery:{text}", query), (text, document)):
            with torch.no_grad():
                hidden = served.models[EMBED](torch.tensor([tokenizer.encode(seen).ids])).last_hidden_state[0, -1]
            expected = torch.nn.functional.normalize(hidden, dim=-1).numpy()
            assert float(np.abs(np.asarray(result["dense"], dtype=np.float32) - expected).max()) <= TOLERANCE


def test_the_public_sdk_encodes_with_nv_embeds_recipe(served: Served, public_sdk) -> None:
    texts = ["w1 w2 w3", "w5 w6 w7 w8 w9 w10 w11"]
    queries, documents = queries_and_documents(public_sdk, served.url, NVEMBED, texts)
    reference, latent = served.models[NVEMBED]
    directory = served.root / "weights" / "nvembed"
    prefix = TEMPLATE.replace("{instruction}", INSTRUCTION).replace("{text}", "")
    masked = len(prefix.split())  # len(tokenizer.tokenize(instruction)), as the model's own encode() counts
    expected_queries = [reference_vector(reference, latent, recipe_ids(directory, prefix + t), masked) for t in texts]
    expected_documents = [reference_vector(reference, latent, recipe_ids(directory, t), 0) for t in texts]
    for result, expected in zip([*queries, *documents], [*expected_queries, *expected_documents], strict=True):
        assert float(np.abs(np.asarray(result["dense"], dtype=np.float32) - expected).max()) <= TOLERANCE


def test_the_public_sdk_scores_with_the_qwen3_reranker_prompt(served: Served, public_sdk) -> None:
    import torch

    query, documents = "w1 w2", ["w1 w2 w3", "w20 w21"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        scored = client.score(RERANK, {"text": query}, [{"text": d} for d in documents], wait_for_capacity=True)
    finally:
        client.close()
    tokenizer = write_tokenizer(served.root / "rerank-tokenizer")
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
        'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"  # fmt: skip
    ours = {row["item_id"]: row["score"] for row in scored["scores"]}
    for index, document in enumerate(documents):
        middle = f"<Instruct>: {INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        ids = tokenizer.encode(prefix).ids + tokenizer.encode(middle).ids + tokenizer.encode(suffix).ids
        with torch.no_grad():
            logits = served.models[RERANK](torch.tensor([ids])).logits[0, -1]
        pair = logits[[tokenizer.token_to_id("no"), tokenizer.token_to_id("yes")]]
        assert abs(ours[f"item-{index}"] - torch.softmax(pair, -1)[1].item()) <= TOLERANCE


@pytest.mark.parametrize("name", sorted(OTHER_CHATS))
def test_every_decoder_family_chats_as_transformers_generates(served: Served, name: str) -> None:
    import openai

    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", timeout=120, max_retries=3) as client:
        expected = reference_text(served, "<|im_start|>user w5 w6 w7 w8<|im_end|><|im_start|>assistant", 12, name)
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "w5 w6 w7 w8"}],
                                               temperature=0, max_tokens=12)  # fmt: skip
        assert reply.choices[0].message.content == expected


def test_qwen3_vl_embeds_and_reranks_text_through_the_public_sdk(served: Served, public_sdk) -> None:
    """The public qwen3_vl_embedding and qwen3_vl_reranker modules over HTTP on one Qwen3-VL checkpoint: each text
    written into the chat template and its last token's state, each pair's sigmoid(yes − no), as their recipes."""
    texts, documents = ["w1 w2 w3", "w9"], ["w1 w2 w3", "w20 w21", "w5"]
    queries, passages = queries_and_documents(public_sdk, served.url, QWEN3_VL_EMBED, texts)
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        scored = client.score(QWEN3_VL_RERANK, {"text": "w1 w2"}, [{"text": d} for d in documents],
                              wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    model, tokenizer = served.models[QWEN3_VL_EMBED], reference_tokenizer(served.root / "weights" / "qwen3-vl")
    for text, query, passage in zip(texts, queries, passages, strict=True):
        expected = embedding(model, tokenizer, text, "Represent the user's input.")
        for result in (query, passage):  # no instruction: queries and documents alike
            assert float(np.abs(np.asarray(result["dense"], dtype=np.float32) - expected).max()) <= TOLERANCE
    ours = {row["item_id"]: row["score"] for row in scored["scores"]}
    for index, document in enumerate(documents):
        assert abs(ours[f"item-{index}"] - rerank_score(model, tokenizer, "w1 w2", document)) <= TOLERANCE


def test_topk_embed_gives_token_vectors_and_maxsim_scores_through_the_public_sdk(served: Served, public_sdk) -> None:
    """TopK-Embed over HTTP: each text's token vectors as its recipe gives them (queries and documents prompted
    apart, documents without their skip ids), and a query's MaxSim score against each document."""
    texts, documents = ["w1 w2 w3", "w4 w9"], ["w5 w3 w6 w7", "w11 w12"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        queries = client.encode(TOPK, [{"text": t} for t in texts], output_types=["multivector"], is_query=True,
                                wait_for_capacity=True)  # fmt: skip
        passages = client.encode(TOPK, [{"text": d} for d in documents], output_types=["multivector"],
                                 wait_for_capacity=True)  # fmt: skip
        scored = client.score(TOPK, {"text": texts[0]}, [{"text": d} for d in documents], wait_for_capacity=True)
    finally:
        client.close()
    reference = served.models[TOPK]
    for results, inputs, is_query in ((queries, texts, True), (passages, documents, False)):
        for result, text in zip(results, inputs, strict=True):
            ours, expected = np.asarray(result["multivector"], dtype=np.float32), reference.vectors(text, is_query)
            assert ours.shape == expected.shape and float(np.abs(ours - expected).max()) <= TOLERANCE
    query = reference.vectors(texts[0], True)
    ours = {row["item_id"]: row["score"] for row in scored["scores"]}
    for index, document in enumerate(documents):
        maxsim = float((query @ reference.vectors(document, False).T).max(axis=1).sum())
        assert abs(ours[f"item-{index}"] - maxsim) <= TOLERANCE


def test_a_context_pruner_scores_and_prunes_through_the_public_sdk(served: Served, public_sdk) -> None:
    """The public SDK's score and extract on a stablebridge context pruner: scores as its cross-encoder, and per
    passage a summary and its spans with the profile's prune threshold, or the request's own, equal to the public
    recipe (the request's instruction is the query)."""
    passages = ["w3 w9 w14 w2 w33 w7 w61 w5", "w40 w41 w42 w43 w44"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        scored = client.score(PRUNER, {"text": "w1 w2"}, [{"text": p} for p in passages], wait_for_capacity=True)
        pruned = client.extract(PRUNER, [{"text": p} for p in passages], instruction="w1 w2", wait_for_capacity=True)
        own = client.extract(
            PRUNER,
            [{"text": passages[0]}],
            instruction="w1 w2",
            options={"prune_threshold": 0.2, "highlight_threshold": 0.6},
            wait_for_capacity=True,
        )
    finally:
        client.close()
    reference = served.models[PRUNER]
    ours = {row["item_id"]: row["score"] for row in scored["scores"]}
    for index, expected in enumerate(reference.scores("w1 w2", passages)):
        assert abs(ours[f"item-{index}"] - expected) <= TOLERANCE
    for result, passage, thresholds in ((pruned[0], passages[0], (0.5, 0.9)), (pruned[1], passages[1], (0.5, 0.9)),
                                        (own[0], passages[0], (0.2, 0.6))):  # fmt: skip
        expected = reference.entities("w1 w2", passage, *thresholds)
        got = [(e["label"], e["start"], e["end"], e["text"]) for e in result["entities"]]
        assert got == [(e["label"], e["start"], e["end"], e["text"]) for e in expected]
        assert max(abs(a["score"] - b["score"]) for a, b in zip(result["entities"], expected, strict=True)) <= TOLERANCE


def test_a_deberta_cross_encoder_scores_as_transformers_does(served: Served, public_sdk) -> None:
    import torch
    from tokenizers import Tokenizer

    query, documents = "w1 w2", ["w1 w2 w3", "w20 w21", "w5"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        scored = client.score(DEBERTA, {"text": query}, [{"text": d} for d in documents], wait_for_capacity=True)
    finally:
        client.close()
    tokenizer = Tokenizer.from_file(str(served.root / "weights" / "deberta" / "tokenizer.json"))
    ours = {row["item_id"]: row["score"] for row in scored["scores"]}
    for index, document in enumerate(documents):
        ids = torch.tensor([tokenizer.encode(query, document).ids])
        with torch.no_grad():
            logit = served.models[DEBERTA](ids).logits[0, 0]
        assert abs(ours[f"item-{index}"] - float(torch.sigmoid(logit))) <= TOLERANCE


def test_a_gliner_model_extracts_the_labels_each_request_names(served: Served, public_sdk) -> None:
    import httpx

    texts = ["Steve Jobs founded Apple in Cupertino California in 1976.", "Marie Curie won the Nobel Prize."]
    labels = ["person", "organization", "city", "award"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        results = client.extract(GLINER, [{"text": t} for t in texts], labels=labels, wait_for_capacity=True)
        nested = client.extract(GLINER, [{"text": texts[0]}], labels=labels[:2],
                                options={"threshold": 0.25, "flat_ner": False}, wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    with SIEClient(served.url, timeout_s=120) as ours_client:  # our client: the same results, its own request id
        mine = ours_client.extract(GLINER, [{"text": t} for t in texts], labels=labels)
    assert mine[0]["request"]["id"] and mine[0]["request"]["id"] != results[0]["request"]["id"]

    def without_request(listed: list[dict]) -> list[dict]:
        return [{key: value for key, value in result.items() if key != "request"} for result in listed]

    assert without_request(mine) == without_request(results)
    expected = served.models[GLINER].inference(texts, labels, threshold=0.27)  # the YAML's runtime threshold
    (expected_nested,) = served.models[GLINER].inference(texts[:1], labels[:2], threshold=0.25, flat_ner=False)
    assert any(expected) and expected_nested
    for result, theirs in zip([*results, *nested], [*expected, expected_nested], strict=True):
        ours = result["entities"]
        assert [(e["start"], e["end"], e["label"], e["text"]) for e in ours] == [
            (e["start"], e["end"], e["label"], e["text"]) for e in theirs
        ]
        assert np.allclose([e["score"] for e in ours], [e["score"] for e in theirs], atol=TOLERANCE, rtol=0)
    # labels are checked before anything is queued: required, bounded, non-blank
    url = f"{served.url}/v1/extract/{GLINER}"
    for params, message in [
        ({}, "Field 'labels' is required"),
        ({"labels": ["x"] * 1001}, "at most 1000"),
        ({"labels": ["person", " "]}, "Label 1 must be a non-blank string"),
        ({"labels": ["person"], "options": {"relation_labels": ["born in"]}}, "relation_labels"),
    ]:
        response = httpx.post(url, json={"items": [{"text": texts[0]}], "params": params}, timeout=60)
        assert response.status_code == 400 and message in response.text, (params, response.text)


def test_a_gliner_relation_model_extracts_entities_and_the_relations_asked_for(served: Served, public_sdk) -> None:
    texts = ["Steve Jobs founded Apple in Cupertino California in 1976.", "Barack Obama was born in Honolulu, Hawaii."]
    labels, relations = ["person", "organization", "city"], ["founded", "born in"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        results = client.extract(
            RELEX,
            [{"text": t} for t in texts],
            labels=labels,
            options={"threshold": 0.3, "relation_labels": relations},
            wait_for_capacity=True,
        )
        (plain,) = client.extract(RELEX, [{"text": texts[0]}], labels=labels, options={"threshold": 0.3},
                                  wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    # the YAML's runtime relation threshold; the adjacency threshold at the public server's floor
    entities, found = served.models[RELEX].inference(texts, labels, relations=relations, threshold=0.3,
                                                     adjacency_threshold=0.5, relation_threshold=0.5,
                                                     return_relations=True)  # fmt: skip
    assert any(found)
    for result, their_entities, theirs in zip(results, entities, found, strict=True):
        assert [(e["start"], e["end"], e["label"]) for e in result["entities"]] == [
            (e["start"], e["end"], e["label"]) for e in their_entities
        ]
        ours = sorted((r["head"], r["tail"], r["relation"], r["score"]) for r in result["relations"])
        expected = sorted((r["head"]["text"], r["tail"]["text"], r["relation"], r["score"]) for r in theirs)
        assert [r[:3] for r in ours] == [r[:3] for r in expected]
        assert np.allclose([r[3] for r in ours], [r[3] for r in expected], atol=TOLERANCE, rtol=0)
    # without relation types the prompt names none (the entities' scores move with the prompt, as in gliner)
    ((their_plain,), _) = served.models[RELEX].inference(texts[:1], labels, relations=[], threshold=0.3,
                                                         return_relations=True)  # fmt: skip
    assert plain["relations"] == [] and their_plain
    assert np.allclose([e["score"] for e in plain["entities"]], [e["score"] for e in their_plain], atol=TOLERANCE,
                       rtol=0)  # fmt: skip


def test_a_typed_decision_model_answers_questions_and_label_groups(served: Served, public_sdk) -> None:
    import httpx

    text = "Apple released a new phone and fans loved it"
    questions = {
        "tone": {"type": "choice", "instructions": "What is the tone?",
                 "criteria": {"happy": "the writer is pleased", "angry": "the writer is upset"}},
        "bought": {"type": "noul", "instructions": "Did someone buy it?"},
    }  # fmt: skip
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (answered,) = client.extract(DECIDE, [{"text": text}], output_schema=questions, wait_for_capacity=True)
        (grouped,) = client.extract(DECIDE, [{"text": text}], options={"label_groups": {"topic": ["tech", "sport"]}},
                                    wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    # gliner2's logits for the same tasks read together (its multi-label sigmoids, turned back)
    reference = served.models[GLINER2]
    schema = reference.create_schema()
    schema.classification("tone", {"happy": "the writer is pleased", "angry": "the writer is upset"},
                          multi_label=True, cls_threshold=0.0, prompt="What is the tone?")  # fmt: skip
    schema.classification("bought", ["yes", "no"], multi_label=True, cls_threshold=0.0, prompt="Did someone buy it?")
    found = reference.extract(text, schema, threshold=0.0, include_confidence=True)

    def softmax_of(task: str, labels: list[str]) -> np.ndarray:
        sigmoid = {entry["label"]: entry["confidence"] for entry in found[task]}
        logits = np.array([np.log(sigmoid[label] / (1 - sigmoid[label])) for label in labels])
        return np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()

    tone, bought = softmax_of("tone", ["happy", "angry"]), softmax_of("bought", ["yes", "no"])
    data = answered["data"]
    assert data["tone"]["choice"] == ["happy", "angry"][int(np.argmax(tone))]
    assert np.allclose([data["tone"]["probabilities"][key] for key in ("happy", "angry")], tone, atol=TOLERANCE)
    assert abs(data["bought"]["noul"] - bought[0]) <= TOLERANCE and answered["classifications"] == []
    assert {entry["label"] for entry in grouped["classifications"]} == {"topic.tech", "topic.sport"}
    assert grouped["data"]["topic"]["choice"] in ("tech", "sport")
    # a question the model cannot read is a 400 before anything is queued
    response = httpx.post(
        f"{served.url}/v1/extract/{DECIDE}",
        timeout=60,
        json={"items": [{"text": text}], "params": {"output_schema": {"q": {"type": "guess", "instructions": "?"}}}},
    )
    assert response.status_code == 400 and "type must be one of" in response.text, response.text


def test_a_gliner_union_extracts_as_the_study_composes_its_members(served: Served, public_sdk) -> None:
    import httpx

    text = ("Steve Jobs met Tim Cook in Cupertino. Later Jobs and Cook walked to Apple with Laurene Powell Jobs and "
            "Cook again, and Tim Cook spoke of Jobs in Cupertino and Palo Alto.")  # fmt: skip
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (labelled,) = client.extract(UNION, [{"text": text}], labels=["person", "organization"],
                                     wait_for_capacity=True)  # fmt: skip
        (defaults,) = client.extract(UNION, [{"text": text}], options={"score_floor": 0.5}, wait_for_capacity=True)
    finally:
        client.close()
    members = [(served.models[GLINER], {}), (served.models[MEMBER], {"merge_adjacent_entities": True})]
    for result, labels, options in [(labelled, ["person", "organization"], {}), (defaults, ["person", "city"],
                                                                                {"score_floor": 0.5})]:  # fmt: skip
        expected = reference_union(members, text, labels, UNION_OPTIONS | options)
        assert expected
        ours = result["entities"]
        assert [(e["start"], e["end"], e["label"]) for e in ours] == [x[:3] for x in expected]
        assert np.allclose([e["score"] for e in ours], [x[3] for x in expected], atol=TOLERANCE, rtol=0)
    url = f"{served.url}/v1/extract/{UNION}"
    for params, message in [
        ({"options": {"window_words": 5, "window_overlap": 5}}, "must be less than 'window_words'"),
        ({"options": {"threshold": 0.3}}, "Option 'threshold' does not apply"),
        ({"options": {"default_labels": ["x"] * 1001}}, "at most 1000"),
    ]:
        response = httpx.post(url, json={"items": [{"text": text}], "params": params}, timeout=60)
        assert response.status_code == 400 and message in response.text, (params, response.text)


def test_a_gliner2_model_extracts_entities_and_classifies_as_gliner2(served: Served, public_sdk) -> None:
    import httpx

    text, labels = "Steve Jobs founded Apple in Cupertino California in 1976.", ["person", "organization", "city"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (entities,) = client.extract(GLINER2, [{"text": text}], labels=labels, options={"threshold": 0.8},
                                     wait_for_capacity=True)  # fmt: skip
        (guarded,) = client.extract(GUARD, [{"text": text}], options={"threshold": 0.0}, wait_for_capacity=True)
    finally:
        client.close()
    reference = served.models[GLINER2]
    found = reference.extract_entities(text, labels, threshold=0.8, include_confidence=True,
                                       include_spans=True)["entities"]  # fmt: skip
    expected = sorted(((span["start"], span["end"], label, span["confidence"]) for label, spans in found.items()
                       for span in spans), key=lambda one: one[0])  # fmt: skip
    assert expected
    ours = entities["entities"]
    assert [(e["start"], e["end"], e["label"]) for e in ours] == [x[:3] for x in expected]
    assert np.allclose([e["score"] for e in ours], [x[3] for x in expected], atol=TOLERANCE, rtol=0)
    tasks = {"prompt_safety": {"labels": ["safe", "unsafe"], "multi_label": False, "cls_threshold": 0.0}}
    theirs = reference.classify_text(text, tasks, threshold=0.0, include_confidence=True)["prompt_safety"]
    (ours_class,) = guarded["classifications"]
    assert ours_class["label"] == theirs["label"] and abs(ours_class["score"] - theirs["confidence"]) <= TOLERANCE
    # relations between the entities an item names, of the request's types
    # (the random model's best head and tail here are one span, "founded Apple in Cupertino": named, so kept)
    text_entities = [{"text": "Steve Jobs", "label": "person", "start": 0, "end": 10},
                     {"text": "founded Apple in Cupertino", "label": "event", "start": 11, "end": 37}]  # fmt: skip
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (related,) = client.extract(GLINER2, [{"text": text, "metadata": {"entities": text_entities}}],
                                    labels=["founded"], options={"threshold": 0.0}, wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    found = reference.extract_relations(text, ["founded"], threshold=0.0, include_confidence=True,
                                        include_spans=True)["relation_extraction"]["founded"]  # fmt: skip
    named = {entity["text"] for entity in text_entities}
    kept = {(one["head"]["text"], one["tail"]["text"]): min(one["head"]["confidence"], one["tail"]["confidence"])
            for one in found if one["head"]["text"] in named and one["tail"]["text"] in named}  # fmt: skip
    assert kept
    assert {(r["head"], r["tail"]): r["score"] for r in related["relations"]} == pytest.approx(kept, abs=TOLERANCE)
    assert [e["text"] for e in related["entities"]] == ["Steve Jobs", "founded Apple in Cupertino"]
    # structured extraction: an output_schema's properties filled as gliner2 fills the public adapter's structure
    strings = {"type": "array", "items": {"type": "string"}}
    tone = {"type": "string", "enum": ["positive", "negative"]}
    schema = {"type": "object", "properties": {"founder": {"type": "string"}, "places": strings, "tone": tone}}
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (structured,) = client.extract(GLINER2_LONG, [{"text": text}], output_schema=schema,
                                       options={"threshold": 0.01}, wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    specs = ["founder::str", "places::list", "tone::[positive|negative]::str"]
    (found,) = reference.batch_extract_json([text], {"_sie_root": specs}, threshold=0.01)
    assert found["_sie_root"] and structured["data"] == found["_sie_root"][0]
    # what is not built is refused before anything is queued where the gateway can tell
    response = httpx.post(
        f"{served.url}/v1/extract/{GLINER2}",
        timeout=60,
        json={"items": [{"text": text}], "params": {"labels": labels, "options": {"top_k": 3}}},
    )
    assert response.status_code == 400 and "does not apply to a GLiNER2" in response.text
    response = httpx.post(f"{served.url}/v1/extract/{GLINER2}", timeout=60,
                          json={"items": [{"text": text}], "params": {"output_schema": {"type": "array"}}})  # fmt: skip
    assert response.status_code == 400 and "must be a JSON Schema of type 'object'" in response.text


def test_zero_shot_classifiers_score_the_labels_each_request_names(served: Served, public_sdk) -> None:
    import transformers
    from gliclass import ZeroShotClassificationPipeline

    text, labels = "Steve Jobs founded Apple in Cupertino California in 1976.", ["person", "organization", "city"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (gliclass,) = client.extract(GLICLASS, [{"text": text}], labels=labels, wait_for_capacity=True)
        (grouped,) = client.extract(GLICLASS, [{"text": text}],
                                    options={"label_groups": {"kind": labels[:2], "place": labels[2:] + ["award"]}},
                                    wait_for_capacity=True)  # fmt: skip
        (nli,) = client.extract(NLI, [{"text": text}], labels=labels, wait_for_capacity=True)
    finally:
        client.close()
    model, tokenizer = served.models[GLICLASS]
    pipeline = ZeroShotClassificationPipeline(model, tokenizer, classification_type="single-label", device="cpu",
                                              progress_bar=False)  # fmt: skip
    (best,) = pipeline([text], labels, threshold=0.0, batch_size=1)[0]
    ours = {c["label"]: c["score"] for c in gliclass["classifications"]}
    assert max(ours, key=ours.get) == best["label"] and abs(ours[best["label"]] - best["score"]) <= TOLERANCE
    assert sorted(c["label"] for c in grouped["classifications"]) == sorted(
        ["kind.person", "kind.organization", "place.city", "place.award"]
    )
    assert set(grouped["data"]) == {"kind", "place"}
    nli_tokenizer = transformers.AutoTokenizer.from_pretrained(served.root / "weights" / "nli")
    zero_shot = transformers.pipeline("zero-shot-classification", model=served.models[NLI], tokenizer=nli_tokenizer)
    expected = zero_shot(text, labels, hypothesis_template="This text is about {}.")
    assert [c["label"] for c in nli["classifications"]] == expected["labels"]
    assert np.allclose([c["score"] for c in nli["classifications"]], expected["scores"], atol=TOLERANCE, rtol=0)


def test_a_glirel_model_relates_the_entities_each_item_names(served: Served, public_sdk) -> None:
    import httpx

    text = "Steve Jobs founded Apple in Cupertino, California in 1976."
    names = ["Steve Jobs", "Apple", "Cupertino"]
    entities = [{"text": n, "label": "thing", "start": text.index(n), "end": text.index(n) + len(n)} for n in names]
    relations = ["founded by", "located in", "born in"]
    client = public_sdk.SIEClient(served.url, timeout_s=120)
    try:
        (result,) = client.extract(GLIREL, [{"text": text, "metadata": {"entities": entities}}], labels=relations,
                                   options={"top_k": 1}, wait_for_capacity=True)  # fmt: skip
    finally:
        client.close()
    words = text.replace(",", " ,").replace(".", " .").split()
    ner = [[0, 1, "thing", "Steve Jobs"], [3, 3, "thing", "Apple"], [5, 5, "thing", "Cupertino"]]
    theirs = served.models[GLIREL].predict_relations(words, relations, threshold=0.1, ner=ner, top_k=1)
    assert theirs  # the YAML's runtime threshold finds relations
    ours = {(r["head"], r["tail"], r["relation"]): r["score"] for r in result["relations"]}
    expected = {(" ".join(r["head_text"]), " ".join(r["tail_text"]), r["label"]): r["score"] for r in theirs}
    assert sorted(ours) == sorted(expected)
    assert all(abs(ours[key] - expected[key]) <= TOLERANCE for key in expected)
    assert [e["text"] for e in result["entities"]] == names
    # the entities are checked before the model runs: a request without them is refused
    url = f"{served.url}/v1/extract/{GLIREL}"
    response = httpx.post(url, json={"items": [{"text": text}], "params": {"labels": relations}}, timeout=60)
    assert response.status_code == 400 and "metadata.entities" in response.text, response.text
