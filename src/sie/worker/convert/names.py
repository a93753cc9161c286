"""The names a conversion shares with the code that reads its output: the files of a checkpoint and of a converted
model directory, and the inputs and outputs of a decoder graph (what `sie.worker.generation` feeds and reads, and
what every decoder family's graph declares). Plain strings: it imports neither `onnx` nor `gguf`, so the worker
reaches them without loading the converter.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

CONFIG_FILE: Final = "config.json"
WEIGHTS_FILE: Final = "model.safetensors"
WEIGHTS_INDEX_FILE: Final = "model.safetensors.index.json"  # a sharded checkpoint's tensor -> file map
TORCH_WEIGHTS_FILE: Final = "pytorch_model.bin"  # a checkpoint without safetensors: torch.save's zip
GRAPH_FILE: Final = "model.onnx"
TOKENIZER_FILE: Final = "tokenizer.json"
TOKENIZER_CONFIG_FILE: Final = "tokenizer_config.json"
GENERATION_CONFIG_FILE: Final = "generation_config.json"
CHAT_TEMPLATE_FILE: Final = "chat_template.jinja"  # where transformers 5 saves a chat template
PROCESSOR_CHAT_TEMPLATE_FILE: Final = "chat_template.json"  # a processor's, `{"chat_template": ...}`
GLINER_CONFIG_FILE: Final = "gliner_config.json"  # a GLiNER checkpoint's own config (no config.json beside it)

# The `model_type`s of the decoder families converted from a checkpoint (`decoder_families`); `gemma3` is Gemma 3 with
# its vision tower, of which the language model (a `gemma3_text`) converts; `nvembed` is NV-Embed (a Mistral, then
# its latent-attention block); `qwen3_5` is Qwen3.5 with its vision tower, whose language model (a `qwen3_5_text`:
# gated delta-rule layers between attention layers) converts, and so does the Qwen3 language model of `qwen3_vl`.
DECODER_MODEL_TYPES: Final = frozenset(
    {"llama", "mistral", "qwen2", "qwen3", "granite", "gemma3_text", "gemma3", "hunyuan_v1_dense", "llama_bidirec",
     "nvembed", "qwen3_5", "qwen3_5_text", "qwen3_vl", "gemma4", "gemma4_text"}
)  # fmt: skip
NVEMBED_MODEL_TYPE: Final = "nvembed"
QWEN3_5_TEXT_MODEL_TYPE: Final = "qwen3_5_text"


def side_file(graph: Path) -> Path:
    """Where the graph file `graph` keeps its large tensors, when it has them (`model.onnx.data`): the graph names it
    relative to its own directory, so whoever moves a graph file moves this one with it (`move_graph`)."""
    return graph.with_name(graph.name + ".data")


def is_decoder_config(config_json: Mapping[str, Any]) -> bool:
    """Whether a checkpoint's config.json names a decoder family the converter builds (or wraps a Qwen3.5 language
    model under a `model_type` of its own remote code: TopK-Embed's)."""
    return config_json.get("model_type") in DECODER_MODEL_TYPES or wraps_qwen3_5(config_json)


def wraps_qwen3_5(config_json: Mapping[str, Any]) -> bool:
    """Whether the config's `text_config` is a Qwen3.5 language model's, whatever the top level calls itself."""
    text = config_json.get("text_config")
    return isinstance(text, Mapping) and text.get("model_type") == QWEN3_5_TEXT_MODEL_TYPE


# The encoder head giving the sequence classifier's logits and every token's last state beside them (heads.py): the
# context pruner's graph, whose token head is trained apart and runs on the host.
SEQ_CLS_WITH_STATES: Final = "seq-cls-states"

# Families whose activations overflow float16 (Gemma 3's model cards: float32 or bfloat16 only): on a GPU they convert
# to float32 unless a profile asks for float16 by name.
FLOAT16_UNSAFE_MODEL_TYPES: Final = frozenset({"gemma3_text", "gemma3", "gemma4_text", "gemma4"})

INPUT_IDS: Final = "input_ids"
ATTENTION_MASK: Final = "attention_mask"
POSITION_IDS: Final = "position_ids"
LOGITS: Final = "logits"
PAST_PREFIX: Final = "past_key_values."
PRESENT_PREFIX: Final = "present."


def past_key_name(layer: int) -> str:
    return f"{PAST_PREFIX}{layer}.key"


def past_value_name(layer: int) -> str:
    return f"{PAST_PREFIX}{layer}.value"


def present_key_name(layer: int) -> str:
    return f"{PRESENT_PREFIX}{layer}.key"


