"""Load one model profile end to end: fetch its files, convert safetensors to ONNX when the checkpoint
has no graph (an encoder with its head; a decoder family's checkpoint to a generation graph for a causal LM, or to a
hidden-state graph for the embedding and reranker adapters; a GGUF decoder to an ONNX decoder with its tokenizer),
open the onnxruntime session, load the tokenizer and build the adapter. Converted graphs are cached by content key;
the converter (and `onnx`) is imported only when a conversion is not in the cache.

Blocking by design (downloads, conversion, session creation): the model manager runs it in an
executor. Every failure leaves as a ModelLoadError with a class and a message naming the model.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from sie.catalog.adapters import BIDIRECTIONAL_MODULES
from sie.catalog.errors import ConfigError
from sie.catalog.model import DEFAULT_PROFILE, ModelConfig, Profile
from sie.settings import WorkerSettings
from sie.telemetry.logs import log_fields
from sie.tokenization import TextTokenizer, TokenizerError, with_end_token
from sie.worker.adapters import (
    Adapter,
    AdapterContext,
    CausalLMAdapter,
    GlinerUnionAdapter,
    adapter_class,
    conversion_head,
)
from sie.worker.adapters.gliner_union import member_configs
from sie.worker.artifacts import (
    STAGE_CONVERT,
    ArtifactError,
    ArtifactResolver,
    ProgressCallback,
    ProgressEvent,
    profile_artifacts,
)
from sie.worker.convert.cache_keys import (
    conversion_cache_key,
    decoder_cache_key,
    gguf_cache_key,
    open_clip_cache_key,
)
from sie.worker.convert.errors import ConversionError
from sie.worker.convert.families import position_capacity
from sie.worker.convert.gguf_io import gguf_model_type
from sie.worker.convert.names import (
    CHAT_TEMPLATE_FILE,
    CLIP_HEAD,
    CONFIG_FILE,
    FLOAT16_UNSAFE_MODEL_TYPES,
    GLICLASS_HEAD,
    GLINER2_HEAD,
    GLINER_HEAD,
    GLIREL_HEAD,
    GRAPH_FILE,
    NVEMBED_MODEL_TYPE,
    PROCESSOR_CHAT_TEMPLATE_FILE,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    TORCH_WEIGHTS_FILE,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    is_decoder_config,
    labels_graph_path,
    relations_graph_path,
    side_file,
    vision_graph_path,
)
from sie.worker.convert.safetensors_io import checkpoint_parameters, open_clip_weights_file
from sie.worker.device_pooling import DeviceGraphs
from sie.worker.errors import ModelLoadError
from sie.worker.generation.batching_decoder import DecoderLimits
from sie.worker.sentence_modules import DenseStage
from sie.worker.session import SessionOptions, create_session

DEFAULT_MAX_SEQUENCE_LENGTH = 512
GRAPH_NAMES = ("model.onnx", "onnx/model.onnx")
# A decoder checkpoint's graph for the embedding and reranker adapters: its last hidden states, causal or (a recipe
# that runs the model with `is_causal=False`) attending both ways.
HIDDEN = "hidden"
BIDIRECTIONAL_HIDDEN = "hidden-bidirectional"
# The keys of a profile's `loadtime.forward_kwargs` (what the public server passes to a model's forward) the
# conversion honours; any other would change an answer in a way the graph does not, and fails the load naming it.
FORWARD_KWARGS = ("is_causal",)

logger = logging.getLogger(__name__)


@attrs.frozen
class PreparedFiles:
    """A profile's files on local disk: the ONNX graph, the tokenizer directory and the model directory."""

    graph: Path
    tokenizer_dir: Path
    model_dir: Path
    # The graph's precision when this project converted it (float32, float16); None for a shipped ONNX file.
    precision: str | None = None
    # A head trained apart from the model, fetched from where the profile names it (stablebridge's pruning head).
    head_file: Path | None = None


