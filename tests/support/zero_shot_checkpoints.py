"""Tiny random zero-shot checkpoints built and saved by their own packages (their tensor names, configs and tokenizer
files): GLiNER span models by `gliner`, GLiClass uni-encoders by `gliclass`, on a DeBERTa-v2 or BERT backbone with a
SentencePiece-style (Unigram, Metaspace) tokenizer of a fixed vocabulary, so words split into several subtokens as
DeBERTa-v3's do. torch, transformers and gliner (the test
extra) are imported when a model is built, not when this module is."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

CORPUS = [
    "Steve Jobs founded Apple in Cupertino California in 1976",
    "Marie Curie won the Nobel Prize in Physics and Chemistry",
    "The quick brown fox jumps over the lazy dog near Paris",
    "Barack Obama was born in Honolulu Hawaii and served as president",
    "person organization location date award city country drug dosage",
]
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
DEBERTA = {"model_type": "deberta-v2", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
           "intermediate_size": 48, "max_position_embeddings": 512, "relative_attention": True,
           "pos_att_type": ["p2c", "c2p"], "position_buckets": 8, "max_relative_positions": 16,
           "position_biased_input": False, "type_vocab_size": 0, "share_att_key": True, "norm_rel_ebd": "layer_norm",
           "pad_token_id": 0}  # fmt: skip
BERT = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
        "intermediate_size": 48, "max_position_embeddings": 512, "type_vocab_size": 2, "pad_token_id": 0}  # fmt: skip
# BART (an encoder-decoder NLI classifier, as facebook/bart-large-mnli): [SEP] (id 2) is its <eos>, the decoder
# narrower than the encoder so each is sized by its own numbers, embeddings scaled by sqrt(d_model)
BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 48, "decoder_ffn_dim": 40, "max_position_embeddings": 512,
        "scale_embedding": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
        "decoder_start_token_id": 2, "forced_eos_token_id": 2}  # fmt: skip
# ModernBERT (as GLiNER2.5-Decide-1B's Ettin encoder): a global layer, then two local ones of a 4-token window.
MODERNBERT = {"model_type": "modernbert", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 3,
              "intermediate_size": 48, "max_position_embeddings": 512, "local_attention": 4, "pad_token_id": 0,
              "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}  # fmt: skip
BACKBONES = {"deberta-v2": DEBERTA, "bert": BERT, "bart": BART, "modernbert": MODERNBERT}
# The catalogue id the shared e2e cluster serves `save_gliner`'s default checkpoint under.
TINY_GLINER = "tiny/gliner"


def _vocabulary(words: Sequence[str] = ()) -> list[tuple[str, float]]:
    """Specials, every character, and the first two or three characters of each corpus word (with and without the
    word-start mark), and `words` whole: longer pieces score higher, so other words split into a few pieces each.
    Fixed, so the same on every run."""
    characters = sorted({char for line in CORPUS for char in line.replace(" ", "")} | set(".,'-0123456789"))
    pieces = {f"▁{word[:size]}" for line in CORPUS for word in line.split() for size in (2, 3)}
    pieces |= {word[2:4] for line in CORPUS for word in line.split() if len(word) > 3}
    pieces |= {f"▁{word}" for word in words}
    vocabulary = [(token, 0.0) for token in SPECIALS] + [("▁", -3.0)]
    vocabulary += [(char, -4.0) for char in characters] + [(f"▁{char}", -3.5) for char in characters]
    return vocabulary + [(piece, -2.0) for piece in sorted(pieces - {token for token, _ in vocabulary})]


def write_unigram_tokenizer(directory: Path, words: Sequence[str] = ()) -> Tokenizer:
    """DeBERTa-v3's kind of tokenizer (Unigram pieces after a Metaspace, `[CLS] a [SEP] b [SEP]`) with a fixed
    vocabulary reading `words` whole, and its tokenizer_config.json for transformers."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.Unigram(_vocabulary(words), unk_id=SPECIALS.index("[UNK]"), byte_fallback=False))
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)]
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "pad_token": "[PAD]", "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 512,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],  # as BERT's and DeBERTa's own
    }))  # fmt: skip
    return tokenizer