def present_value_name(layer: int) -> str:
    return f"{PRESENT_PREFIX}{layer}.value"


# A linear-attention layer's cache (Qwen3.5's gated delta rule) is two states of a fixed size per row, not a tensor
# that grows a token at a time: the last inputs of its causal convolution and its recurrent state.
CONV_STATE: Final = "conv"
RECURRENT_STATE: Final = "recurrent"
# The converted config.json's keys for them: which layers hold them and each row's state shapes.
LINEAR_ATTENTION_LAYERS: Final = "linear_attention_layers"
CONV_STATE_SHAPE: Final = "linear_conv_state_shape"  # [channels, conv_kernel − 1]
RECURRENT_STATE_SHAPE: Final = "linear_recurrent_state_shape"  # [value_heads, key_dim, value_dim]


# The converted config.json's key for a decoder whose layers' caches differ (Gemma 4): each caching layer's key/value
# heads and head size, `{"0": [kv_heads, head_dim], …}`; a layer it leaves out keeps no cache.
KV_CACHE_LAYERS: Final = "kv_cache_layers"


def past_state_name(layer: int, state: str) -> str:
    return f"{PAST_PREFIX}{layer}.{state}"


def present_state_name(layer: int, state: str) -> str:
    return f"{PRESENT_PREFIX}{layer}.{state}"


def is_state_name(name: str) -> bool:
    """Whether a cache feed or output is a fixed-size state (no token axis) rather than keys or values."""
    return name.endswith((f".{CONV_STATE}", f".{RECURRENT_STATE}"))


