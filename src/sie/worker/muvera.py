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

import functools
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
# Partitions × tokens of the one-hot matrices one product takes (a text's repetitions go in chunks of at most this).
ONE_HOT_CELLS: Final = 1 << 22


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


@attrs.frozen
class _RandomStructures:
    simhash: np.ndarray  # [token_dim, repetitions × k]
    ams: np.ndarray | None  # [token_dim, repetitions × projection_dim]
    sketch_index: np.ndarray | None  # [concatenated_dim]: each dimension's Count Sketch bucket
    sketch_sign: np.ndarray | None


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

    @functools.cached_property
    def _random(self) -> _RandomStructures:
        """Drawn at the first encoding (a Count Sketch over a wide model's tokens takes tens of megabytes: a model
        that is never asked for MUVERA does not hold them)."""
        config, repetitions = self.config, range(self.config.num_repetitions)
        # [token_dim, repetitions × k]: every repetition's SimHash in one product.
        simhash = np.concatenate([_simhash(self.token_dim, config.num_simhash_projections, config.seed + r)
                                  for r in repetitions], axis=1)  # fmt: skip
        ams = None
        if config.projection_dim is not None:
            ams = np.concatenate([_ams(self.token_dim, self.width, config.seed + r) for r in repetitions], axis=1)
        sketch_index = sketch_sign = None
        if self.sketched:
            rng = np.random.default_rng(config.seed)
            sketch_index = rng.integers(0, self.dim, size=self.concatenated_dim)
            sketch_sign = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=self.concatenated_dim)
        return _RandomStructures(simhash, ams, sketch_index, sketch_sign)

    def encode(self, tokens: np.ndarray, is_query: bool) -> np.ndarray:
        """The encoding of one text's token vectors `[tokens, token_dim]`: float32 `[dim]` (zeros for no tokens)."""
        config = self.config
        if len(tokens) == 0:
            return np.zeros(self.dim, dtype=np.float32)
        random = self._random
        tokens = np.asarray(tokens, dtype=np.float32)
        if config.center_tokens:
            tokens = tokens - tokens.mean(axis=0, keepdims=True)
        repetitions, bits = config.num_repetitions, config.num_simhash_projections
        signs = (tokens @ random.simhash > 0).reshape(len(tokens), repetitions, bits)
        partition = np.zeros((len(tokens), repetitions), dtype=np.int64)
        for bit in range(bits):  # the sign bits as a Gray code, most significant first
            partition = (partition << 1) + (signs[:, :, bit] ^ (partition & 1))
        # [repetitions, tokens, width], or [tokens, width] shared by every repetition (no AMS projection)
        projected = tokens if random.ams is None else (tokens @ random.ams).reshape(len(tokens), repetitions, -1)
        if random.ams is not None:
            projected = projected.transpose(1, 0, 2)
        sums = np.empty((repetitions, config.partitions, self.width), dtype=np.float32)
        counts = np.empty((repetitions, config.partitions), dtype=np.float32)
        step = max(1, ONE_HOT_CELLS // (config.partitions * len(tokens)))
        for first in range(0, repetitions, step):  # each partition's sum as one product with its tokens' one-hot
            block = slice(first, min(first + step, repetitions))
            count = block.stop - block.start
            one_hot = np.zeros((count, config.partitions, len(tokens)), dtype=np.float32)
            one_hot[np.arange(count)[:, None], partition[:, block].T, np.arange(len(tokens))] = 1.0
            sums[block] = one_hot @ (projected if random.ams is None else projected[block])
            counts[block] = one_hot.sum(axis=2)
        if not is_query:
            filled = counts > 0
            sums[filled] /= counts[filled][:, None]
        encoding = sums.reshape(-1)
        if self.sketched:  # summed in float64 (bincount is many times faster than a float32 add.at), then float32
            encoding = np.bincount(random.sketch_index, weights=random.sketch_sign * encoding, minlength=self.dim)
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