def write_backbone(
    directory: Path, backbone: str, size: dict[str, int] | None = None, words: Sequence[str] = ()
) -> None:
    """A random backbone of `backbone`'s family (tiny, or of `size`: hidden_size, num_hidden_layers, ...) with a
    fixed Unigram tokenizer (`[CLS] … [SEP]`) that reads `words` as one token each."""
    import torch
    import transformers

    tokenizer = write_unigram_tokenizer(directory, words)
    config = dict(BACKBONES[backbone], vocab_size=tokenizer.get_vocab_size()) | (size or {})
    config_class = transformers.CONFIG_MAPPING[config.pop("model_type")]
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config_class(**config)).save_pretrained(directory)


def save_gliner(  # noqa: PLR0913 - the checkpoint's shape
    directory: Path,
    backbone: str = "deberta-v2",
    seed: int = 1,
    size: dict[str, int] | None = None,
    words: Sequence[str] = (),
    labels_encoder: bool = False,
    boost: dict[str, float] | None = None,
    **options: Any,
) -> Any:
    """A GLiNER span model on a random `backbone` (of `size`, its tokenizer reading `words` whole: see
    `write_backbone`), saved to `directory` (as `GLiNER.save_pretrained` does); returns the model. `options` go to
    its GLiNERConfig (max_width, max_len, hidden_size, num_rnn_layers, relations_layer, ...); `labels_encoder` makes
    it a bi-encoder; `boost` multiplies the parameters under each name prefix (a layer whose random outputs would all
    sit on one side of a threshold)."""
    import torch
    from gliner import GLiNER, GLiNERConfig

    write_backbone(directory / "backbone", backbone, size, words)
    settings = {"hidden_size": 24, "max_width": 4, "max_len": 64, "dropout": 0.0} | options
    if labels_encoder:  # a bi-encoder: a BERT label encoder of its own, narrower than the text's
        write_backbone(directory / "labels", "bert", {"hidden_size": 16, "num_attention_heads": 2,
                                                      "intermediate_size": 32})  # fmt: skip
        settings["labels_encoder"] = str(directory / "labels")
    with warnings.catch_warnings():  # gliner warns that it does not resize a bi-encoder's embeddings
        warnings.simplefilter("ignore", UserWarning)
        model = GLiNER.from_config(GLiNERConfig(model_name=str(directory / "backbone"), **settings),
                                   backbone_from_pretrained=True)  # fmt: skip
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.model.named_parameters():
            # the backbone away from its initial values, GLiNER's layers enough to spread the scores over (0, 1)
            parameter.add_(torch.randn_like(parameter) * (0.2 if "bert_layer" in name else 0.1))
            parameter.mul_(next((factor for prefix, factor in (boost or {}).items() if name.startswith(prefix)), 1.0))
    model.eval()
    model.save_pretrained(directory / "gliner")
    return model


def save_gliner2(  # noqa: PLR0913 - the checkpoint's shape
    directory: Path,
    counting_layer: str = "count_lstm_v2",
    seed: int = 1,
    count: int | None = 1,
    size: dict[str, int] | None = None,
    words: Sequence[str] = (),
    backbone: str = "deberta-v2",
    **options: Any,
) -> Any:
    """A GLiNER2 span model (fastino's gliner2) on a random `backbone` (DeBERTa-v2 unless said), saved to `directory` as
    `save_pretrained` does (config.json, encoder_config/, model.safetensors, the tokenizer with its markers); returns
    the model. Its count head is biased towards `count` instances (a random one mostly says none); the backbone is of
    `size` and reads `words` whole (see `write_backbone`); `options` go to its ExtractorConfig (max_width, ...)."""
    import torch
    from gliner2.configuration import ExtractorConfig
    from gliner2.inference.engine import GLiNER2

    write_backbone(directory / "backbone", backbone, size, words)
    config = ExtractorConfig(model_name=str(directory / "backbone"), counting_layer=counting_layer,
                             **{"max_width": 4} | options)  # fmt: skip
    with warnings.catch_warnings():  # transformers warns that it resizes the embeddings for the markers
        warnings.simplefilter("ignore")
        model = GLiNER2(config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
        if count is not None:
            model.count_pred[-1].bias[count] += 10.0
    model.eval()
    model.save_pretrained(directory / "gliner2")
    return model


GLICLASS_MARKERS = ["<<LABEL>>", "<<SEP>>", "<<EXAMPLE>>"]


def save_gliclass(  # noqa: PLR0913 - the checkpoint's shape
    directory: Path,
    backbone: str = "deberta-v2",
    seed: int = 2,
    size: dict[str, int] | None = None,
    words: Sequence[str] = (),
    **options: Any,
) -> tuple[Any, Any]:
    """A GLiClass uni-encoder on a random `backbone` (of `size`, its tokenizer reading `words` whole: see
    `write_backbone`), saved to `directory` as `save_pretrained` does, with the tokenizer (its markers added);
    returns the model and its transformers tokenizer. `options` go to its GLiClassModelConfig (pooling_strategy,
    scorer_type, use_lstm, prompt_first, class_token_pooling, ...)."""
    import torch
    import transformers
    from gliclass import GLiClassModel, GLiClassModelConfig

    tokenizer = write_unigram_tokenizer(directory, words)
    tokenizer.add_special_tokens(GLICLASS_MARKERS)
    tokenizer.save(str(directory / "tokenizer.json"))
    encoder = dict(BACKBONES[backbone], vocab_size=tokenizer.get_vocab_size()) | (size or {})
    encoder_config = transformers.CONFIG_MAPPING[encoder.pop("model_type")](**encoder)
    config = GLiClassModelConfig(encoder_config=encoder_config.to_dict(), encoder_model=str(directory),
                                 class_token_index=tokenizer.token_to_id("<<LABEL>>"), dropout=0.0,
                                 architecture_type="uni-encoder", **options)  # fmt: skip
    torch.manual_seed(seed)
    model = GLiClassModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # away from the initial values; a scorer of its own (MLP, weighted dot) enough that the labels score apart
            parameter.add_(
                torch.randn_like(parameter) * (0.1 if "encoder_model" in name else 0.4 if "scorer" in name else 0.2)
            )
    model.save_pretrained(directory)
    return model, transformers.AutoTokenizer.from_pretrained(directory)


MNLI_LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}