# The extra inputs and the output of a converted GLiNER span graph (`gliner.py`), fed and read by its adapter: per
# row, the token position of each text word's first subtoken, how many text words there are, and the token position
# of each label's marker; out come sigmoid scores [rows, words, widths, labels].
GLINER_HEAD: Final = "gliner-span"
GLINER_SPAN_MODEL_TYPE: Final = "gliner_uni_encoder_span"  # the architecture the span graph builds
GLINER_BI_SPAN_MODEL_TYPE: Final = "gliner_bi_encoder_span"  # and with a label encoder of its own
GLINER_TOKEN_MODEL_TYPE: Final = "gliner_uni_encoder_token"  # start, end and inside scores per word (NuNER Zero)
# A token-level GLiNER's output in place of SPAN_SCORES: [rows, words, labels, 3] sigmoid start, end and inside.
TOKEN_SCORES: Final = "token_scores"
# A bi-encoder GLiNER's labels, encoded by its label graph (beside the span graph: `labels_graph_path`) and fed to the
# span graph per row: [labels, width] out of the one, [rows, labels, width] into the other.
LABEL_EMBEDDINGS: Final = "label_embeddings"
LABELS_TOKENIZER_DIR: Final = "labels_tokenizer"  # where gliner saves a bi-encoder's label tokenizer
WORD_POSITIONS: Final = "word_positions"
WORD_COUNTS: Final = "word_counts"
LABEL_POSITIONS: Final = "label_positions"
SPAN_SCORES: Final = "span_scores"
# A GLiNER relation-extraction model (`gliner_relations.py`): its span graph also reads each row's relation-type
# marker positions and puts out the words' embeddings [rows, words, width] and the relation types' [rows, types,
# width]; its relation graph (beside it: `relations_graph_path`) reads those with the entity candidates the adapter
# picked (ENTITY_SPANS, ENTITY_MASK [rows, entities]) and each row's adjacency threshold, and puts out the kept pairs
# [pairs, 3] (row, head, tail) and their sigmoid RELATION_SCORES [pairs, types].
GLINER_RELEX_MODEL_TYPE: Final = "gliner_uni_encoder_span_relex"
RELATION_POSITIONS: Final = "relation_positions"
WORD_EMBEDDINGS: Final = "word_embeddings"
RELATION_EMBEDDINGS: Final = "relation_embeddings"
ENTITY_MASK: Final = "entity_mask"
ADJACENCY_THRESHOLDS: Final = "adjacency_thresholds"
PAIR_INDEX: Final = "pair_index"
# A GLiNER2 span checkpoint (`gliner2.py`: config.json `model_type: extractor`, the encoder's config in
# encoder_config/): beside WORD_POSITIONS and WORD_COUNTS, the token positions of each row's schemas' markers
# ([rows, schemas, 1 + fields]: [P] then each field's [E], [L] or [R]), how many fields each schema has [rows,
# schemas], and the structure instances to score ([instances]: 0, 1, ...); out come the sigmoid span scores
# [rows, words, widths, schemas x instances x fields], the count head's logits [rows, schemas, counts] and each
# field's classifier logit [rows, schemas, fields].
GLINER2_HEAD: Final = "gliner2"
GLINER2_MODEL_TYPE: Final = "extractor"
SCHEMA_POSITIONS: Final = "schema_positions"
FIELD_COUNTS: Final = "field_counts"
INSTANCES: Final = "instances"
COUNT_LOGITS: Final = "count_logits"
CLASS_LOGITS: Final = "class_logits"
ENCODER_CONFIG_DIR: Final = "encoder_config"
# The extra input of a converted GLiClass graph (`gliclass.py`): per row and label, the weight of each token in the
# label's representation (1 at its marker, or 1/n over its n tokens); out come `LOGITS` [rows, labels].
GLICLASS_HEAD: Final = "gliclass"
GLICLASS_MODEL_TYPE: Final = "GLiClass"  # a GLiClass checkpoint's config.json model_type
LABEL_WEIGHTS: Final = "label_weights"
# The extra inputs and the output of a converted GLiREL graph (`glirel.py`), fed and read by its adapter: beside
# WORD_POSITIONS, WORD_COUNTS and LABEL_POSITIONS ([rows, labels, k]: the k token positions averaged into each
# relation type), each entity's first and last word [rows, entities, 2] and each scored pair's head and tail entity
# [rows, pairs, 2]; out come sigmoid scores [rows, pairs, relation types].
GLIREL_HEAD: Final = "glirel"
GLIREL_CONFIG_FILE: Final = "glirel_config.json"  # a GLiREL checkpoint's own config (the backbone's beside it)
GLIREL_MODEL_TYPE: Final = "glirel"  # what the coverage report calls the architecture (its config names none)
ENTITY_SPANS: Final = "entity_spans"
ENTITY_PAIRS: Final = "entity_pairs"
RELATION_SCORES: Final = "relation_scores"
# Image–text models (CLIP, SigLIP: `clip.py`): the converted graph is the text tower (the backbone's inputs in,
# TEXT_EMBEDS [rows, projection] out: projected, not normalized), and the vision tower is a second graph beside it
# (`vision_graph_path`: PIXEL_VALUES [images, 3, height, width] float32 in, IMAGE_EMBEDS [images, projection] out).
CLIP_HEAD: Final = "clip"
PIXEL_VALUES: Final = "pixel_values"
TEXT_EMBEDS: Final = "text_embeds"
IMAGE_EMBEDS: Final = "image_embeds"
PREPROCESSOR_CONFIG_FILE: Final = "preprocessor_config.json"  # the image processor's settings, beside the checkpoint
# open_clip's checkpoint layout (`convert/open_clip.py`): its config and weights in place of config.json and
# model.safetensors (the Hub's open_clip repositories; a .bin is a torch.save zip).
OPEN_CLIP_CONFIG_FILE: Final = "open_clip_config.json"
OPEN_CLIP_WEIGHTS_FILES: Final = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
SPECIAL_TOKENS_MAP_FILE: Final = (
    "special_tokens_map.json"  # a tokenizer's special tokens (pad_token), beside its config
)
# The inputs and outputs of the graphs run beside a model on its GPU (`device_graphs.py`, run by
# `sie.worker.device_pooling`): the pooling graph's, and a token head's output.
POOLING_TOKEN_STATES: Final = "token_states"
POOLING_ATTENTION_MASK: Final = "attention_mask"
POOLED_MODES: Final = ("mean", "cls", "last")
TOKEN_HEAD_OUTPUT: Final = "token_vectors"
# The text graph's metadata: the model's similarity for scoring (the stored logit scale, before exp; SigLIP's bias).
LOGIT_SCALE_KEY: Final = "sie.logit_scale"
LOGIT_BIAS_KEY: Final = "sie.logit_bias"
MODEL_TYPE_KEY: Final = "sie.model_type"


def vision_graph_path(graph: Path) -> Path:
    """Where an image–text model's vision graph sits beside its text graph `graph`."""
    return graph.with_name(f"{graph.stem}.vision.onnx")


def relations_graph_path(graph: Path) -> Path:
    """Where a GLiNER relation-extraction model's relation graph sits beside its span graph `graph`."""
    return graph.with_name(f"{graph.stem}.relations.onnx")


def labels_graph_path(graph: Path) -> Path:
    """Where a bi-encoder GLiNER's label graph sits beside its span graph `graph`."""
    return graph.with_name(f"{graph.stem}.labels.onnx")
