"""`BertWeights`: finds BERT tensors by their canonical Hugging Face names and checks their shapes.

It hides the spelling differences between checkpoints (the `bert.` prefix of task models, the old
`gamma`/`beta` LayerNorm names) so the graph builder asks for one name per parameter.
"""

from __future__ import annotations

import numpy as np

from sie.worker.convert.errors import ConversionError
from sie.worker.convert.safetensors_io import SafetensorsFile

_OLD_LAYER_NORM_NAMES = {".LayerNorm.weight": ".LayerNorm.gamma", ".LayerNorm.bias": ".LayerNorm.beta"}


class BertWeights:
    """Tensor lookup over one safetensors file, with BERT's naming variants resolved."""

    def __init__(self, tensors: SafetensorsFile) -> None:
        self.tensors = tensors
        names = tensors.entries
        self.prefix = "bert." if any(name.startswith("bert.embeddings.") for name in names) else ""

    @property
    def source(self) -> str:
        return str(self.tensors.path)

    def base(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """A tensor of the encoder itself (`embeddings.*`, `encoder.*`, `pooler.*`)."""
        return self.get(self.prefix + name, shape)

    def base_linear(self, name: str, in_features: int, out_features: int) -> tuple[np.ndarray, np.ndarray]:
        return self.linear(self.prefix + name, in_features, out_features)

    def base_layer_norm(self, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
        return self.layer_norm(self.prefix + name, width)

    def has(self, name: str) -> bool:
        return self._stored_name(name) is not None

    def get(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor `name` (a full name such as `classifier.weight`) as float32 of exactly `shape`."""
        stored = self._stored_name(name)
        if stored is None:
            raise ConversionError("required tensor is missing", source=self.source, tensor=name)
        array = self.tensors.load(stored)
        if array.shape != shape:
            raise ConversionError(
                f"has shape {list(array.shape)}, expected {list(shape)}", source=self.source, tensor=stored
            )
        if not np.isfinite(array).all():
            raise ConversionError("contains NaN or infinite values", source=self.source, tensor=stored)
        return array

    def linear(self, name: str, in_features: int, out_features: int) -> tuple[np.ndarray, np.ndarray]:
        """`(weight [in, out], bias [out])` of the torch Linear `name`, transposed for `x @ W`."""
        weight = self.get(f"{name}.weight", (out_features, in_features))
        bias = self.get(f"{name}.bias", (out_features,))
        return np.ascontiguousarray(weight.T), bias

    def layer_norm(self, name: str, width: int) -> tuple[np.ndarray, np.ndarray]:
        """`(scale, bias)` of the LayerNorm `name`."""
        return self.get(f"{name}.weight", (width,)), self.get(f"{name}.bias", (width,))

    def _stored_name(self, name: str) -> str | None:
        if name in self.tensors:
            return name
        for new, old in _OLD_LAYER_NORM_NAMES.items():
            if name.endswith(new):
                legacy = name[: -len(new)] + old
                if legacy in self.tensors:
                    return legacy
        return None