def save_nli_classifier(
    directory: Path, backbone: str = "deberta-v2", id2label: dict[int, str] | None = None, seed: int = 4
) -> Any:
    """A random NLI classifier on `backbone` (MNLI's three labels unless `id2label` says otherwise) with the fixed
    tokenizer, saved to `directory` as transformers saves it; returns the model."""
    import torch
    import transformers

    tokenizer = write_unigram_tokenizer(directory)
    labels = id2label or MNLI_LABELS
    config = dict(BACKBONES[backbone], vocab_size=tokenizer.get_vocab_size(), id2label=labels,
                  label2id={label: index for index, label in labels.items()})  # fmt: skip
    config_class = transformers.CONFIG_MAPPING[config.pop("model_type")]
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config_class(**config)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    model.save_pretrained(directory)
    return model


def save_glirel(
    directory: Path, backbone: str = "deberta-v2", seed: int = 5, words: Sequence[str] = (), **options: Any
) -> Any:
    """A GLiREL model on a random `backbone` (its tokenizer reading `words` whole: see `write_backbone`), saved to
    `directory` as `GLiREL.save_pretrained` does (pytorch_model.bin and glirel_config.json, whose `model_name` is the
    backbone's directory, as a Hub id names it); returns the model. `options` go to its config (span_marker_mode,
    scorer, label_embed_strategy, hidden_size, max_len, max_entity_pair_distance, ...)."""
    import argparse

    import torch
    from glirel import GLiREL

    write_backbone(directory / "backbone", backbone, words=words)
    settings = {
        "model_name": str(directory / "backbone"), "name": "tiny", "max_width": 12, "hidden_size": 24,
        "dropout": 0.0, "fine_tune": True, "subtoken_pooling": "first", "span_mode": "marker",
        "span_marker_mode": "markerv1", "rel_mode": "marker", "scorer": "dot", "label_embed_strategy": "ent_token",
        "refine_prompt": False, "refine_relation": False, "ffn_mul": 4, "max_len": 64,
        "max_entity_pair_distance": None, "fixed_relation_types": True, "add_entity_markers": False,
        "loss_func": "binary_cross_entropy_loss", "num_train_rel_types": 10, "random_drop": False,
    } | options  # fmt: skip
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = GLiREL(argparse.Namespace(**settings))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # the backbone away from its initial values, GLiREL's layers enough to spread the scores over (0, 1)
            parameter.add_(torch.randn_like(parameter) * (0.2 if "bert_layer" in name else 0.15))
        if settings["scorer"] == "dot_norm":  # its trained bias starts at -10, which would put every score near 0
            model.scorer.bias.fill_(0.5)
    model.eval()
    model.save_pretrained(directory / "glirel")
    return model