@attrs.frozen
class LoadedModel:
    """A ready model profile: its adapter and what the manager needs to account for it."""

    model_id: str
    profile: str
    adapter: Adapter
    tokenizer: TextTokenizer
    memory_bytes: int
    tokenizer_path: Path | None = None
    precision: str | None = None  # as PreparedFiles.precision

    def close(self) -> None:
        """Stop what the adapter runs beside its session (a causal LM's decode thread); the manager calls it when
        the model is unloaded."""
        if isinstance(self.adapter, Adapter):  # test doubles stand in for adapters and hold nothing
            self.adapter.close()


class ModelLoader:
    """Builds LoadedModels; owns the artifact resolver and the converted-graph cache."""

    def __init__(
        self,
        resolver: ArtifactResolver,
        converted_dir: Path,
        session_options: SessionOptions,
        generation_limits: DecoderLimits | None = None,
        memory_budget_bytes: int | None = None,
    ) -> None:
        self.resolver = resolver
        self.converted_dir = Path(converted_dir)
        self.session_options = session_options
        self.generation_limits = generation_limits or DecoderLimits()
        # A checkpoint whose converted weights alone would exceed it is refused before it is converted.
        self.memory_budget_bytes = memory_budget_bytes

    @classmethod
    def from_settings(cls, worker: WorkerSettings, device: str = "cpu") -> ModelLoader:
        """The loader a worker (or `sie models pull`) builds from its settings."""
        resolver = ArtifactResolver(worker.model_cache, hf_offline=not worker.hf_fallback)
        options = SessionOptions(
            device, worker.intra_op_threads, worker.inter_op_threads, worker.run_memory_bytes, worker.intra_op_spinning
        )
        limits = DecoderLimits(worker.generation_max_sequences, worker.generation_cache_bytes)
        return cls(resolver, worker.model_cache / "converted", options, limits, worker.memory_budget_bytes)

    def prepare(
        self, model: ModelConfig, profile: str, model_id: str, on_progress: ProgressCallback | None = None
    ) -> PreparedFiles:
        """Fetch a profile's files and convert its checkpoint to ONNX if needed, without opening a session."""
        resolved = self._resolve(model, profile, model_id)
        artifacts = profile_artifacts(model, profile)
        gguf_file = resolved.loadtime_options.get("gguf_file")
        if gguf_file:
            # A GGUF decoder converts to a directory holding the graph, tokenizer and config.json; which adapter
            # serves it does not change the conversion, so it is not looked up here.
            model_dir = self._fetch(artifacts.model, on_progress)
            precision = self._decoder_precision(resolved, None, model_dir / str(gguf_file))
            decoder = self._decoder(model_id, model_dir, str(gguf_file), precision, on_progress)
            return PreparedFiles(decoder / GRAPH_FILE, decoder, decoder, precision)
        adapter_type = adapter_class(resolved.adapter_path)
        if adapter_type is GlinerUnionAdapter:
            # Every member's files; the model's own checkpoint (the first member) stands for the union.
            prepared = []
            for index, config in enumerate(self._union_members(model, resolved, model_id)):
                with _union_member(model_id, config.sie_id if index else None):
                    name = config.sie_id if index else model_id
                    prepared.append(self.prepare(config, DEFAULT_PROFILE, name, on_progress))
            return prepared[0]
        model_dir = self._fetch(artifacts.model, on_progress)
        tokenizer_dir = self._fetch(artifacts.tokenizer, on_progress) if artifacts.tokenizer else model_dir
        if issubclass(adapter_type, CausalLMAdapter):
            # The converted directory holds the graph and the config.json the adapter reads; the tokenizer and its
            # chat template stay with the checkpoint.
            precision = self._decoder_precision(resolved, model_dir)
            decoder = self._decoder_checkpoint(model_id, model_dir, precision)
            return PreparedFiles(decoder / GRAPH_FILE, tokenizer_dir, decoder, precision)
        head = resolved.loadtime_options.get("onnx_head") or conversion_head(adapter_type, model_dir)
        open_clip_weights = open_clip_weights_file(model_dir) if head == CLIP_HEAD else None
        if open_clip_weights is not None:
            # open_clip's layout converts to a directory holding the graphs and the files the adapter and the
            # sidecar read (config.json, preprocessor_config.json, the tokenizer with open_clip's text cleaning).
            precision = self._encoder_precision(resolved)
            converted = self._open_clip(model_id, model_dir, open_clip_weights, tokenizer_dir, precision)
            return PreparedFiles(converted / GRAPH_FILE, converted, converted, precision)
        graph, precision = self._graph(model_id, model_dir, artifacts.onnx_file, str(head), resolved,
                                       _attends_both_ways(resolved, model_id))  # fmt: skip
        head_file = None
        if artifacts.head is not None:
            head_file = self._fetch(artifacts.head, on_progress) / str(artifacts.head_file)
            if not head_file.is_file():
                message = f"no {artifacts.head_file} in {head_file.parent} (the profile's separately trained head)"
                raise ModelLoadError("NOT_FOUND", f"Model '{model_id}': {message}")
        return PreparedFiles(graph, tokenizer_dir, model_dir, precision, head_file)

    def load(
        self, model: ModelConfig, profile: str, model_id: str, on_progress: ProgressCallback | None = None
    ) -> LoadedModel:
        """Load `profile` of `model` as the servable id `model_id`."""
        resolved = self._resolve(model, profile, model_id)
        if adapter_class(resolved.adapter_path) is GlinerUnionAdapter:
            return self._load_union(model, resolved, model_id, on_progress)
        files = self.prepare(model, profile, model_id, on_progress)
        config_json = _read_json(files.model_dir / "config.json")
        if resolved.loadtime_options.get("append_eos") or _appends_eos(config_json):
            files = attrs.evolve(files, tokenizer_dir=self._end_token_tokenizer(model_id, files.tokenizer_dir))
        tokenizer = self._tokenizer(model_id, files.tokenizer_dir, model, config_json)
        session = create_session(files.graph, self.session_options)
        extra_graphs = {"labels": labels_graph_path(files.graph), "vision": vision_graph_path(files.graph),
                        "relations": relations_graph_path(files.graph)}  # fmt: skip
        extra_sessions = {
            role: create_session(graph, self.session_options) for role, graph in extra_graphs.items() if graph.is_file()
        }
        context = AdapterContext(
            model,
            resolved,
            session,
            tokenizer,
            config_json,
            run_memory_bytes=self.session_options.run_memory_bytes,
            tokenizer_config_json=_tokenizer_config(files.tokenizer_dir),
            tokenizer_path=files.tokenizer_dir / TOKENIZER_FILE,
            generation_limits=self.generation_limits,
            model_dir=files.model_dir,
            head_file=files.head_file,
            extra_sessions=extra_sessions,
            device_graphs=None if self.session_options.device == "cpu" else DEVICE_GRAPHS,
        )
        try:
            adapter = adapter_class(resolved.adapter_path)(context)
        except ValueError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {exc}") from exc
        memory = graph_bytes(files.graph) + (files.tokenizer_dir / "tokenizer.json").stat().st_size
        memory += sum(graph_bytes(graph) for graph in extra_graphs.values() if graph.is_file())
        return LoadedModel(model_id, profile, adapter, tokenizer, memory, files.tokenizer_dir / "tokenizer.json",
                           files.precision)  # fmt: skip

    def _load_union(
        self, model: ModelConfig, profile: Profile, model_id: str, on_progress: ProgressCallback | None
    ) -> LoadedModel:
        """A GLiNER union: each member loaded as the GLiNER model it is, then served as one."""
        members = []
        for index, config in enumerate(self._union_members(model, profile, model_id)):
            with _union_member(model_id, config.sie_id if index else None):
                members.append(self.load(config, DEFAULT_PROFILE, config.sie_id if index else model_id, on_progress))
        own = members[0]
        context = attrs.evolve(own.adapter.context, model=model, profile=profile,
                               members=tuple(member.adapter for member in members))  # fmt: skip
        try:
            adapter = GlinerUnionAdapter(context)
        except ValueError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {exc}") from exc
        memory = sum(member.memory_bytes for member in members)
        return LoadedModel(model_id, profile.name, adapter, own.tokenizer, memory, own.tokenizer_path, own.precision)

    @staticmethod
    def _union_members(model: ModelConfig, profile: Profile, model_id: str) -> list[ModelConfig]:
        """The union's members as GLiNER models, its own checkpoint first."""
        try:
            return member_configs(model, profile)
        except ValueError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {exc}") from exc

    @staticmethod
    def _resolve(model: ModelConfig, profile: str, model_id: str) -> Profile:
        try:
            return model.resolve_profile(profile)
        except ConfigError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {exc.describe()}") from exc

    def _fetch(self, spec: Any, on_progress: ProgressCallback | None) -> Path:
        try:
            return self.resolver.resolve(spec, on_progress)
        except ArtifactError as exc:
            raise ModelLoadError(str(exc.error_class), str(exc)) from exc

    def _graph(  # noqa: PLR0913 - what the profile asks of the conversion
        self, model_id: str, model_dir: Path, onnx_file: str | None, head: str, profile: Profile, bidirectional: bool
    ) -> tuple[Path, str | None]:
        """The ONNX graph and its precision: the named file or a shipped `model.onnx` (None: as exported), or a cached
        conversion of the safetensors in the precision `profile` and the device ask for (a decoder's attending both
        ways if `bidirectional`)."""
        if onnx_file:
            path = model_dir / onnx_file
            if not path.is_file():
                raise ModelLoadError("NOT_FOUND", f"Model '{model_id}': ONNX file {onnx_file!r} not in {model_dir}")
            return path, None
        for name in GRAPH_NAMES:
            if (model_dir / name).is_file():
                return model_dir / name, None
        if not any((model_dir / name).is_file() for name in (WEIGHTS_FILE, WEIGHTS_INDEX_FILE, TORCH_WEIGHTS_FILE)):
            raise ModelLoadError(
                "NOT_FOUND",
                f"Model '{model_id}': no ONNX graph, no {WEIGHTS_FILE}, no {WEIGHTS_INDEX_FILE} and no "
                f"{TORCH_WEIGHTS_FILE} in {model_dir}",
            )
        return self._convert(model_id, model_dir, head, profile, bidirectional)

    def _convert(
        self, model_id: str, model_dir: Path, head: str, profile: Profile, bidirectional: bool
    ) -> tuple[Path, str]:
        decoder = is_decoder_config(_read_json(model_dir / CONFIG_FILE))
        if decoder and head != "none":
            raise ModelLoadError(
                "UNKNOWN",
                f"Model '{model_id}': a decoder checkpoint converts to its hidden states, not a {head!r} head",
            )
        precision = self._decoder_precision(profile, model_dir) if decoder else self._encoder_precision(profile)
        self._check_fits(model_id, model_dir, precision)
        if decoder:  # an encoder attends both ways already
            head = BIDIRECTIONAL_HIDDEN if bidirectional else HIDDEN
        try:
            if decoder:
                key = decoder_cache_key(model_dir, head, precision)
            else:  # float32 keeps the key it had before encoders had a float16 form
                key = conversion_cache_key(model_dir, head if precision == "float32" else f"{head}/{precision}")
            target = self.converted_dir / f"{key}.onnx"
            if target.is_file():
                return target, precision
            self.converted_dir.mkdir(parents=True, exist_ok=True)
            shown = "decoder hidden states" if decoder else f"{head} head"
            logger.info("converting model %s to ONNX (%s, %s)", model_id, shown, precision,
                        extra=log_fields(event="model_converting", model=model_id, head=head))  # fmt: skip
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(dir=self.converted_dir) as scratch:
                staged = Path(scratch) / target.name
                _write_graph(model_dir, staged, target, head, precision)
                move_graph(staged, target)  # atomic: a reader sees no graph or the whole graph
            _log_converted(model_id, target, time.perf_counter() - started)
            return target, precision
        except ConversionError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': cannot convert to ONNX: {exc}") from exc

    def _check_fits(self, model_id: str, model_dir: Path, precision: str, files: list[Path] | None = None) -> None:
        """Refuse, before converting, a checkpoint whose weights in `precision` alone exceed the memory budget."""
        if self.memory_budget_bytes is None:
            return
        try:
            parameters = checkpoint_parameters(model_dir, files)
        except ConversionError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': cannot read the checkpoint: {exc}") from exc
        needed = parameters * (2 if precision == "float16" else 4)
        if needed > self.memory_budget_bytes:
            raise ModelLoadError(
                "OOM",
                f"Model '{model_id}' has {parameters:,} parameters: {needed:,} bytes in {precision}, more than this "
                f"worker's memory budget of {self.memory_budget_bytes:,} bytes (SIE_WORKER_MEMORY_BUDGET_BYTES)",
            )

    def _decoder_precision(self, profile: Profile, model_dir: Path | None, gguf: Path | None = None) -> str:
        """A converted decoder's precision: float32 on CPU; on a GPU float16 weights, products and cache (norms,
        softmax and logits stay float32), unless the profile's `compute_precision` asks for float32. `bfloat16` or
        unset profiles get the float16 graph, but for a family whose activations overflow float16 (the checkpoint's
        config.json in `model_dir`, or the `gguf` file's architecture, says which), which stays float32 unless the
        profile names float16."""
        requested = profile.compute_precision
        if self.session_options.device == "cpu" or requested == "float32":
            return "float32"
        if gguf is not None:
            model_type = _gguf_model_type(gguf)
        else:
            model_type = _read_json(model_dir / CONFIG_FILE).get("model_type") if model_dir is not None else None
        unsafe = model_type in FLOAT16_UNSAFE_MODEL_TYPES
        return "float32" if unsafe and requested != "float16" else "float16"

    def _encoder_precision(self, profile: Profile) -> str:
        """A converted encoder's precision: float32 on CPU, and on a GPU unless the profile's `compute_precision`
        is float16 or bfloat16; then float16 matrix products and weights, the rest float32
        (`convert/half_precision.py`). Unset stays float32: the reference's own numbers."""
        if self.session_options.device == "cpu" or profile.compute_precision not in ("float16", "bfloat16"):
            return "float32"
        return "float16"

    def _decoder_checkpoint(self, model_id: str, model_dir: Path, precision: str) -> Path:
        """The cached conversion of a decoder family's checkpoint into a generation graph and its config.json."""
        self._check_fits(model_id, model_dir, precision)

        def convert(staged: Path) -> None:
            from sie.worker.convert.decoders import convert_decoder_checkpoint

            convert_decoder_checkpoint(model_dir, staged, precision)

        return self._converted_directory(model_id, lambda: decoder_cache_key(model_dir, "generate", precision),
                                         "decoder", f"an ONNX decoder ({precision})", convert)  # fmt: skip

    def _open_clip(  # noqa: PLR0913 - the checkpoint's parts and the precision
        self, model_id: str, model_dir: Path, weights: Path, tokenizer_dir: Path, precision: str
    ) -> Path:
        """The cached conversion of an open_clip checkpoint (`convert/open_clip.py`), its `weights` file, in
        `precision` (float16: its graphs' products in half)."""
        self._check_fits(model_id, model_dir, precision, [weights])

        def convert(staged: Path) -> None:
            from sie.worker.convert.half_precision import products_in_half_file
            from sie.worker.convert.open_clip import convert_open_clip

            convert_open_clip(model_dir, tokenizer_dir, staged)
            if precision == "float16":
                for graph in (staged / GRAPH_FILE, vision_graph_path(staged / GRAPH_FILE)):
                    products_in_half_file(graph)

        return self._converted_directory(model_id, lambda: open_clip_cache_key(model_dir, tokenizer_dir, precision),
                                         "open_clip", f"ONNX image and text towers (open_clip, {precision})",
                                         convert)  # fmt: skip

    def _decoder(
        self, model_id: str, model_dir: Path, gguf_file: str, precision: str, on_progress: ProgressCallback | None
    ) -> Path:
        """The cached conversion of a GGUF decoder in `precision`."""
        source = model_dir / gguf_file
        if not source.is_file():
            raise ModelLoadError("NOT_FOUND", f"Model '{model_id}': GGUF file {gguf_file!r} not in {model_dir}")

        def convert(staged: Path) -> None:
            from sie.worker.convert.decoders import convert_gguf

            convert_gguf(source, staged, precision, _convert_progress(on_progress, f"gguf {gguf_file}"))

        return self._converted_directory(model_id, lambda: gguf_cache_key(source, precision), "decoder",
                                         f"an ONNX decoder ({precision})", convert)  # fmt: skip

    def _converted_directory(  # noqa: PLR0913 - what is converted, where, and how it is named in the log
        self, model_id: str, cache_key: Callable[[], str], kind: str, shown: str, convert: Callable[[Path], None]
    ) -> Path:
        """The converted `kind` directory under `cache_key()` (a decoder, an open_clip model), made by
        `convert(staged directory)` on a cache miss (which imports the converter and `onnx`, about 1.4 s: only a miss
        pays for it)."""
        try:
            target = self.converted_dir / f"{cache_key()}-{kind}"
            if (target / GRAPH_FILE).is_file():
                return target
            self.converted_dir.mkdir(parents=True, exist_ok=True)
            logger.info("converting model %s to %s", model_id, shown,
                        extra=log_fields(event="model_converting", model=model_id, head=kind))  # fmt: skip
            started = time.perf_counter()
            with tempfile.TemporaryDirectory(dir=self.converted_dir) as scratch:
                staged = Path(scratch) / target.name
                convert(staged)
                _publish_dir(staged, target)
            _log_converted(model_id, target / GRAPH_FILE, time.perf_counter() - started)
            return target
        except ConversionError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': cannot convert to ONNX: {exc}") from exc

    def _end_token_tokenizer(self, model_id: str, directory: Path) -> Path:
        """A copy of the tokenizer directory whose tokenizer ends every text with the model's end-of-sequence token
        (`append_eos`: a decoder embedder that pools its last token and whose tokenizer does not add it, as
        e5-mistral's); the sidecar and the worker both read it, so both tokenize alike. Cached by content."""
        config = _tokenizer_config(directory)
        end = config.get("eos_token")
        end = end.get("content") if isinstance(end, dict) else end
        if not isinstance(end, str) or not end:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': append_eos needs an eos_token in "
                                            f"{TOKENIZER_CONFIG_FILE}")  # fmt: skip
        source = (directory / TOKENIZER_FILE).read_text(encoding="utf-8")
        try:
            rewritten = with_end_token(source, end)
        except TokenizerError as exc:
            raise ModelLoadError("UNKNOWN", f"Model '{model_id}': append_eos: {exc}") from exc
        key = hashlib.sha256(rewritten.encode()).hexdigest()
        target = self.converted_dir / f"{key}-tokenizer"
        if not (target / TOKENIZER_FILE).is_file():
            self.converted_dir.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=self.converted_dir) as scratch:
                staged = Path(scratch) / target.name
                staged.mkdir()
                (staged / TOKENIZER_FILE).write_text(rewritten, encoding="utf-8")
                (staged / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")
                try:
                    os.replace(staged, target)
                except OSError:
                    if not (target / TOKENIZER_FILE).is_file():  # another loader's rename is as good
                        raise
        return target

    def _tokenizer(self, model_id: str, directory: Path, model: ModelConfig, config_json: dict) -> TextTokenizer:
        max_length = model.max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH
        capacity = position_capacity(config_json)
        if capacity is not None and capacity < max_length:
            # More tokens than the model has positions would fail the whole batch in onnxruntime: truncate there.
            logger.info("model %s holds %d tokens per sequence; max_sequence_length %d is cut to it",
                        model_id, capacity, max_length)  # fmt: skip
            max_length = capacity
        try:
            tokenizer = TextTokenizer.from_file(directory / "tokenizer.json", max_length=max_length)
        except TokenizerError as exc:
            raise ModelLoadError("NOT_FOUND", f"Model '{model_id}': {exc}") from exc
        vocab_size = config_json.get("vocab_size")
        if isinstance(vocab_size, int) and tokenizer.vocab_size > vocab_size:
            raise ModelLoadError(
                "UNKNOWN",
                f"Model '{model_id}': tokenizer mismatch: the tokenizer has {tokenizer.vocab_size} tokens "
                f"but the model's vocabulary has {vocab_size}",
            )
        return tokenizer


def _appends_eos(config_json: Mapping[str, Any]) -> bool:
    """Whether the checkpoint's own config ends every text with its end-of-sequence token: NV-Embed's `add_eos`
    (its remote code writes the token after each text)."""
    return config_json.get("model_type") == NVEMBED_MODEL_TYPE and bool(config_json.get("add_eos", True))


def _attends_both_ways(profile: Profile, model_id: str) -> bool:
    """Whether the profile runs its model with `forward_kwargs: {is_causal: false}` (GritLM's embedding recipe), or
    names a public module whose recipe does (TopK-Embed's)."""
    if profile.adapter_module in BIDIRECTIONAL_MODULES:
        return True
    forward = profile.loadtime_options.get("forward_kwargs") or {}
    field = f"profiles.{profile.name}.adapter_options.loadtime.forward_kwargs"
    if not isinstance(forward, Mapping):
        raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {field} must be a mapping, got {forward!r}")
    unknown = sorted(set(forward) - set(FORWARD_KWARGS))
    if unknown:
        raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {field} {unknown} are not supported; "
                                        f"expected only {list(FORWARD_KWARGS)}")  # fmt: skip
    causal = forward.get("is_causal", True)
    if not isinstance(causal, bool):
        raise ModelLoadError("UNKNOWN", f"Model '{model_id}': {field}.is_causal must be true or false, got {causal!r}")
    return not causal


