"""The adapter interface: one loaded model profile that turns a batch of work items into results.

An adapter gets the wire batch items of one operation, validates each item on its own (a bad item
never fails its batch-mates), runs one `session.run` for the whole batch and post-processes with
numpy. Results are public result objects (dicts holding ndarrays); framing happens elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np

from sie.catalog.model import ModelConfig, Profile
from sie.catalog.options import option_problem
from sie.tokenization import TextTokenizer
from sie.wire import codes
from sie.worker.device_pooling import DeviceGraphs, DevicePooling, DeviceTokenStates
from sie.worker.generation.batching_decoder import DecoderLimits
from sie.worker.run_memory import DEFAULT_RUN_MEMORY_BYTES, RunMemory, run_in_slices, run_slices

ENCODE_OUTPUTS = ("dense", "sparse", "multivector")


@attrs.frozen
class ItemResult:
    """One item's outcome: a public result, or an error with its wire code."""

    result: Any = None
    error: str | None = None
    error_code: str | None = None
    input_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


def invalid(message: str, code: str = codes.INVALID_INPUT) -> ItemResult:
    return ItemResult(error=message, error_code=code)


def entity_result(entities: list[dict]) -> dict[str, Any]:
    """An extract result holding `entities` only (the public ExtractResult's other fields empty)."""
    return {"entities": entities, "relations": [], "classifications": [], "objects": [], "data": {}}


@attrs.define
class BatchResult:
    """Per-item results in input order, plus the batch's stage timings in milliseconds."""

    items: list[ItemResult]
    tokenization_ms: float = 0.0
    inference_ms: float = 0.0
    postprocessing_ms: float = 0.0


class Stopwatch:
    """Accumulates stage durations in milliseconds (`with watch.stage("inference"): ...`)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._stage = ""
        self._start = 0.0

    def stage(self, name: str) -> Stopwatch:
        self._stage = name
        return self

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc_info: object) -> None:
        elapsed = (time.perf_counter() - self._start) * 1000.0
        self.ms[self._stage] = self.ms.get(self._stage, 0.0) + elapsed

    def finish(self, items: list[ItemResult]) -> BatchResult:
        return BatchResult(
            items=items,
            tokenization_ms=self.ms.get("tokenization", 0.0),
            inference_ms=self.ms.get("inference", 0.0),
            postprocessing_ms=self.ms.get("postprocessing", 0.0),
        )


@attrs.frozen
class AdapterContext:
    """Everything an adapter needs, built by the loader."""

    model: ModelConfig
    profile: Profile
    session: Any
    tokenizer: TextTokenizer
    model_config_json: Mapping[str, Any] = attrs.field(factory=dict)
    run_memory_bytes: int = DEFAULT_RUN_MEMORY_BYTES  # activation memory one session.run may take
    # Generation models: tokenizer_config.json (chat template, special tokens), the tokenizer file (decoding
    # generated ids) and how many sequences decode together (SIE_GENERATION_MAX_SEQUENCES).
    tokenizer_config_json: Mapping[str, Any] = attrs.field(factory=dict)
    tokenizer_path: Path | None = None
    generation_limits: DecoderLimits = attrs.Factory(DecoderLimits)
    # The checkpoint's directory: where a sentence-transformers model keeps its module stack (`modules.json`).
    model_dir: Path | None = None
    # A head trained apart from the model, from where its profile names it (stablebridge's pruning head).
    head_file: Path | None = None
    # Sessions of a model's other graphs, by role (a bi-encoder GLiNER's "labels" graph).
    extra_sessions: Mapping[str, Any] = attrs.field(factory=dict)
    # The models a composite adapter serves as one (a GLiNER union's members, its own checkpoint first).
    members: Sequence[Adapter] = ()
    # Where sessions run on a GPU: the builders of the graphs that pool token states and run token heads there
    # (`device_pooling`); None on the CPU, where numpy does both.
    device_graphs: DeviceGraphs | None = None


class Adapter:
    """Base class: subclasses declare what they produce and implement the operations they support."""

    kind: ClassVar[str | None] = None  # `sie.catalog.adapters` kind: which request options it reads
    encode_outputs: ClassVar[tuple[str, ...]] = ()
    supports_score: ClassVar[bool] = False
    supports_extract: ClassVar[bool] = False
    # An image model's image processor settings (preprocessor_config.json: the sidecar prepares pixel values with
    # them) and the batch cost of one image; None and 0 for a model that reads no images.
    image_processor_config: Mapping[str, Any] | None = None
    image_cost: int = 0

    def __init__(self, context: AdapterContext) -> None:
        self.context = context
        self.model = context.model
        self.profile = context.profile
        self.session = context.session
        self.tokenizer = context.tokenizer
        self.runtime_options: dict[str, Any] = dict(context.profile.runtime_options)
        self._input_names = [node.name for node in self.session.get_inputs()]
        self._run_memory = RunMemory.from_config(context.model_config_json)

    @property
    def default_output(self) -> str:
        return self.encode_outputs[0] if self.encode_outputs else ""

    def refused_options(self, request_options: Mapping[str, Any] | None, operation: str) -> ItemResult | None:
        """An INVALID_INPUT result when the request's own options are ones this kind of model does not read or
        hold values they do not allow (`sie.catalog.options`; the gateway refuses them first); else None."""
        problem = option_problem(request_options, self.kind, operation)
        return invalid(problem) if problem is not None else None

    def options_for(self, request_options: Mapping[str, Any] | None) -> dict[str, Any]:
        """Profile runtime options overlaid by the request's options (request wins)."""
        return {**self.runtime_options, **dict(request_options or {})}

    def run_session(
        self,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        shared: Mapping[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        """session.run over the batch, feeding only the inputs the graph declares; in row slices when the run
        would take more activation memory than the context's `run_memory_bytes`. `shared` feeds have no row axis
        and go whole with every slice."""
        shared = dict(shared or {})
        declared = {name: feeds[name] for name in self._input_names if name not in shared}
        return run_in_slices(
            lambda part: self.session.run(outputs, {**part, **shared}), declared, self._run_memory,
            self.context.run_memory_bytes,
        )  # fmt: skip

    def run_token_states(
        self, feeds: Mapping[str, np.ndarray], output: str, pooling: DevicePooling | None
    ) -> np.ndarray | DeviceTokenStates:
        """The graph's token states `output` over the batch: a host array (`run_session`), or with `pooling` (a GPU)
        left on the session's device, run in the same row slices, to be pooled there (`device_pooling.pooled_rows`
        reads either)."""
        if pooling is None:
            return self.run_session(feeds, [output])[0]
        declared = {name: feeds[name] for name in self._input_names}
        return pooling.token_states(run_slices(pooling.run, declared, self._run_memory, self.context.run_memory_bytes))

    def close(self) -> None:
        """Release what the adapter runs beside its session (a causal LM's decode thread); called on unload."""

    def generation_sequences(self) -> tuple[int, int] | None:
        """Generations (decoding, waiting for a row) for a model that generates; None for one that does not."""
        return None

    def encode(self, items: Sequence[Any]) -> BatchResult:
        return BatchResult([invalid(f"Model '{self.model.sie_id}' does not support encode") for _ in items])

    def score(self, items: Sequence[Any]) -> BatchResult:
        return BatchResult([invalid(f"Model '{self.model.sie_id}' does not support scoring") for _ in items])

    def extract(self, items: Sequence[Any]) -> BatchResult:
        return BatchResult([invalid(f"Model '{self.model.sie_id}' does not support extraction") for _ in items])
