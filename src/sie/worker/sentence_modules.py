"""A sentence-transformers model's module stack (`modules.json`): what runs after the transformer — the pooling of
`1_Pooling/config.json`, `Dense` layers (their `model.safetensors`), `Normalize` — read at load so the dense adapter
applies every stage in order. A stage it cannot apply (an unknown module type, a pooling mode it lacks, Dense weights
only in a pickle) is a `SentenceModulesError` naming the file and what it found: never skipped, which would answer
with vectors of the wrong meaning or width.

Both the classic layout (`sentence_transformers.models.Pooling`, `pooling_mode_mean_tokens: true`) and the 5.x/6.x
one (`sentence_transformers.….pooling.Pooling`, `pooling_mode: "mean"`) are read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.safetensors_io import SafetensorsFile

MODULES_FILE = "modules.json"
# Pooling modes in the new layout's names -> ours (`sie.worker.outputs.pool`).
_POOLING = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
# The classic layout's flags -> the same names.
_CLASSIC_POOLING = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype)


# torch activation class names a Dense layer's config names -> the same function on numpy arrays.
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Identity": lambda x: x,
    "Tanh": np.tanh,
    "ReLU": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "GELU": _gelu,
}


class SentenceModulesError(ValueError):
    """The module stack cannot be applied as written; the message names the file and the problem."""


@attrs.frozen
class DenseStage:
    """One `Dense` module: `activation(x @ weight + bias)`, plus `x @ residual` for PyLate's residual Dense."""

    weight: np.ndarray  # [in, out]
    bias: np.ndarray | None
    activation: str
    residual: np.ndarray | None = None  # [in, out]: the identity when the widths are equal

    @property
    def in_features(self) -> int:
        return int(self.weight.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1])

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        out = vectors @ self.weight
        if self.bias is not None:
            out = out + self.bias
        out = ACTIVATIONS[self.activation](out).astype(np.float32)
        return out if self.residual is None else out + vectors @ self.residual


@attrs.frozen
class SentenceModules:
    """What runs after the transformer: `pooling` (None: the stack has no Pooling module), Dense stages in order,
    and whether a Normalize module ends it."""

    pooling: str | None = None
    dense: tuple[DenseStage, ...] = ()
    normalize: bool = False

    def project(self, vectors: np.ndarray) -> np.ndarray:
        """The Dense stages applied to pooled vectors `[B, H]`."""
        for stage in self.dense:
            vectors = stage(vectors)
        return vectors

    def width(self, hidden_width: int) -> int:
        """The width of the sentence vector for a transformer of `hidden_width`."""
        return self.dense[-1].out_features if self.dense else hidden_width


def read_sentence_modules(model_dir: Path, dense_path: str | None = None) -> SentenceModules | None:
    """The module stack of `model_dir`, or None when it has no `modules.json` (a plain transformers checkpoint).
    `dense_path` (a profile's `dense_projection_path`) replaces the directory of the stack's one Dense module: stella
    ships `2_Dense_256` … `2_Dense_8192` beside the one its modules.json names, one per output width."""
    path = Path(model_dir) / MODULES_FILE
    if not path.is_file():
        if dense_path is not None:
            raise SentenceModulesError(f"{path}: dense_projection_path {dense_path!r} needs a module stack")
        return None
    entries = _entries(path, dense_path)
    pooling, dense, normalize = None, [], False
    for entry in sorted(entries, key=lambda entry: entry.get("idx", 0)):
        kind = str(entry.get("type", "")).rsplit(".", 1)[-1]
        directory = Path(model_dir) / str(entry.get("path", ""))
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            pooling = _pooling(directory / "config.json")
        elif kind == "Dense":
            dense.append(_dense(directory))
        elif kind == "Normalize":
            normalize = True
        else:
            raise SentenceModulesError(
                f"{path}: module {entry.get('type')!r} is not one SIE applies (Transformer, Pooling, Dense, Normalize)"
            )
    stack = SentenceModules(pooling, tuple(dense), normalize)
    for before, after in zip(stack.dense, stack.dense[1:], strict=False):
        if before.out_features != after.in_features:
            raise SentenceModulesError(
                f"{path}: a Dense layer of {before.out_features} outputs feeds one of {after.in_features} inputs"
            )
    return stack


