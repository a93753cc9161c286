"""Tiny random checkpoints of each BERT-like encoder family, built and saved by transformers itself (its own tensor
names, prefixes, ties and shards), and a word-level `tokenizer.json` in the family's style (`[CLS] … [SEP]` or
`<s> … </s>`, its padding id). Shared by the converter tests, the sentence-transformers tests and the end-to-end
family test. torch and transformers (the test extra) are imported when a model is built, not when this module is:
pytest-xdist collects every module on every worker, and only the worker that runs these tests should pay for them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

if TYPE_CHECKING:
    import torch

HIDDEN, HEADS, LAYERS, INTERMEDIATE, VOCAB, POSITIONS, LABELS = 32, 4, 2, 64, 99, 40, 3
WORDS = [f"w{index}" for index in range(VOCAB - 4)]

BERT_LIKE = {"hidden_size": HIDDEN, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS,
             "intermediate_size": INTERMEDIATE, "vocab_size": VOCAB, "max_position_embeddings": POSITIONS}  # fmt: skip

FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "mpnet", "modernbert", "distilbert")
HEADS_BUILT = ("none", "mean", "cls", "seq-cls", "token-cls", "mlm-splade")


def family_config(family: str) -> Any:
    """The family's transformers config, tiny."""
    import transformers

    configs = {
        "bert": lambda: transformers.BertConfig(**BERT_LIKE, type_vocab_size=2, pad_token_id=0),
        # RoBERTa's positions start after padding_idx: positions need padding_idx + 1 + length rows.
        "roberta": lambda: transformers.RobertaConfig(**BERT_LIKE, type_vocab_size=1, pad_token_id=1),
        "xlm-roberta": lambda: transformers.XLMRobertaConfig(**BERT_LIKE, type_vocab_size=1, pad_token_id=1),
        "camembert": lambda: transformers.CamembertConfig(**BERT_LIKE, type_vocab_size=1, pad_token_id=1),
        # ELECTRA with narrower embeddings than its hidden size: the projection is part of the graph.
        "electra": lambda: transformers.ElectraConfig(**BERT_LIKE, embedding_size=16, type_vocab_size=2,
                                                      pad_token_id=0),
        # MPNet: relative position bias over T5-style buckets on top of RoBERTa-like positions (padding id 1).
        "mpnet": lambda: transformers.MPNetConfig(**BERT_LIKE, pad_token_id=1),
        # ModernBERT: a global layer then two local ones with a window of +-2 tokens (shorter than the test texts),
        # mean pooling before its classifier.
        "modernbert": lambda: transformers.ModernBertConfig(
            **BERT_LIKE | {"num_hidden_layers": 3}, local_attention=4, pad_token_id=0, classifier_pooling="mean",
        ),
        "distilbert": lambda: transformers.DistilBertConfig(
            vocab_size=VOCAB, max_position_embeddings=POSITIONS, dim=HIDDEN, n_heads=HEADS, n_layers=LAYERS,
            hidden_dim=INTERMEDIATE, pad_token_id=0,
        ),
    }  # fmt: skip
    return configs[family]()


def task_model_class(head: str) -> Any:
    """The transformers class whose checkpoint a head is built from."""
    import transformers

    return {
        "none": transformers.AutoModel,
        "mean": transformers.AutoModel,
        "cls": transformers.AutoModel,
        "seq-cls": transformers.AutoModelForSequenceClassification,
        "token-cls": transformers.AutoModelForTokenClassification,
        "mlm-splade": transformers.AutoModelForMaskedLM,
    }[head]


# The families whose tokenizers write RoBERTa's specials: <s>=0, <pad>=1, </s>=2, <unk>=3.
ROBERTA_STYLE = ("roberta", "xlm-roberta", "camembert", "mpnet")


def random_model(family: str, head: str, seed: int = 0, num_labels: int = LABELS) -> torch.nn.Module:
    """The family's model for `head` with every parameter moved well away from its initial value (LayerNorm scales
    included), so each tensor the converter reads changes the output."""
    import torch

    torch.manual_seed(seed)
    config = family_config(family)
    config.num_labels = num_labels
    model = task_model_class(head).from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    return model


