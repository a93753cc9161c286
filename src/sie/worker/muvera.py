"""MUVERA fixed-dimensional encodings (Dhulipala et al., arXiv 2405.19504): a multi-vector model's token vectors folded
into one dense vector whose inner products approximate MaxSim, so a plain vector index can search them.

Per repetition, SimHash (`num_simhash_projections` Gaussian projections, their sign bits read as a Gray code) puts
each token in one of 2^k partitions; a partition holds the sum (a query) or the mean (a document) of its tokens,
projected to `projection_dim` by an AMS sketch (one ±1 per input dimension) when that is set. The repetitions are
concatenated, then folded to `final_projection_dim` by a Count Sketch when that is smaller; `normalize` makes the
result unit length, `center_tokens` takes each text's mean token off before partitioning.

The random structures are drawn as the public SIE server draws them (numpy's `default_rng`: seed + repetition for
each SimHash and AMS matrix, the seed itself for the Count Sketch's indices then signs), so its vectors and these
are interchangeable in one index. The settings are a profile's `adapter_options.loadtime.muvera_config`, with the
public server's defaults for what it leaves out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs
import numpy as np

# The public server's MuveraConfig defaults (the paper's: 40 repetitions of 64 partitions, full token width, then
# a Count Sketch to 10,240 dimensions).
DEFAULTS: Final[dict[str, Any]] = {
    "num_repetitions": 40,
    "num_simhash_projections": 6,
    "projection_dim": None,
    "final_projection_dim": 10240,
    "seed": 42,
    "normalize": False,
    "center_tokens": False,
}
# 2^k partitions per repetition: past this the encoding is too wide to serve.
MAX_SIMHASH_PROJECTIONS: Final = 16
MAX_ENCODING_DIM: Final = 1 << 24


class MuveraConfigError(ValueError):
    """A `muvera_config` the encoding cannot be built from; the message names the key."""


@attrs.frozen
class MuveraConfig:
    """The encoding's settings (see the module docstring)."""

    num_repetitions: int
    num_simhash_projections: int
    projection_dim: int | None
    final_projection_dim: int | None
    seed: int
    normalize: bool
    center_tokens: bool

    @classmethod
    def read(cls, options: Mapping[str, Any] | None) -> MuveraConfig:
        """From a profile's `muvera_config` (None: every default); MuveraConfigError names a bad or unknown key."""
        if options is not None and not isinstance(options, Mapping):
            raise MuveraConfigError(f"muvera_config must be a mapping, got {options!r}")
        unknown = sorted(set(options or {}) - set(DEFAULTS))
        if unknown:
            raise MuveraConfigError(f"muvera_config keys {unknown} are not known; expected some of {sorted(DEFAULTS)}")
        values = {**DEFAULTS, **(options or {})}
        for key in ("num_repetitions", "num_simhash_projections", "projection_dim", "final_projection_dim"):
            value = values[key]
            optional = key in ("projection_dim", "final_projection_dim")
            if not (optional and value is None) and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise MuveraConfigError(f"muvera_config.{key} must be a whole number of at least 1, got {value!r}")
        if values["num_simhash_projections"] > MAX_SIMHASH_PROJECTIONS:
            raise MuveraConfigError(f"muvera_config.num_simhash_projections is at most {MAX_SIMHASH_PROJECTIONS}")
        if isinstance(values["seed"], bool) or not isinstance(values["seed"], int) or values["seed"] < 0:
            raise MuveraConfigError(f"muvera_config.seed must be a whole number, got {values['seed']!r}")
        for key in ("normalize", "center_tokens"):
            if not isinstance(values[key], bool):
                raise MuveraConfigError(f"muvera_config.{key} must be true or false, got {values[key]!r}")
        return cls(**values)

    @property
    def partitions(self) -> int:
        return 1 << self.num_simhash_projections


