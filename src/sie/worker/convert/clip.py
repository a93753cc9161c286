"""CLIP and SigLIP image–text models (transformers' CLIPModel and SiglipModel), config + graphs: the text tower as
one opset-17 graph (`names.INPUT_IDS` and `names.ATTENTION_MASK` in, `names.TEXT_EMBEDS` [B, projection] out) and
the vision tower as a second graph beside it (`names.vision_graph_path`: `names.PIXEL_VALUES` [B, C, size, size]
in, `names.IMAGE_EMBEDS` [B, projection] out). The embeddings are `get_text_features` and `get_image_features`:
projected, not normalized.

Read from transformers' `models/clip` (CLIPTextTransformer's causal and padding mask, its pooling at the EOS token:
the legacy `eos_token_id == 2` configs take the argmax of the ids, the others the first position of `eos_token_id`;
the vision tower's class token, `pre_layrnorm` and `post_layernorm`; the bias-free projections) and `models/siglip`
(a bidirectional text tower pooled at the last position, padding or not, through its `head` Linear; a class-free
vision tower pooled by the attention-pooling head, whose output is the image embedding). The layers live in
`vision_graph.py`; this module parses the configs, reads the checkpoint's `logit_scale` and `logit_bias` for the
adapter, and assembles and writes both graphs (`write_towers`, which `open_clip.py` also builds open_clip's SigLIPs
with). Checked against transformers on random checkpoints (tests/integration/test_clip_convert.py). Other model
types fail the conversion naming theirs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import onnx
from onnx import TensorProto

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import read_config_json
from sie.worker.convert.graph_builder import GraphBuilder, save_graph, tensor_info
from sie.worker.convert.head_layers import HeadWeights, linear
from sie.worker.convert.names import (
    ATTENTION_MASK,
    CONFIG_FILE,
    IMAGE_EMBEDS,
    INPUT_IDS,
    LOGIT_BIAS_KEY,
    LOGIT_SCALE_KEY,
    MODEL_TYPE_KEY,
    OPEN_CLIP_CONFIG_FILE,
    OPEN_CLIP_WEIGHTS_FILES,
    PIXEL_VALUES,
    TEXT_EMBEDS,
    vision_graph_path,
)
from sie.worker.convert.safetensors_io import Checkpoint
from sie.worker.convert.vision_graph import (
    ACTIVATIONS,
    MASKED_KEY_BIAS,
    KeyMask,
    PooledRows,
    TowerConfig,
    attention_pooling,
    encoder_layers,
    layer_norm,
    patch_embeddings,
    projection,
)

MODEL_TYPES = ("clip", "siglip")
# CLIP configs saved before transformers PR #24773 say eos_token_id 2; transformers then pools at the largest id.
LEGACY_EOS_TOKEN_ID = 2
# Each sub-config's defaults, as transformers' config classes give them when config.json leaves a key out.
_TEXT_DEFAULTS = {
    "clip": {"vocab_size": 49408, "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
             "num_attention_heads": 8, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
             "layer_norm_eps": 1e-5, "pad_token_id": 1, "eos_token_id": 49407},
    "siglip": {"vocab_size": 32000, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
               "num_attention_heads": 12, "max_position_embeddings": 64, "hidden_act": "gelu_pytorch_tanh",
               "layer_norm_eps": 1e-6, "pad_token_id": 1, "eos_token_id": 49407, "projection_size": None},
}  # fmt: skip
_VISION_DEFAULTS = {
    "clip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
             "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu",
             "layer_norm_eps": 1e-5},
    "siglip": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
               "num_channels": 3, "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh",
               "layer_norm_eps": 1e-6, "vision_use_head": True},
}  # fmt: skip
CLIP_PROJECTION_DEFAULT = 512
BATCH, SEQUENCE = "batch", "sequence"
_FLOAT = TensorProto.FLOAT


@attrs.frozen
class ClipConfig:
    """What the graphs are built from and what the adapter needs beside them.

    `logit_scale` and `logit_bias` are the checkpoint's tensors as stored: the scale is a logarithm (the model's
    logits are `exp(logit_scale) * cosine (+ logit_bias)`), exp is NOT applied here. CLIP has no bias (None);
    SigLIP's scores are `sigmoid(exp(logit_scale) * cosine + logit_bias)`.
    """

    model_type: str  # "clip" or "siglip"
    projection_dim: int  # the width of both embeddings
    image_size: int  # pixel_values are [B, num_channels, image_size, image_size]
    patch_size: int
    num_channels: int
    text_max_positions: int  # the longest token sequence the text graph reads
    vocab_size: int
    pad_token_id: int | None
    eos_token_id: int | None  # CLIP pools at it (LEGACY_EOS_TOKEN_ID: at the largest id); SigLIP at the last position
    pad_to_max_length: bool  # SigLIP was trained on texts padded to text_max_positions, and pools the last position
    text: TowerConfig
    vision: TowerConfig
    logit_scale: float  # log of the logits' scale: exp not applied
    logit_bias: float | None  # SigLIP's; None for CLIP

    @property
    def legacy_eos_pooling(self) -> bool:
        """A CLIP whose config says eos_token_id 2: the text is pooled at its largest token id."""
        return self.model_type == "clip" and self.eos_token_id == LEGACY_EOS_TOKEN_ID


def load_clip_config(model_dir: Path) -> ClipConfig:
    """Parse `model_dir`'s config.json and read `logit_scale` (and SigLIP's `logit_bias`) from its checkpoint;
    ConversionError naming the file and the field (or tensor) for anything missing, malformed or not built."""
    model_dir = Path(model_dir)
    path = model_dir / CONFIG_FILE
    if not path.is_file() and (model_dir / OPEN_CLIP_CONFIG_FILE).is_file():
        raise ConversionError(
            f"an open_clip checkpoint ({OPEN_CLIP_CONFIG_FILE}) without its weights: no "
            f"{' or '.join(OPEN_CLIP_WEIGHTS_FILES)} (and no {CONFIG_FILE} of a transformers checkpoint)",
            source=str(model_dir),
        )
    raw = read_config_json(path)
    source = str(path)
    model_type = raw.get("model_type")
    if model_type not in MODEL_TYPES:
        raise ConversionError(f"model_type {model_type!r} is not an image–text family this converter builds "
                              f"(supported: {', '.join(MODEL_TYPES)})", source=source)  # fmt: skip
    text_raw = _sub_config(raw, "text_config", model_type, source)
    vision_raw = _sub_config(raw, "vision_config", model_type, source)
    text_defaults, vision_defaults = _TEXT_DEFAULTS[model_type], _VISION_DEFAULTS[model_type]
    text = _tower(text_raw, text_defaults, source, "text_config")
    vision = _tower(vision_raw, vision_defaults, source, "vision_config")

    def text_int(key: str) -> int:
        return _positive_int(text_raw, key, text_defaults[key], source, "text_config")

    def vision_int(key: str) -> int:
        return _positive_int(vision_raw, key, vision_defaults[key], source, "vision_config")

    projection_dim = _projection_dim(raw, text_raw, vision_raw, text, vision, source)
    image_size, patch_size, channels = vision_int("image_size"), vision_int("patch_size"), vision_int("num_channels")
    max_positions, vocab_size = text_int("max_position_embeddings"), text_int("vocab_size")
    eos_token_id = _token_id(text_raw, "eos_token_id", text_defaults["eos_token_id"], source)
    if model_type == "clip" and eos_token_id is None:
        raise ConversionError("text_config.eos_token_id is null: CLIP pools the text at its EOS token", source=source)
    pad_token_id = _token_id(text_raw, "pad_token_id", text_defaults["pad_token_id"], source)
    checkpoint = Checkpoint(model_dir)  # after the config, so what is wrong in it is named first
    return ClipConfig(
        model_type=model_type, projection_dim=projection_dim, image_size=image_size, patch_size=patch_size,
        num_channels=channels, text_max_positions=max_positions, vocab_size=vocab_size, pad_token_id=pad_token_id,
        eos_token_id=eos_token_id, pad_to_max_length=model_type == "siglip", text=text, vision=vision,
        logit_scale=_scalar(checkpoint, "logit_scale"),
        logit_bias=_scalar(checkpoint, "logit_bias") if model_type == "siglip" else None,
    )  # fmt: skip


def convert_clip(model_dir: Path, out_path: Path) -> ClipConfig:
    """Convert a CLIPModel or SiglipModel checkpoint directory (config.json + model.safetensors, shards or
    pytorch_model.bin) into the text graph at `out_path` and the vision graph at `vision_graph_path(out_path)`."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    config = load_clip_config(model_dir)
    write_towers(config, HeadWeights(Checkpoint(model_dir)), out_path)
    return config


