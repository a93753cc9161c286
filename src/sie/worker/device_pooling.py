"""Sentence vectors pooled, and token heads applied, where the model ran: on a GPU, an encoder's token states stay in
the device's memory and only what is made of them comes to the host.

`session.run` returns every output as a host array: for an encoder on a GPU that is the whole
`[batch, sequence, hidden]` of token states, copied from the device at every batch and then pooled by numpy on the
host (`outputs.pool`), which for a small encoder in float16 takes longer than the model's run. `DevicePooling` binds
the model's token-state output on its device instead (onnxruntime's IOBinding) and runs small graphs there, on the
same provider and device (`sie.worker.convert.device_graphs` builds them; the loader hands the builders to adapters
whose sessions run on a GPU, `AdapterContext.device_graphs`):

- pooling: masked mean, first token (`cls`) and last real token (`last`), each accumulated in float32 whatever the
  token states' precision, the same arithmetic as `outputs.pool`;
- token heads: the Dense layers a model applies to every token (a ColBERT projection; BGE-M3's sparse and ColBERT
  heads), the same arithmetic as `sentence_modules.DenseStage`. Per-token outputs have to reach the host, but
  projected (a ColBERT's 128 numbers a token instead of 768) and computed by the GPU rather than by numpy on the
  host's cores, which for a ColBERT batch took as long as the model's run.

The CPU keeps `session.run` and numpy: there is no copy to save.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs
import numpy as np

from sie.worker.convert.names import POOLED_MODES, POOLING_ATTENTION_MASK, POOLING_TOKEN_STATES, TOKEN_HEAD_OUTPUT
from sie.worker.generation.decoder_run import device_of
from sie.worker.outputs import pool
from sie.worker.sentence_modules import DenseStage

logger = logging.getLogger(__name__)

# The pooling modes' other names (`outputs.pool` reads `last_token` as `last`).
MODE_ALIASES: Final = {"last_token": "last"}
# The token states' types the graphs read (onnxruntime's names).
POOLED_TYPES: Final = ("tensor(float)", "tensor(float16)")


@attrs.frozen
class DeviceGraphs:
    """The builders of the graphs run beside a model on its device (`sie.worker.convert.device_graphs`), each given
    the token states' type: the loader hands them to adapters whose sessions run on a GPU (adapters do not import
    the converter)."""

    pooling: Callable[[str], bytes]  # pooling_graph
    token_head: Callable[[str, Sequence[DenseStage]], bytes]  # token_head_graph


def device_pooling_for(
    session: Any,
    token_output: str,
    graphs: DeviceGraphs | None,
    heads: Mapping[str, Sequence[DenseStage]] | None = None,
) -> DevicePooling | None:
    """A DevicePooling for `session`'s `token_output` (with the token `heads`, by name) where the loader gave graph
    builders (a GPU), else None. Token states of a type the graphs cannot read, or a session the provider will not
    open, leave the model pooling and applying its heads on the host (logged once): the model serves either way."""
    if graphs is None:
        return None
    try:
        return DevicePooling(session, token_output, graphs, heads or {})
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped pybind exceptions
        logger.warning("token states %r stay pooled on the host: %s", token_output, exc)
        return None


class DevicePooling:
    """Runs a model's session with its token-state output left on the session's device, and pools it or runs its
    token heads there."""

    def __init__(
        self, session: Any, token_output: str, graphs: DeviceGraphs, heads: Mapping[str, Sequence[DenseStage]]
    ) -> None:
        import onnxruntime  # the worker's runtime; imported where a session exists

        types = {output.name: output.type for output in session.get_outputs()}
        states_type = types.get(token_output)
        if states_type not in POOLED_TYPES:
            raise ValueError(f"token states {token_output!r} of type {states_type} cannot be pooled")
        self._session = session
        self._token_output = token_output
        self._device = device_of(session)
        providers = session.get_providers()
        provider_options = session.get_provider_options()
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3

        def beside(graph: bytes) -> Any:  # a session on the model's provider and device
            return onnxruntime.InferenceSession(
                graph,
                sess_options=options,
                providers=providers,
                provider_options=[provider_options.get(provider, {}) for provider in providers],
            )

        self._pooling = beside(graphs.pooling(states_type))
        self._heads = {name: beside(graphs.token_head(states_type, stages)) for name, stages in heads.items()}

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

    def has_head(self, head: str) -> bool:
        """Whether a session for the token head `head` runs beside the model."""
        return head in self._heads

    def through_head(self, states: Any, head: str) -> np.ndarray:
        """The token head `head` over one run's device-resident `states`: a float32 host array, [rows, sequence,
        width]."""
        session = self._heads[head]
        binding = session.io_binding()
        binding.bind_ortvalue_input(POOLING_TOKEN_STATES, states)
        binding.bind_output(TOKEN_HEAD_OUTPUT, "cpu")
        session.run_with_iobinding(binding)
        (vectors,) = binding.copy_outputs_to_cpu()
        return vectors

    def token_states(self, runs: Sequence[Sequence[Any]]) -> DeviceTokenStates:
        """The batch's token states from its runs' outputs (`run`'s, one list per row slice, in row order)."""
        return DeviceTokenStates([outputs[0] for outputs in runs], self)


class DeviceTokenStates:
    """A batch's token states on the device, as one or more runs left them (row slices, in order), pooled or run
    through a token head on demand: the stand-in for the `[batch, sequence, hidden]` host array an adapter would
    otherwise read."""

    def __init__(self, parts: Sequence[Any], pooling: DevicePooling) -> None:
        self._parts = list(parts)
        self._pooling = pooling
        self._rows = [int(part.shape()[0]) for part in self._parts]
        self._pooled: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        self._heads: dict[str, np.ndarray] = {}
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
        joined = _joined(vectors)
        self._pooled[key] = (attention_mask, joined)
        return joined

    def has_head(self, head: str) -> bool:
        """Whether the device runs the token head `head` over these states."""
        return self._pooling.has_head(head)

    def through_head(self, head: str) -> np.ndarray:
        """[batch, sequence, width] float32: the token head `head` over every token, run once per batch (each row
        then reads its own tokens)."""
        if head not in self._heads:
            self._heads[head] = _joined([self._pooling.through_head(part, head) for part in self._parts])
        return self._heads[head]

    def to_host(self) -> np.ndarray:
        """Every row's token states on the host, `[batch, sequence, hidden]`: for per-token outputs with no head to
        run on the device, copied once, and only when a row asks for one."""
        if self._host is None:
            self._host = _joined([part.numpy() for part in self._parts])
        return self._host


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


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


def head_rows(
    states: np.ndarray | DeviceTokenStates,
    head: str,
    stages: Sequence[DenseStage],
    row: int,
    positions: np.ndarray | slice,
) -> np.ndarray:
    """Row `row`'s token states at `positions` through `stages` (the token head named `head`): the device's head
    over states left there, or numpy's stages over those tokens of a host array (or of states whose head the device
    does not run: copied to the host once)."""
    if isinstance(states, DeviceTokenStates):
        if states.has_head(head):
            return states.through_head(head)[row][positions]
        states = states.to_host()
    vectors = states[row][positions]
    for stage in stages:
        vectors = stage(vectors)
    return vectors