class Muvera:
    """The encoding of one model's token vectors (`token_dim` wide)."""

    def __init__(self, token_dim: int, config: MuveraConfig) -> None:
        self.config = config
        self.token_dim = token_dim
        self.width = config.projection_dim or token_dim  # a partition's width
        self.concatenated_dim = config.num_repetitions * config.partitions * self.width
        if self.concatenated_dim > MAX_ENCODING_DIM:
            raise MuveraConfigError(
                f"muvera_config gives {self.concatenated_dim} dimensions before the final projection; at most "
                f"{MAX_ENCODING_DIM} are served"
            )
        final = config.final_projection_dim
        # A Count Sketch to as many dimensions or more could only lose information: the public server skips it.
        self.sketched = final is not None and final < self.concatenated_dim
        self.dim = final if self.sketched else self.concatenated_dim
        repetitions = range(config.num_repetitions)
        # [token_dim, repetitions × k]: every repetition's SimHash in one product.
        self._simhash = np.concatenate([_simhash(token_dim, config.num_simhash_projections, config.seed + r)
                                        for r in repetitions], axis=1)  # fmt: skip
        self._ams = (
            None
            if config.projection_dim is None
            else np.concatenate([_ams(token_dim, self.width, config.seed + r) for r in repetitions], axis=1)
        )
        if self.sketched:
            rng = np.random.default_rng(config.seed)
            self._sketch_index = rng.integers(0, self.dim, size=self.concatenated_dim)
            self._sketch_sign = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=self.concatenated_dim)

    def encode(self, tokens: np.ndarray, is_query: bool) -> np.ndarray:
        """The encoding of one text's token vectors `[tokens, token_dim]`: float32 `[dim]` (zeros for no tokens)."""
        config = self.config
        if len(tokens) == 0:
            return np.zeros(self.dim, dtype=np.float32)
        tokens = np.asarray(tokens, dtype=np.float32)
        if config.center_tokens:
            tokens = tokens - tokens.mean(axis=0, keepdims=True)
        repetitions, bits = config.num_repetitions, config.num_simhash_projections
        signs = (tokens @ self._simhash > 0).reshape(len(tokens), repetitions, bits)
        partition = np.zeros((len(tokens), repetitions), dtype=np.int64)
        for bit in range(bits):  # the sign bits as a Gray code, most significant first
            partition = (partition << 1) + (signs[:, :, bit] ^ (partition & 1))
        projected = tokens if self._ams is None else tokens @ self._ams
        projected = projected.reshape(len(tokens), -1, self.width)  # [tokens, 1 or repetitions, width]
        cells = (np.arange(repetitions) * config.partitions + partition).reshape(-1)  # [tokens × repetitions]
        rows = np.broadcast_to(projected, (len(tokens), repetitions, self.width)).reshape(-1, self.width)
        sums = np.zeros((repetitions * config.partitions, self.width), dtype=np.float32)
        np.add.at(sums, cells, rows)
        if not is_query:
            counts = np.bincount(cells, minlength=len(sums))
            filled = counts > 0
            sums[filled] /= counts[filled, None].astype(np.float32)
        encoding = sums.reshape(-1)
        if self.sketched:
            folded = np.zeros(self.dim, dtype=np.float32)
            np.add.at(folded, self._sketch_index, self._sketch_sign * encoding)
            encoding = folded
        if config.normalize:
            norm = float(np.linalg.norm(encoding))
            if norm > 0:
                encoding = encoding / norm
        return encoding.astype(np.float32, copy=False)


def _simhash(token_dim: int, projections: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(loc=0.0, scale=1.0, size=(token_dim, projections)).astype(np.float32)


def _ams(token_dim: int, width: int, seed: int) -> np.ndarray:
    """One ±1 per input dimension, in a random output column."""
    rng = np.random.default_rng(seed)
    columns = rng.integers(0, width, size=token_dim)
    signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=token_dim)
    matrix = np.zeros((token_dim, width), dtype=np.float32)
    matrix[np.arange(token_dim), columns] = signs
    return matrix