def write_tokenizer(directory: Path, family: str) -> Tokenizer:
    """A word-level tokenizer over `w0 … w94` in the family's style, saved as `tokenizer.json` (plus the
    transformers files a `from_pretrained` reads); its ids match the family config's `pad_token_id`."""
    if family in ROBERTA_STYLE:
        start, pad, end, unknown = "<s>", "<pad>", "</s>", "<unk>"
        specials = [start, pad, end, unknown]
    else:
        start, pad, end, unknown = "[CLS]", "[PAD]", "[SEP]", "[UNK]"
        specials = [pad, unknown, start, end]
    vocab = {token: index for index, token in enumerate([*specials, *WORDS])}
    tokenizer = Tokenizer(tokenizer_models.WordLevel(vocab, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    pair_types = ":1" if family in ("bert", "electra") else ""
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{start} $A {end}",
        pair=f"{start} $A {end} $B{pair_types} {end}{pair_types}",
        special_tokens=[(start, vocab[start]), (end, vocab[end])],
    )
    tokenizer.add_special_tokens(specials)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    import transformers

    # The families with token types hand them to the model, as their own tokenizers do (a pair's second text is 1).
    inputs = ["input_ids", "token_type_ids", "attention_mask"] if pair_types else ["input_ids", "attention_mask"]
    transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(directory / "tokenizer.json"), pad_token=pad, unk_token=unknown, cls_token=start,
        sep_token=end, model_input_names=inputs,
    ).save_pretrained(directory)  # fmt: skip
    return tokenizer


def save_checkpoint(
    directory: Path, family: str, head: str, seed: int = 0, num_labels: int = LABELS
) -> torch.nn.Module:
    """`random_model` saved with its tokenizer into `directory`; returns the model (the reference)."""
    model = random_model(family, head, seed, num_labels)
    model.save_pretrained(directory)
    write_tokenizer(directory, family)
    return model


BGE_M3_COLBERT_DIM = 16


def save_bge_m3(directory: Path) -> tuple[Any, Any, Any]:
    """BAAI/bge-m3's layout, tiny: an XLM-R checkpoint with `sparse_linear.pt` and `colbert_linear.pt` saved by
    `torch.save`; returns the model and the two heads (the reference)."""
    import torch

    model = save_checkpoint(directory, "xlm-roberta", "none")
    torch.manual_seed(9)
    sparse, colbert = torch.nn.Linear(HIDDEN, 1), torch.nn.Linear(HIDDEN, BGE_M3_COLBERT_DIM)
    torch.save(sparse.state_dict(), directory / "sparse_linear.pt")
    torch.save(colbert.state_dict(), directory / "colbert_linear.pt")
    return model, sparse, colbert


def bge_m3_reference(model: Any, sparse: Any, colbert: Any, ids: list[int]) -> dict[str, Any]:
    """BGEM3Model's three outputs for one text (FlagEmbedding's math; its unused tokens: cls, eos, pad, unk)."""
    import torch

    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids))).last_hidden_state
        dense = torch.nn.functional.normalize(hidden[:, 0], dim=-1)[0].numpy()
        token_weights = torch.relu(sparse(hidden))[0, :, 0].numpy()
        vectors = torch.nn.functional.normalize(colbert(hidden[:, 1:]), dim=-1)[0].numpy()
    unused = {0, 1, 2, 3}  # <s>, <pad>, </s>, <unk> of the test tokenizer
    weights: dict[int, float] = {}
    repeated = 0
    for token, weight in zip(ids, token_weights, strict=True):
        if token not in unused and weight > 0:
            repeated += token in weights
            weights[token] = max(weights.get(token, 0.0), float(weight))
    return {"dense": dense, "sparse": weights, "multivector": vectors[: len(ids) - 1], "repeated": repeated}