@contextlib.contextmanager
def _union_member(model_id: str, member: str | None) -> Iterator[None]:
    """A member's load failure as the union's, naming the member (None: the union's own checkpoint, whose failures
    name the union already)."""
    try:
        yield
    except ModelLoadError as exc:
        if member is None:
            raise
        raise ModelLoadError(exc.error_class, f"Model '{model_id}': member {member}: {exc.message}") from exc


def _write_graph(model_dir: Path, staged: Path, target: Path, head: str, precision: str) -> None:
    """Convert the checkpoint in `model_dir` with `head` (`HIDDEN`, `BIDIRECTIONAL_HIDDEN`: a decoder's hidden states)
    to `staged` in `precision` (an encoder's float16: its float32 graphs with their products in half); a graph
    converted beside the main one (a bi-encoder's label graph, a vision tower) is moved beside `target` first, so the
    main graph's rename publishes a complete set."""
    # The converter imports `onnx` (about 1.4 s): only a cache miss pays for it.
    from sie.worker.convert.clip import convert_clip
    from sie.worker.convert.decoders import convert_decoder_hidden
    from sie.worker.convert.encoders import convert_encoder
    from sie.worker.convert.gliclass import convert_gliclass
    from sie.worker.convert.gliner import convert_gliner
    from sie.worker.convert.gliner2 import convert_gliner2
    from sie.worker.convert.glirel import convert_glirel
    from sie.worker.convert.half_precision import products_in_half_file

    if head in (HIDDEN, BIDIRECTIONAL_HIDDEN):
        convert_decoder_hidden(model_dir, staged, precision, bidirectional=head == BIDIRECTIONAL_HIDDEN)
        return
    if head == GLINER_HEAD:
        convert_gliner(model_dir, staged)
    elif head == GLINER2_HEAD:
        convert_gliner2(model_dir, staged)
    elif head == GLICLASS_HEAD:
        convert_gliclass(model_dir, staged)
    elif head == GLIREL_HEAD:
        convert_glirel(model_dir, staged)
    elif head == CLIP_HEAD:
        convert_clip(model_dir, staged)
    else:
        convert_encoder(model_dir, staged, head)
    # a bi-encoder's label graph, a relation graph, an image–text model's vision graph
    besides = [beside for beside in (labels_graph_path, relations_graph_path, vision_graph_path) if
               beside(staged).is_file()]  # fmt: skip
    if precision == "float16":
        for graph in (staged, *(beside(staged) for beside in besides)):
            products_in_half_file(graph)
    for beside in besides:
        move_graph(beside(staged), beside(target))