def write_towers(config: ClipConfig, weights: HeadWeights, out_path: Path) -> None:
    """Build both towers from `weights` (read by transformers' CLIPModel / SiglipModel tensor names) and write the
    text graph at `out_path`, the vision graph at `vision_graph_path(out_path)`."""
    text = _text_graph(config, weights)
    # The similarity the model was trained with, for the adapter's score (which imports no converter).
    similarity = {LOGIT_SCALE_KEY: repr(config.logit_scale), MODEL_TYPE_KEY: config.model_type}
    if config.logit_bias is not None:
        similarity[LOGIT_BIAS_KEY] = repr(config.logit_bias)
    onnx.helper.set_model_props(text, similarity)
    save_graph(text, out_path)
    save_graph(_vision_graph(config, weights), vision_graph_path(out_path))


# --- config -----------------------------------------------------------------------------------------------------------


def _sub_config(raw: dict[str, Any], key: str, model_type: str, source: str) -> dict[str, Any]:
    """`text_config` / `vision_config`; for CLIP, the old `*_config_dict` keys override them as transformers does."""
    section = raw.get(key)
    if section is None:
        section = {}
    if not isinstance(section, dict):
        raise ConversionError(f"{key} is not an object", source=source)
    override = raw.get(f"{key}_dict") if model_type == "clip" else None
    if override is not None:
        if not isinstance(override, dict):
            raise ConversionError(f"{key}_dict is not an object", source=source)
        section = {**section, **override}
    return section


