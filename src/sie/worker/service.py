"""The worker as an IPC service: each WorkerClient method (contracts Part A §2.1, plus our ModelControlStatus)
answered from the model manager and the batch runner. The Unix-socket server and `--role all` both call this
object.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs

from sie.catalog import Catalog, load_yaml, parse_model_config
from sie.catalog.adapters import CAUSAL_LM
from sie.catalog.errors import CatalogError
from sie.settings import BatchingSettings, LaneSettings
from sie.telemetry.logs import log_fields
from sie.telemetry.tracing import SERVER_SPAN, WORKER_STREAMING_PROCESSOR, Tracing
from sie.wire import DecodeError, codes, from_msgpack
from sie.wire.generate import EVENT_ACK, EVENT_DONE, FINISH_CANCELLED, GenerateEvent, ProcessGenerateRequest
from sie.wire.ipc_batch import BatchOutcome, RunBatchRequest
from sie.wire.ipc_control import (
    MODEL_STATE_FAILED,
    MODEL_STATE_LOADING_IN_PROGRESS,
    MODEL_STATE_READY,
    MODEL_STATE_RETRY_LATER,
    ApplyModelConfigRequest,
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyRequest,
    EnsureModelReadyResponse,
    ModelControlEntry,
    ModelControlStatusRequest,
    ModelControlStatusResponse,
    ModelDescriptor,
    ModelResidency,
    PingRequest,
    PingResponse,
    ReplaceModelConfigsRequest,
    ReplaceModelConfigsResponse,
    SignalGenerateCancelRequest,
    SignalGenerateCancelResponse,
    UnloadModelRequest,
    UnloadModelResponse,
    WorkerCapabilitiesRequest,
    WorkerCapabilitiesResponse,
    WorkerMetricsRequest,
    WorkerMetricsResponse,
)
from sie.wire.queue import OPERATION_GENERATE, WorkItem
from sie.worker.adapters import CausalLMAdapter, GenerationInputError
from sie.worker.generation.batching_decoder import DecodeEvent, SequenceStream
from sie.worker.generation.call import GenerationCall, nak_events, stream_generation
from sie.worker.loading import LoadedModel
from sie.worker.manager import ModelManager, ModelState
from sie.worker.runner import (
    HASH_GATE_NAK_DELAY_MS,
    NOT_LOADED_NAK_DELAY_MS,
    BatchRunner,
    ExecutedBatch,
    hash_gate,
    to_batch_outcome,
)

logger = logging.getLogger(__name__)

DRAINING = "draining"
# ModelControlStatus reports these manager states, as the EnsureModelReady state each one answers.
_CONTROL_STATES = {
    ModelState.LOADED: MODEL_STATE_READY,
    ModelState.LOADING: MODEL_STATE_LOADING_IN_PROGRESS,
    ModelState.FAILED: MODEL_STATE_FAILED,
}


class ExecutionBarrier:
    """A first-come readers-writer barrier on the running event loop: inference batches share it, config
    apply/replace holds it alone. A waiting writer holds back later readers, so config changes are not starved;
    a writer waits for running batches to finish and batches queued behind it run on the new config."""

    def __init__(self) -> None:
        self.readers = 0
        self.writer = False
        self._waiters: collections.deque[tuple[bool, asyncio.Future[None]]] = collections.deque()

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Held while a batch runs (any number at once)."""
        await self._acquire(exclusive=False)
        try:
            yield
        finally:
            self._release(exclusive=False)

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Held while the catalogue changes (alone)."""
        await self._acquire(exclusive=True)
        try:
            yield
        finally:
            self._release(exclusive=True)

    def _free_for(self, exclusive: bool) -> bool:
        return not self.writer and (not exclusive or self.readers == 0)

    def _enter(self, exclusive: bool) -> None:
        if exclusive:
            self.writer = True
        else:
            self.readers += 1

    async def _acquire(self, exclusive: bool) -> None:
        if not self._waiters and self._free_for(exclusive):
            self._enter(exclusive)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((exclusive, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release(exclusive)  # granted just before the cancellation arrived: give it back
            else:
                self._wake()
            raise

    def _release(self, exclusive: bool) -> None:
        if exclusive:
            self.writer = False
        else:
            self.readers -= 1
        self._wake()

    def _wake(self) -> None:
        """Grant waiters in arrival order while they fit (cancelled ones are skipped)."""
        while self._waiters:
            exclusive, granted = self._waiters[0]
            if granted.done():
                self._waiters.popleft()
                continue
            if not self._free_for(exclusive):
                return
            self._waiters.popleft()
            self._enter(exclusive)
            granted.set_result(None)


class WorkerService:
    """One worker's answers to the sidecar. Satisfies `sie.ipc.client.WorkerClient` structurally. With `tracing` on,
    each generation attempt is a `worker.streaming_processor` span in its work item's trace."""

    def __init__(  # noqa: PLR0913 - the worker's collaborators and identity
        self,
        manager: ModelManager,
        runner: BatchRunner,
        worker_id: str,
        lane: LaneSettings,
        batching: BatchingSettings,
        device: str = "cpu",
        tracing: Tracing | None = None,
    ) -> None:
        self.manager = manager
        self.runner = runner
        self.worker_id = worker_id
        self.device = device
        self.bundle = lane.bundle
        self.pool = lane.pool
        self.batching = batching
        self.draining = False
        self.last_ping = 0.0
        self.barrier = ExecutionBarrier()
        self.tracing = tracing or Tracing.off()
        self._hash_of: tuple[Catalog, str] | None = None
        # Running generations by request id, for SignalGenerateCancel: the adapters decoding them.
        self._generating: dict[str, list[CausalLMAdapter]] = {}
        # Generations whose prompt is being prepared (not yet in an engine), and those of them cancelled meanwhile.
        self._preparing: collections.Counter[str] = collections.Counter()
        self._cancelled_preparing: set[str] = set()

    @property
    def catalog(self) -> Catalog:
        return self.manager.catalog

    def bundle_config_hash(self) -> str:
        """The hash of the models this worker serves: its bundle, scoped to its pool (seed 000 §7)."""
        catalog = self.catalog
        if self._hash_of is not None and self._hash_of[0] is catalog:
            return self._hash_of[1]
        digest = catalog.bundle_config_hash(self.bundle, self.pool) if self.bundle in catalog.bundles else ""
        self._hash_of = (catalog, digest)  # catalogues are immutable: one digest per snapshot
        return digest

    async def ping(self, request: PingRequest) -> PingResponse:
        self.last_ping = time.monotonic()
        return PingResponse(
            timestamp_ms=request.timestamp_ms,
            worker_id=self.worker_id,
            ready=not self.draining,
            bundle_config_hash=self.bundle_config_hash(),
            loaded_models=self.manager.loaded_models,
            loading_models=self.manager.loading_models,
            device_count=1 if self.device.startswith("cuda") else 0,
            residency=[
                ModelResidency(
                    model_id=loaded.model_id, worker=self.worker_id, device=self.device, precision=loaded.precision
                )
                for loaded in self.manager.resident
            ],  # fmt: skip
        )

    async def ensure_model_ready(self, request: EnsureModelReadyRequest) -> EnsureModelReadyResponse:
        if request.pin is not None:  # a pool pins the model here, or no longer does
            self.manager.hold(request.model_id, request.pin)
            if not request.pin:
                loaded = self.manager.is_loaded(request.model_id)
                return EnsureModelReadyResponse(state=MODEL_STATE_READY if loaded else MODEL_STATE_RETRY_LATER)
        state = self.manager.ensure_ready(request.model_id)
        if state == MODEL_STATE_READY:
            loaded = self.manager.get(request.model_id)
            return EnsureModelReadyResponse(
                state=MODEL_STATE_READY, batch_budget=self.batching.max_batch_items, descriptor=describe(loaded)
            )
        failure = self.manager.failure(request.model_id)
        if failure is None:
            return EnsureModelReadyResponse(state=state)
        retry_after = None if state == MODEL_STATE_FAILED else failure.cooldown_left(self.manager.clock())
        return EnsureModelReadyResponse(
            state=state,
            error=failure.message,
            error_class=failure.error_class,
            attempts=failure.attempts,
            retry_after_s=retry_after,
        )

    async def run_batch(self, request: RunBatchRequest) -> BatchOutcome:
        if self.draining:
            return to_batch_outcome(request, ExecutedBatch(nak_reason=DRAINING))  # another worker takes it
        async with self.barrier.shared():  # the config cannot change between the gate and the execution
            refused = hash_gate(request, self.bundle_config_hash())
            return to_batch_outcome(request, refused or await self.runner.execute(request))

    async def worker_capabilities(self, request: WorkerCapabilitiesRequest) -> WorkerCapabilitiesResponse:
        entries = self.catalog.entries
        generation_models = sorted(model_id for model_id, entry in entries.items() if entry.model.tasks.generate)
        return WorkerCapabilitiesResponse(
            supports_execution_authority_v1=False,
            supports_numerical_admission_v1=False,
            has_generation_models=bool(generation_models),
            generation_models=generation_models,
            supported_models=sorted(self.catalog.entries),
            loaded_models=self.manager.loaded_models,
        )

    async def process_generate(self, request: ProcessGenerateRequest) -> AsyncIterator[GenerateEvent]:
        """One generation work item as GenerateEvents (sie.wire.generate), the last one `done`. Closing the
        iterator early cancels the generation."""
        started = time.perf_counter()
        try:
            item = from_msgpack(request.work_item_msgpack, WorkItem)
        except DecodeError as exc:  # it will never decode: settle it rather than see it redelivered
            yield GenerateEvent(kind=EVENT_ACK)
            yield GenerateEvent(kind=EVENT_DONE, error=f"undecodable generation work item: {exc}")
            return
        call = GenerationCall(item, self.worker_id, started)
        model_id = request.model_id or item.model_id
        with self.tracing.span(WORKER_STREAMING_PROCESSOR, item, kind=SERVER_SPAN) as span:
            if span.is_recording():
                span.set_attributes({"sie.request_id": item.request_id, "sie.attempt_id": call.attempt_id,
                                     "sie.model": model_id, "sie.adapter": CAUSAL_LM})  # fmt: skip
            async with contextlib.aclosing(self._generate(call, model_id)) as events:
                async for event in events:
                    yield event
            span.set_attribute("sie.chunks", call.chunks)

    async def _generate(self, call: GenerationCall, model_id: str) -> AsyncIterator[GenerateEvent]:
        refused, begun = await self._begin_generation(call, model_id)
        for event in refused:
            yield event
        if begun is None:
            return
        item = call.item
        adapter, prepared, stream = begun
        self._generating.setdefault(item.request_id, []).append(adapter)
        try:
            generation = stream_generation(adapter.engine, len(prepared.prompt_ids), stream, call)
            async with contextlib.aclosing(generation) as events:
                async for event in events:
                    yield event
        finally:
            running = self._generating.get(item.request_id, [])
            running.remove(adapter)
            if not running:
                self._generating.pop(item.request_id, None)

    async def signal_generate_cancel(self, request: SignalGenerateCancelRequest) -> SignalGenerateCancelResponse:
        """Cancel the generation of `request_id`, running or still preparing its prompt (it ends with finish_reason
        `cancelled`)."""
        adapters = set(self._generating.get(request.request_id, ()))
        matched = [adapter.engine.cancel(request.request_id) for adapter in adapters]
        if request.request_id in self._preparing:
            self._cancelled_preparing.add(request.request_id)
            matched.append(True)
        return SignalGenerateCancelResponse(matched=any(matched))

    async def _begin_generation(
        self, call: GenerationCall, model_id: str
    ) -> tuple[list[GenerateEvent], tuple[CausalLMAdapter, Any, SequenceStream] | None]:
        """Gate, prepare and start a generation: the events that end it here, or its adapter, prompt and stream."""
        if self.draining:
            return nak_events(0, DRAINING), None  # another worker takes it
        async with self.barrier.shared():  # the config cannot change between the gate and the start
            refused = self._generation_gate(call, model_id)
            if isinstance(refused, list):
                return refused, None
            request_id = call.item.request_id
            self._preparing[request_id] += 1
            try:
                loop = asyncio.get_running_loop()
                prepared = await loop.run_in_executor(None, refused.prepare, call.item.generate)
            except GenerationInputError as exc:
                return call.failed(exc.message, exc.code), None
            finally:
                cancelled = self._left_preparation(request_id)
            if cancelled:  # a cancel came while the prompt was prepared: it never starts
                return call.finished(DecodeEvent(finish_reason=FINISH_CANCELLED), len(prepared.prompt_ids)), None
            return [], (refused, prepared, refused.start(prepared, request_id, call.attempt_id))

    def _left_preparation(self, request_id: str) -> bool:
        """Count one preparation of `request_id` as over; True when the request was cancelled meanwhile."""
        self._preparing[request_id] -= 1
        cancelled = request_id in self._cancelled_preparing
        if self._preparing[request_id] <= 0:
            del self._preparing[request_id]
            self._cancelled_preparing.discard(request_id)
        return cancelled

    def _generation_gate(self, call: GenerationCall, model_id: str) -> list[GenerateEvent] | CausalLMAdapter:
        """The events refusing the item (hash gate, model not ready or not generative), or the model's adapter."""
        item = call.item
        current = self.bundle_config_hash()
        if item.bundle_config_hash and item.bundle_config_hash != current:
            reason = f"bundle_config_hash {item.bundle_config_hash!r} is not this worker's current {current!r}"
            return nak_events(HASH_GATE_NAK_DELAY_MS, reason)
        if self.catalog.find(model_id) is None:
            return call.failed(f"Model '{model_id}' is not served by this worker", codes.MODEL_NOT_FOUND)
        state = self.manager.ensure_ready(model_id)
        failure = self.manager.failure(model_id)
        if state == MODEL_STATE_FAILED and failure is not None:
            return call.failed(failure.message, codes.MODEL_LOAD_FAILED)
        loaded = self.manager.get(model_id) if state == MODEL_STATE_READY else None
        if loaded is None:
            return nak_events(NOT_LOADED_NAK_DELAY_MS, f"model {model_id} is not loaded yet ({state})")
        if not isinstance(loaded.adapter, CausalLMAdapter):
            return call.failed(f"Model '{model_id}' does not support generation", codes.INVALID_INPUT)
        if item.operation != OPERATION_GENERATE or item.generate is None:
            return call.failed("a generation work item needs operation 'generate' and its params", codes.INVALID_INPUT)
        return loaded.adapter

    async def apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        """Add or replace one model config in this worker's catalogue and report the resulting hash."""
        async with self.barrier.exclusive():
            return self._apply_model_config(request)

    def _apply_model_config(self, request: ApplyModelConfigRequest) -> ApplyModelConfigResponse:
        try:
            model = parse_model_config(load_yaml(request.model_config, request.model_id), request.model_id)
        except CatalogError as exc:
            logger.warning("config of model %s (epoch %d) not applied: %s", request.model_id, request.epoch, exc)
            return ApplyModelConfigResponse(applied=False, bundle_config_hash=self.bundle_config_hash(),
                                            unsupported_models=[request.model_id])  # fmt: skip
        ours = model.effective_pool == self.pool  # a model assigned to another pool is not this worker's to serve
        if ours:
            self.manager.set_catalog(self.catalog.with_models([model]))
        bundle_hash = self.bundle_config_hash()
        logger.info("config of model %s applied at epoch %d%s; bundle hash %s", model.sie_id, request.epoch,
                    "" if ours else f" (pool {model.effective_pool}: not served here)", bundle_hash,
                    extra=log_fields(event="config_applied", model=model.sie_id, epoch=request.epoch, source="delta",
                                     bundle_config_hash=bundle_hash))  # fmt: skip
        return ApplyModelConfigResponse(applied=True, bundle_config_hash=bundle_hash)

    async def replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        """Replace every model of the catalogue with the exported set; unparsable entries are reported."""
        async with self.barrier.exclusive():
            return self._replace_model_configs(request)

    def _replace_model_configs(self, request: ReplaceModelConfigsRequest) -> ReplaceModelConfigsResponse:
        models, unsupported = [], []
        for entry in request.models:
            try:
                models.append(parse_model_config(load_yaml(entry.model_config, entry.model_id), entry.model_id))
            except CatalogError:
                unsupported.append(entry.model_id)
        models = [model for model in models if model.effective_pool == self.pool]  # other pools are not ours
        served = {model.sie_id for model in models}
        problems = [problem for problem in self.catalog.problems if problem.model_id not in served]  # still unservable
        self.manager.set_catalog(Catalog(self.catalog.bundles.values(), models, problems))
        logger.info("config export of epoch %d applied: %d models served here, %d unsupported", request.epoch,
                    len(models), len(unsupported), extra=log_fields(event="config_applied", epoch=request.epoch,
                                                                    source="export", models=len(models)))  # fmt: skip
        return ReplaceModelConfigsResponse(
            applied=not unsupported,
            bundle_config_hash=self.bundle_config_hash(),
            config_version=request.epoch,
            applied_models=[model.sie_id for model in models],
            applied_profiles=sorted(f"{model.sie_id}:{name}" for model in models for name in model.profiles),
            unsupported_models=unsupported,
        )

    async def drain(self, request: DrainRequest) -> DrainResponse:
        self.draining = True
        return DrainResponse(acknowledged=True)

    async def model_control_status(self, request: ModelControlStatusRequest) -> ModelControlStatusResponse:
        """This worker's device, memory and measured compute, and each model it has loaded, is loading or
        failed to load, for the sidecar's placement."""
        return ModelControlStatusResponse(
            worker_id=self.worker_id,
            device=self.device,
            ready=not self.draining,
            memory_budget_bytes=self.manager.memory_budget_bytes,
            memory_used_bytes=self.manager.memory_bytes,
            compute_seconds_total=self.runner.compute_seconds_total,
            models=self._control_entries(),
        )

    async def worker_metrics(self, request: WorkerMetricsRequest) -> WorkerMetricsResponse:
        """This worker's series (model loads, models and memory) in Prometheus text, for the sidecar's `/metrics`."""
        metrics = self.manager.metrics
        return WorkerMetricsResponse(text=metrics.text() if metrics is not None else "")

    async def unload_model(self, request: UnloadModelRequest) -> UnloadModelResponse:
        """Unload a model placement moved to other children, once the batches running here have finished; a model
        generating here stays until its generations end (a later compaction takes it)."""
        async with self.barrier.exclusive():
            loaded = self.manager.get(request.model_id)
            if loaded is not None and any(loaded.adapter in adapters for adapters in self._generating.values()):
                return UnloadModelResponse(unloaded=False, reason="generating")
            freed = self.manager.model_memory_bytes(loaded.model_id) if loaded is not None else 0
            unloaded, reason = self.manager.release(request.model_id, "unloaded: placement moved it to other children")
            return UnloadModelResponse(unloaded=unloaded, memory_freed_bytes=freed if unloaded else 0, reason=reason)

    def _control_entries(self) -> list[ModelControlEntry]:
        entries: dict[str, ModelControlEntry] = {}
        for model_id in self.catalog.entries:
            status = self.manager.status(model_id)
            if status.state not in _CONTROL_STATES or status.model_id in entries:
                continue
            usage = self.runner.usage.get(status.model_id)
            counters = attrs.asdict(usage) if usage is not None else {}
            entries[status.model_id] = ModelControlEntry(
                model_id=status.model_id,
                state=_CONTROL_STATES[status.state],
                memory_bytes=status.memory_bytes,
                max_batch_items=self.batching.max_batch_items,
                **counters,
            )
        return list(entries.values())


def describe(loaded: LoadedModel | None) -> ModelDescriptor | None:
    """The ModelDescriptor of a loaded model profile."""
    if loaded is None:
        return None
    adapter, tokenizer = loaded.adapter, loaded.tokenizer
    options = adapter.runtime_options
    return ModelDescriptor(
        tokenizer_path=str(loaded.tokenizer_path) if loaded.tokenizer_path else None,
        tokenizer_id=tokenizer.tokenizer_id,
        max_seq_len=tokenizer.max_length,
        output_types=list(adapter.model.outputs),
        supports_run_batch=True,
        default_query_template=options.get("query_template"),
        default_doc_template=options.get("doc_template"),
        max_concurrent_dispatch=1,
        max_batch_tokens=adapter.profile.max_batch_tokens,
        image_processor=dict(adapter.image_processor_config) if adapter.image_processor_config else None,
        image_cost=adapter.image_cost or None,
    )