def _convert_progress(on_progress: ProgressCallback | None, source: str) -> Callable[[int, int], None] | None:
    """The converter's `(done, total)` byte counts as `convert` events naming `source`."""
    if on_progress is None:
        return None
    return lambda done, total: on_progress(ProgressEvent(STAGE_CONVERT, source, done, total))


def move_graph(staged: Path, target: Path) -> None:
    """Rename a graph file into place with its side file of tensors, if it has one; the side file goes first, so a
    reader that finds the graph finds its tensors (the graph names them relative to its own directory)."""
    if side_file(staged).is_file():
        os.replace(side_file(staged), side_file(target))
    os.replace(staged, target)


def _publish_dir(staged: Path, target: Path) -> None:
    """Rename a finished conversion into place; a reader sees no directory or the whole one. Two loaders that
    converted at once both succeed: the second rename fails on the first one's directory, which is as good."""
    try:
        os.replace(staged, target)
    except OSError as exc:
        if not (target / GRAPH_FILE).is_file():
            raise ConversionError(f"cannot store the converted decoder: {exc}", source=str(target)) from exc


def _log_converted(model_id: str, graph: Path, seconds: float) -> None:
    size = graph.stat().st_size
    fields = log_fields(event="model_converted", model=model_id, seconds=round(seconds, 3), bytes=size)
    logger.info("converted model %s to ONNX in %.2fs (%d bytes)", model_id, seconds, size, extra=fields)