def _projection_dim(  # noqa: PLR0913 - the config's parts that say it
    raw: dict[str, Any], text_raw: dict[str, Any], vision_raw: dict[str, Any], text: TowerConfig, vision: TowerConfig,
    source: str,
) -> int:  # fmt: skip
    """The embeddings' width: CLIP's `projection_dim`; SigLIP's text `projection_size` (its hidden size unless set),
    which its vision tower's pooled width must equal."""
    if raw["model_type"] == "clip":
        return _positive_int(raw, "projection_dim", CLIP_PROJECTION_DEFAULT, source, "")
    if vision_raw.get("vision_use_head", True) is not True:
        raise ConversionError("vision_config.vision_use_head is not true: without the attention-pooling head "
                              "SigLIP's get_image_features has no embedding to give", source=source)  # fmt: skip
    width = _positive_int(text_raw, "projection_size", text.hidden_size, source, "text_config")
    if width != vision.hidden_size:
        raise ConversionError(f"text_config.projection_size {width} differs from vision_config.hidden_size "
                              f"{vision.hidden_size}: the embeddings would not compare", source=source)  # fmt: skip
    return width


def _tower(section: dict[str, Any], defaults: dict[str, Any], source: str, where: str) -> TowerConfig:
    hidden = _positive_int(section, "hidden_size", defaults["hidden_size"], source, where)
    heads = _positive_int(section, "num_attention_heads", defaults["num_attention_heads"], source, where)
    if hidden % heads:
        raise ConversionError(f"{where}.hidden_size {hidden} is not a multiple of num_attention_heads {heads}",
                              source=source)  # fmt: skip
    act = section.get("hidden_act", defaults["hidden_act"])
    if act not in ACTIVATIONS:
        raise ConversionError(f"{where}.hidden_act {act!r} is not built (supported: {', '.join(ACTIVATIONS)})",
                              source=source)  # fmt: skip
    eps = section.get("layer_norm_eps", defaults["layer_norm_eps"])
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not eps > 0:
        raise ConversionError(f"{where}.layer_norm_eps is {eps!r}: expected a positive number", source=source)
    return TowerConfig(
        hidden_size=hidden,
        intermediate_size=_positive_int(section, "intermediate_size", defaults["intermediate_size"], source, where),
        num_layers=_positive_int(section, "num_hidden_layers", defaults["num_hidden_layers"], source, where),
        num_heads=heads,
        layer_norm_eps=float(eps),
        activation=act,
    )


def _positive_int(section: dict[str, Any], key: str, default: int, source: str, where: str) -> int:
    value = section.get(key)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        field = f"{where}.{key}" if where else key
        raise ConversionError(f"{field} is {value!r}: expected a positive integer", source=source)
    return value


def _token_id(section: dict[str, Any], key: str, default: int, source: str) -> int | None:
    value = section.get(key, default)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConversionError(f"text_config.{key} is {value!r}: expected one token id", source=source)
    return value


def _scalar(checkpoint: Checkpoint, name: str) -> float:
    if name not in checkpoint:
        raise ConversionError("required tensor is missing", source=str(checkpoint.path), tensor=name)
    values = checkpoint.load(name)
    if values.size != 1 or not np.isfinite(values).all():
        raise ConversionError(f"is {values.tolist()}: expected one finite number", source=str(checkpoint.path),
                              tensor=name)  # fmt: skip
    return float(values.reshape(-1)[0])


