"""Sentence vectors pooled where the model ran: on a GPU, a dense encoder's token states stay in the device's memory
and only the pooled `[batch, hidden]` vectors come to the host.

`session.run` returns every output as a host array: for a dense encoder on a GPU that is the whole
`[batch, sequence, hidden]` of token states, copied from the device at every batch and then pooled by numpy on the
host (`outputs.pool`), which for a small encoder in float16 takes longer than the model's run. `DevicePooling` binds
the model's token-state output on its device instead (onnxruntime's IOBinding) and runs a small pooling graph there,
on the same provider and device (`sie.worker.convert.pooling` builds it; the loader hands the builder to adapters whose
sessions run on a GPU, `AdapterContext.pooling_graph`): masked mean, first token (`cls`) and last real token (`last`),
each accumulated in float32 whatever the token states' precision, the same arithmetic as `outputs.pool`. The CPU
keeps `session.run` and numpy: there is no copy to save.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import numpy as np

from sie.worker.convert.names import POOLED_MODES, POOLING_ATTENTION_MASK, POOLING_TOKEN_STATES
from sie.worker.generation.decoder_run import device_of
from sie.worker.outputs import pool

logger = logging.getLogger(__name__)

# The pooling modes' other names (`outputs.pool` reads `last_token` as `last`).
MODE_ALIASES: Final = {"last_token": "last"}
# The token states' types the pooling graph reads (onnxruntime's names).
POOLED_TYPES: Final = ("tensor(float)", "tensor(float16)")
# Builds the pooling graph for token states of one of POOLED_TYPES (`sie.worker.convert.pooling.pooling_graph`).
PoolingGraph = Callable[[str], bytes]


def device_pooling_for(session: Any, token_output: str, pooling_graph: PoolingGraph | None) -> DevicePooling | None:
    """A DevicePooling for `session`'s `token_output` where the loader gave a pooling graph (a GPU), else None. Token
    states of a type the graph cannot read, or a pooling session the provider will not open, leave the model pooling
    on the host (logged once): the model serves either way."""
    if pooling_graph is None:
        return None
    try:
        return DevicePooling(session, token_output, pooling_graph)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped pybind exceptions
        logger.warning("token states %r stay pooled on the host: %s", token_output, exc)
        return None


class DevicePooling:
    """Runs a model's session with its token-state output left on the session's device, and pools it there."""

    def __init__(self, session: Any, token_output: str, pooling_graph: PoolingGraph) -> None:
        import onnxruntime  # the worker's runtime; imported where a session exists

        types = {output.name: output.type for output in session.get_outputs()}
        if types.get(token_output) not in POOLED_TYPES:
            raise ValueError(f"token states {token_output!r} of type {types.get(token_output)} cannot be pooled")
        self._session = session
        self._token_output = token_output
        self._device = device_of(session)
        providers = session.get_providers()
        provider_options = session.get_provider_options()
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        self._pooling = onnxruntime.InferenceSession(
            pooling_graph(types[token_output]),
            sess_options=options,
            providers=providers,
            provider_options=[provider_options.get(provider, {}) for provider in providers],
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """One run of the model over `feeds`: its token states as an OrtValue on the device (a one-item list, as
        `run_memory.run_slices` collects each slice's outputs)."""
        binding = self._session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        binding.bind_output(self._token_output, *self._device)
        self._session.run_with_iobinding(binding)
        return binding.get_outputs()

    def pooled(self, states: Any, attention_mask: np.ndarray, modes: Sequence[str]) -> dict[str, np.ndarray]:
        """The vectors of `modes` (each of POOLED_MODES or an alias) from one run's device-resident `states` and
        the mask to pool under: float32 host arrays, [rows, hidden]."""
        wanted = sorted({MODE_ALIASES.get(mode, mode) for mode in modes})
        unknown = [mode for mode in wanted if mode not in POOLED_MODES]
        if unknown:
            raise ValueError(f"unknown pooling {unknown[0]!r}; expected one of {list(POOLED_MODES)}")
        binding = self._pooling.io_binding()
        binding.bind_ortvalue_input(POOLING_TOKEN_STATES, states)
        binding.bind_cpu_input(POOLING_ATTENTION_MASK, np.ascontiguousarray(attention_mask, dtype=np.int64))
        for mode in wanted:
            binding.bind_output(mode, "cpu")
        self._pooling.run_with_iobinding(binding)
        vectors = binding.copy_outputs_to_cpu()
        pooled = dict(zip(wanted, vectors, strict=True))
        return {mode: pooled[MODE_ALIASES.get(mode, mode)] for mode in modes}

    def token_states(self, runs: Sequence[Sequence[Any]]) -> DeviceTokenStates:
        """The batch's token states from its runs' outputs (`run`'s, one list per row slice, in row order)."""
        return DeviceTokenStates([outputs[0] for outputs in runs], self)


class DeviceTokenStates:
    """A batch's token states on the device, as one or more runs left them (row slices, in order), pooled on
    demand: the stand-in for the `[batch, sequence, hidden]` host array a dense adapter would otherwise pool."""

    def __init__(self, parts: Sequence[Any], pooling: DevicePooling) -> None:
        self._parts = list(parts)
        self._pooling = pooling
        self._rows = [int(part.shape()[0]) for part in self._parts]
        self._pooled: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        self._host: np.ndarray | None = None

    def pooled(self, attention_mask: np.ndarray, mode: str) -> np.ndarray:
        """[batch, hidden] float32: every row pooled under `attention_mask` (the batch's, or one with tokens
        cleared) by `mode`. Pooled once per mask and mode: scoring asks again for each query's rows."""
        key = (mode, id(attention_mask))
        cached = self._pooled.get(key)
        if cached is not None and cached[0] is attention_mask:
            return cached[1]
        vectors = []
        start = 0
        for part, rows in zip(self._parts, self._rows, strict=True):
            vectors.append(self._pooling.pooled(part, attention_mask[start : start + rows], [mode])[mode])
            start += rows
        joined = vectors[0] if len(vectors) == 1 else np.concatenate(vectors)
        self._pooled[key] = (attention_mask, joined)
        return joined

    def to_host(self) -> np.ndarray:
        """Every row's token states on the host, `[batch, sequence, hidden]`: for outputs made per token (BGE-M3's
        sparse and multi-vector heads), copied once, and only when a row asks for one."""
        if self._host is None:
            parts = [part.numpy() for part in self._parts]
            self._host = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return self._host


def pooled_rows(
    states: np.ndarray | DeviceTokenStates, attention_mask: np.ndarray, mode: str, rows: list[int] | None = None
) -> np.ndarray:
    """The sentence vectors of `rows` (every row when None) pooled by `mode` under `attention_mask`: numpy's pooling
    of a host array of token states (`outputs.pool`), or the device's of states left there."""
    if isinstance(states, DeviceTokenStates):
        vectors = states.pooled(attention_mask, mode)
        return vectors if rows is None else vectors[rows]
    if rows is None:
        return pool(states, attention_mask, mode)
    return pool(states[rows], attention_mask[rows], mode)