def graph_bytes(graph: Path) -> int:
    """A converted graph's size on disk, its side file of tensors (`model.onnx.data`, for large graphs) included."""
    data = side_file(graph)
    return graph.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def _tokenizer_config(directory: Path) -> dict:
    """tokenizer_config.json, with the chat template from chat_template.jinja where transformers 5 saved it, or from
    a processor's chat_template.json (the vision-language checkpoints')."""
    config = _read_json(directory / TOKENIZER_CONFIG_FILE)
    template = directory / CHAT_TEMPLATE_FILE
    if not config.get("chat_template") and template.is_file():
        config["chat_template"] = template.read_text(encoding="utf-8")
    processor_template = _read_json(directory / PROCESSOR_CHAT_TEMPLATE_FILE).get("chat_template")
    if not config.get("chat_template") and isinstance(processor_template, str):
        config["chat_template"] = processor_template
    return config


def _gguf_model_type(path: Path) -> str | None:
    """The model_type of a GGUF file's architecture; None for a file that cannot be read, whose conversion (next)
    fails naming why."""
    try:
        return gguf_model_type(path)
    except ConversionError:
        return None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _pooling_graph(states_type: str) -> bytes:
    """`convert.device_graphs.pooling_graph`, imported when a GPU model first pools: the converter's onnx loads only
    for work that needs it (a worker starts without it)."""
    from sie.worker.convert.device_graphs import pooling_graph

    return pooling_graph(states_type)


def _token_head_graph(states_type: str, stages: Sequence[DenseStage]) -> bytes:
    """`convert.device_graphs.token_head_graph`, imported as `_pooling_graph` is."""
    from sie.worker.convert.device_graphs import token_head_graph

    return token_head_graph(states_type, stages)


# What a GPU loader hands its adapters (AdapterContext.device_graphs).
DEVICE_GRAPHS: Final = DeviceGraphs(_pooling_graph, _token_head_graph)