# --- text tower -------------------------------------------------------------------------------------------------------


def _text_graph(config: ClipConfig, weights: HeadWeights) -> onnx.ModelProto:
    """Token + position embeddings, the layers under the mask, the pooled row's final LayerNorm, the projection."""
    b, tower = GraphBuilder(), config.text
    width = tower.hidden_size
    table = weights.get("text_model.embeddings.token_embedding.weight", (config.vocab_size, width))
    positions = weights.get("text_model.embeddings.position_embedding.weight", (config.text_max_positions, width))
    words = b.op("Gather", [b.weight("text_model.embeddings.token_embedding.weight", table), INPUT_IDS],
                 "text.words")  # fmt: skip
    sequence = b.op("Shape", [INPUT_IDS], "text.sequence", start=1, end=2)
    # Positions are 0..S-1: the first S rows of the table.
    placed = b.op("Slice", [b.weight("text_model.embeddings.position_embedding.weight", positions), b.const([0]),
                            sequence, b.const([0])], "text.positions")  # fmt: skip
    tokens = b.op("Reshape", [b.op("Add", [words, placed], "text.embedded"), b.const([-1, width])], "text.tokens")
    batch_sequence = b.op("Shape", [INPUT_IDS], "text.batch_sequence")
    heads_shape = b.op("Concat", [batch_sequence, b.const([tower.num_heads, tower.head_size])], "text.heads_shape",
                       axis=0)  # fmt: skip
    rows_shape = b.op("Concat", [batch_sequence, b.const([width])], "text.rows_shape", axis=0)
    causal = config.model_type == "clip"
    key_mask = KeyMask(b.op("Cast", [ATTENTION_MASK], "text.mask", to=TensorProto.INT32), rows_shape, causal=causal)
    # The tower's output is the pooled row's alone: the last layer is computed there only, [B, H].
    pooled_rows = _pooled_rows(b, config, sequence, causal)
    pooled = encoder_layers(b, weights, tower, tokens, heads_shape, "", "text_model.encoder", key_mask=key_mask,
                            rows=pooled_rows)  # fmt: skip
    # LayerNorm is per row: normalizing the pooled rows alone equals transformers' whole last_hidden_state.
    pooled = layer_norm(b, weights, pooled, "text_model.final_layer_norm", width, tower.layer_norm_eps)
    if config.model_type == "clip":
        embeds = projection(b, weights, pooled, "text_projection", width, config.projection_dim)
    else:
        embeds = linear(b, weights, pooled, "text_model.head", width, config.projection_dim)
    embeds = b.op("Identity", [embeds], TEXT_EMBEDS)
    inputs = [tensor_info(name, TensorProto.INT64, [BATCH, SEQUENCE]) for name in (INPUT_IDS, ATTENTION_MASK)]
    return b.model(f"{config.model_type}_text", inputs, [tensor_info(embeds, _FLOAT, [BATCH, config.projection_dim])])


def _pooled_rows(b: GraphBuilder, config: ClipConfig, sequence: str, causal: bool) -> PooledRows:
    """Each text's pooled token as a row of the [B*S, H] tokens: CLIP's EOS position (the largest id's first position
    for legacy configs, else eos_token_id's first; 0 when a text has none, as torch's argmax), SigLIP's last; and
    the bias of its query over the keys: the padding mask's, and under `causal` none past the row's own position."""
    length = b.op("Squeeze", [sequence, b.const([0])], "pool.length")
    batch = b.op("Squeeze", [b.op("Shape", [INPUT_IDS], "pool.batch_1d", start=0, end=1), b.const([0])],
                 "pool.batch")  # fmt: skip
    starts = b.op("Mul", [b.op("Range", [b.const(0), batch, b.const(1)], "pool.rows"), length], "pool.row_starts")
    if config.model_type == "siglip":
        position = b.op("Sub", [length, b.const(1)], "pool.last")
    else:
        if config.legacy_eos_pooling:
            # transformers casts the ids to int32 before argmax; ONNX's ArgMax keeps the first of equal maxima, as
            # torch does
            ranked = b.op("Cast", [INPUT_IDS], "pool.ids_int32", to=TensorProto.INT32)
        else:
            is_eos = b.op("Equal", [INPUT_IDS, b.const(config.eos_token_id)], "pool.is_eos")
            ranked = b.op("Cast", [is_eos], "pool.is_eos_int32", to=TensorProto.INT32)
        position = b.op("ArgMax", [ranked], "pool.position", axis=1, keepdims=0)
    readable = b.op("Cast", [ATTENTION_MASK], "pool.key_mask", to=TensorProto.BOOL)  # [B, S]
    if causal:
        # keys [1, S] against each row's position [B, 1]: [B, S]
        keys = b.op("Unsqueeze", [b.op("Range", [b.const(0), length, b.const(1)], "pool.keys"), b.const([0])],
                    "pool.key_positions")  # fmt: skip
        earlier = b.op("LessOrEqual", [keys, b.op("Unsqueeze", [position, b.const([1])], "pool.row_position")],
                       "pool.earlier")  # fmt: skip
        readable = b.op("And", [readable, earlier], "pool.readable")
    bias = b.op("Where", [readable, b.const(0.0, np.float32), b.const(MASKED_KEY_BIAS, np.float32)], "pool.bias_2d")
    bias = b.op("Unsqueeze", [bias, b.const([1, 2])], "pool.bias")  # [B, 1, 1, S]
    return PooledRows(b.op("Add", [starts, position], "pool.index"), bias)