def _entries(path: Path, dense_path: str | None) -> list[dict]:
    """modules.json's entries, the one Dense module's directory replaced by `dense_path` when given."""
    entries = _json(path)
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise SentenceModulesError(f"{path}: not a list of module objects")
    if dense_path is None:
        return entries
    dense = [index for index, entry in enumerate(entries) if str(entry.get("type", "")).endswith(".Dense")]
    if len(dense) != 1:
        raise SentenceModulesError(
            f"{path}: dense_projection_path {dense_path!r} replaces one Dense module; the stack has {len(dense)}"
        )
    if Path(dense_path).is_absolute() or ".." in Path(dense_path).parts:
        raise SentenceModulesError(f"{path}: dense_projection_path {dense_path!r} must name a directory of the model")
    entries = [dict(entry) for entry in entries]
    entries[dense[0]]["path"] = dense_path
    return entries


def _pooling(config_path: Path) -> str:
    config = _json(config_path)
    if not isinstance(config, dict):
        raise SentenceModulesError(f"{config_path}: not a JSON object")
    mode = config.get("pooling_mode")
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode is None:
        chosen = [name for flag, name in _CLASSIC_POOLING.items() if config.get(flag)]
        if len(chosen) != 1:
            raise SentenceModulesError(f"{config_path}: {len(chosen)} pooling modes are on; SIE applies exactly one")
        mode = chosen[0]
    if mode not in _POOLING:
        raise SentenceModulesError(f"{config_path}: pooling mode {mode!r} is not one SIE applies ({sorted(_POOLING)})")
    if config.get("include_prompt") is False:
        raise SentenceModulesError(f"{config_path}: include_prompt false (prompt tokens left out of pooling)")
    return _POOLING[mode]


def _dense(directory: Path) -> DenseStage:
    config_path = directory / "config.json"
    config = _json(config_path)
    if not isinstance(config, dict):
        raise SentenceModulesError(f"{config_path}: not a JSON object")
    try:
        in_features, out_features = int(config["in_features"]), int(config["out_features"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SentenceModulesError(f"{config_path}: in_features and out_features are required numbers") from exc
    activation = str(config.get("activation_function", "torch.nn.modules.linear.Identity")).rsplit(".", 1)[-1]
    if activation not in ACTIVATIONS:
        raise SentenceModulesError(
            f"{config_path}: activation {config.get('activation_function')!r} is not one SIE applies "
            f"({sorted(ACTIVATIONS)})"
        )
    weights = directory / "model.safetensors"
    if not weights.is_file():
        found = sorted(path.name for path in directory.iterdir()) if directory.is_dir() else []
        raise SentenceModulesError(f"{directory}: no model.safetensors for the Dense layer (found {found})")
    try:
        tensors = SafetensorsFile(weights)
        weight = tensors.load("linear.weight")
        bias = tensors.load("linear.bias") if "linear.bias" in tensors else None
    except ConversionError as exc:
        raise SentenceModulesError(str(exc)) from exc
    if weight.shape != (out_features, in_features) or (bias is not None and bias.shape != (out_features,)):
        raise SentenceModulesError(
            f"{weights}: linear weights of shape {list(weight.shape)} do not match {in_features} -> {out_features}"
        )
    residual = _residual(tensors, weights, in_features, out_features) if config.get("use_residual") else None
    return DenseStage(np.ascontiguousarray(weight.T), bias, activation, residual)


def _residual(tensors: SafetensorsFile, weights: Path, in_features: int, out_features: int) -> np.ndarray:
    """PyLate's residual Dense adds its input back: as it is when the widths are equal, else projected."""
    if in_features == out_features:
        return np.eye(in_features, dtype=np.float32)
    if "residual.weight" not in tensors:
        raise SentenceModulesError(f"{weights}: use_residual is set but there is no residual.weight")
    residual = np.ascontiguousarray(tensors.load("residual.weight").T)
    if residual.shape != (in_features, out_features):
        raise SentenceModulesError(f"{weights}: residual weights of shape {list(residual.shape)} do not fit")
    return residual


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SentenceModulesError(f"{path}: cannot read file: {exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SentenceModulesError(f"{path}: not valid JSON: {exc}") from exc