# --- vision tower -----------------------------------------------------------------------------------------------------


def _vision_graph(config: ClipConfig, weights: HeadWeights) -> onnx.ModelProto:
    """Patches (+ CLIP's class token) + positions, the layers, then CLIP's class token through `post_layernorm`
    and `visual_projection`, or SigLIP's `post_layernorm` over every token and the attention-pooling head."""
    b, tower, clip = GraphBuilder(), config.vision, config.model_type == "clip"
    width, eps, prefix = tower.hidden_size, tower.layer_norm_eps, "vision_model"
    patches = (config.image_size // config.patch_size) ** 2
    sequence = patches + 1 if clip else patches
    embedded = patch_embeddings(b, weights, PIXEL_VALUES, f"{prefix}.embeddings.patch_embedding",
                                config.num_channels, width, config.patch_size, bias=not clip)  # fmt: skip
    if clip:
        row = weights.get(f"{prefix}.embeddings.class_embedding", (width,)).reshape(1, 1, width)
        batch = b.op("Shape", [PIXEL_VALUES], "vision.batch", start=0, end=1)
        class_shape = b.op("Concat", [batch, b.const([1, width])], "vision.class_shape", axis=0)
        class_token = b.op("Expand", [b.weight(f"{prefix}.embeddings.class_embedding", row), class_shape],
                           "vision.class_token")  # fmt: skip
        embedded = b.op("Concat", [class_token, embedded], "vision.with_class", axis=1)
    positions = weights.get(f"{prefix}.embeddings.position_embedding.weight", (sequence, width))
    embedded = b.op("Add", [embedded, b.weight(f"{prefix}.embeddings.position_embedding.weight", positions)],
                    "vision.embedded")  # fmt: skip
    tokens = b.op("Reshape", [embedded, b.const([-1, width])], "vision.tokens")
    if clip:
        tokens = layer_norm(b, weights, tokens, f"{prefix}.pre_layrnorm", width, eps)
    heads_shape = b.const([-1, sequence, tower.num_heads, tower.head_size])
    if clip:
        # CLIP reads the class token alone: the last layer is computed at each image's first row only.
        flat = b.op("Squeeze", [b.op("Shape", [tokens], "vision.flat_rows", start=0, end=1)], "vision.row_count")
        class_rows = b.op("Range", [b.const(0), flat, b.const(sequence)], "vision.class_rows")  # [B]: b * sequence
        pooled = encoder_layers(b, weights, tower, tokens, heads_shape, "", f"{prefix}.encoder", sequence=sequence,
                                rows=PooledRows(class_rows))  # fmt: skip
        pooled = layer_norm(b, weights, pooled, f"{prefix}.post_layernorm", width, eps)
        embeds = projection(b, weights, pooled, "visual_projection", width, config.projection_dim)
    else:
        tokens = encoder_layers(b, weights, tower, tokens, heads_shape, "", f"{prefix}.encoder", sequence=sequence)
        tokens = layer_norm(b, weights, tokens, f"{prefix}.post_layernorm", width, eps)
        embeds = attention_pooling(b, weights, tower, tokens, sequence, f"{prefix}.head")
    embeds = b.op("Identity", [embeds], IMAGE_EMBEDS)
    size = config.image_size
    pixels = tensor_info(PIXEL_VALUES, _FLOAT, [BATCH, config.num_channels, size, size])
    return b.model(f"{config.model_type}_vision", [pixels],
                   [tensor_info(embeds, _FLOAT, [BATCH, config.projection_dim])])  # fmt: skip
