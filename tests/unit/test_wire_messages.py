"""Every message class survives msgpack, and JSON where it carries no bytes (all sie.wire message modules)."""

import inspect

import attrs
import numpy as np
import pytest

from sie.wire import config, http, ipc, ipc_batch, ipc_control, queue
from sie.wire.converter import from_json, from_msgpack, to_json, to_msgpack
from sie.wire.payload import ResultBody

F32 = np.array([0.5, -1.0, 2.0], dtype=np.float32)

ENCODE_ITEM = ipc_batch.EncodeBatchItem(
    work_item_id="r.0",
    request_id="r",
    item_index=0,
    total_items=1,
    timestamp=1760000000.5,
    item={"text": "hello"},
    output_types=["dense"],
    is_query=True,
    options={"profile": "default"},
    profile_id="default",
    bundle_config_hash="ab" * 32,
    prepared_tokens=ipc_batch.PreparedTokens(input_ids=[[101, 7592, 102]], tokenizer_id="t" * 32),
)
SCORE_ITEM = ipc_batch.ScoreBatchItem(
    work_item_id="r.0",
    request_id="r",
    item_index=0,
    total_items=1,
    timestamp=1.0,
    query_item={"text": "q"},
    score_items=[{"text": "a"}, {"id": "w", "text": "b"}],
)
EXTRACT_ITEM = ipc_batch.ExtractBatchItem(
    work_item_id="r.0",
    request_id="r",
    item_index=0,
    total_items=1,
    timestamp=1.0,
    item={"text": "Tim Cook"},
    labels=["person"],
)
OUTCOME = ipc_batch.ItemOutcome(
    work_item_id="r.0",
    request_id="r",
    item_index=0,
    disposition=ipc_batch.DISPOSITION_PUBLISH_AND_ACK,
    inference_ms=4.5,
    raw_output=ipc_batch.RawOutput(dense=ipc_batch.DenseRaw(values=F32, dim=3)),
    units=queue.UnitCounts(input_tokens=3),
)

SAMPLES = [
    http.ImageInput(data=b"\xff\xd8", format="jpeg"),
    http.AudioInput(data=b"RIFF", format="wav", sample_rate=16000),
    http.DocumentInput(data=b"%PDF", format="pdf"),
    http.Item(id="d1", text="Hello", metadata={"k": [1, 2]}, video={"url": "v"}),
    http.Item(text="q", multivector=np.stack([F32, F32])),
    http.EncodeParams(output_types=["dense", "sparse"], output_dtype="float16", options={"is_query": True}),
    http.EncodeRequest(items=[http.Item(text="a")], params=http.EncodeParams(instruction="q:")),
    http.ScoreRequest(query=http.Item(id="q", text="?"), items=[http.Item(text="a")], options={"profile": "x"}),
    http.ExtractParams(labels=["person"], output_schema={"type": "object"}),
    http.ExtractRequest(items=[http.Item(text="a")], params=http.ExtractParams(labels=["org"])),
    http.DenseEmbedding(dims=3, dtype="float32", values=F32),
    http.SparseEmbedding(dims=250002, dtype="float32", indices=np.array([3, 9], dtype=np.int32), values=F32[:2]),
    http.MultivectorEmbedding(token_dims=3, num_tokens=2, dtype="float32", values=np.stack([F32, F32])),
    http.EncodeResult(id="d1", dense=http.DenseEmbedding(dims=3, dtype="float32", values=F32)),
    http.TimingInfo(total_ms=21.25, queue_ms=1.0, tokenization_ms=0.5, inference_ms=18.5),
    http.EncodeResponse(
        model="m",
        items=[http.EncodeResult()],
        timing=http.TimingInfo(total_ms=1.0, queue_ms=0.0, tokenization_ms=0.0, inference_ms=1.0),
    ),
    http.ScoreEntry(item_id="item-0", score=0.75, rank=0),
    http.ScoreResponse(model="m", query_id=None, scores=[http.ScoreEntry(item_id="w", score=0.5, rank=0)]),
    http.Entity(text="Tim Cook", label="person", score=0.96875, start=0, end=8),
    http.Relation(head="Tim Cook", tail="Apple", relation="ceo_of", score=0.5),
    http.Classification(label="positive", score=0.875),
    http.DetectedObject(label="cat", score=0.5, bbox=[1.0, 2.0, 3.0, 4.0]),
    http.ExtractResult(id="item-0", entities=[http.Entity(text="x", label="y", score=1.0)], data={"k": "v"}),
    http.ExtractResponse(model="m", items=[http.ExtractResult(id="item-0")]),
    queue.GenerateParams(prompt="hi", max_new_tokens=8, temperature=0.5, top_p=0.75, stop=["\n"]),
    queue.WorkItem(
        work_item_id="r.1",
        request_id="r",
        item_index=1,
        total_items=2,
        operation=queue.OPERATION_ENCODE,
        model_id="BAAI/bge-m3",
        profile_id="default",
        pool_name="default",
        machine_profile="l4",
        router_id="gw-1",
        reply_subject="_INBOX.gw-1.r",
        timestamp=1760000000.125,
        item={"text": "World"},
        generate=queue.GenerateParams(prompt="p"),
        admission_pool="tenant-a",
        accepts_result_chunks=True,
    ),
    queue.UnitCounts(input_tokens=5, pages=1, images=2, audio_ms=300, pairs=4, content_input_tokens=5),
    queue.WorkResult(
        work_item_id="r.1",
        request_id="r",
        item_index=1,
        success=True,
        result_msgpack=b"\x81\xa1k\x01",
        inference_ms=12.5,
        units=queue.UnitCounts(input_tokens=5),
        retry_after_s=5,
    ),
    queue.ResultChunkV1(
        request_id="r",
        work_item_id="r.1",
        item_index=1,
        transfer_digest=bytes(range(32)),
        chunk_index=0,
        chunk_count=2,
        total_bytes=10,
        payload=b"01234",
    ),
    config.ConfigNotification(
        router_id="sie-config-0",
        bundle_id="default",
        epoch=4,
        bundle_config_hash="ab" * 32,
        model_id="BAAI/bge-m3",
        model_config="sie_id: BAAI/bge-m3\n",
        pool="default",
        bundle_pool_config_hashes={"default": {"default": "cd" * 32}},
        profiles_added=["banking"],
        affected_bundles=["default", "gpu"],
        bundle_adapters=["sie_server.adapters.bge_m3"],
    ),
    ipc.IpcRequest(request_id="ipc-1", method=ipc.PING, body={"timestamp_ms": 1.5}),
    ipc.IpcResponse(request_id="ipc-1", ok=True, body={"matched": True}),
    ipc.IpcResponseChunkV1(
        request_id="ipc-1",
        transfer_digest=bytes(32),
        chunk_index=1,
        chunk_count=2,
        total_bytes=8,
        payload=b"5678",
    ),
    ipc_control.PingRequest(timestamp_ms=1760000000000.0),
    ipc_control.PingResponse(timestamp_ms=1.0, worker_id="w", ready=True, loaded_models=["m"]),
    ipc_control.EnsureModelReadyRequest(model_id="m"),
    ipc_control.ModelDescriptor(tokenizer_path="/t.json", max_seq_len=512, output_types=["dense"]),
    ipc_control.EnsureModelReadyResponse(
        state=ipc_control.MODEL_STATE_READY, batch_budget=64, descriptor=ipc_control.ModelDescriptor()
    ),
    ipc_control.WorkerCapabilitiesRequest(),
    ipc_control.WorkerCapabilitiesResponse(
        supports_execution_authority_v1=True,
        supports_numerical_admission_v1=False,
        has_generation_models=False,
        generation_models=[],
        supported_models=["m"],
        loaded_models=[],
    ),
    ipc_control.ApplyModelConfigRequest(
        bundle_id="default", model_id="m", epoch=2, bundle_config_hash="h", model_config="sie_id: m\n"
    ),
    ipc_control.ApplyModelConfigResponse(applied=True, bundle_config_hash="h", config_version=3),
    ipc_control.ModelConfigEntry(model_id="m", model_config="sie_id: m\n"),
    ipc_control.ReplaceModelConfigsRequest(
        bundle_id="default",
        epoch=2,
        bundle_config_hash="h",
        models=[ipc_control.ModelConfigEntry(model_id="m", model_config="y")],
    ),
    ipc_control.ReplaceModelConfigsResponse(
        applied=True,
        bundle_config_hash="h",
        config_version=1,
        applied_models=["m"],
        applied_profiles=["m:default"],
        unsupported_models=[],
    ),
    ipc_control.SetPinnedModelsRequest(models=["m"]),
    ipc_control.SetPinnedModelsResponse(applied=True, pinned_count=1),
    ipc_control.DrainRequest(deadline_ms=2500.0),
    ipc_control.DrainResponse(),
    ipc_control.SignalGenerateCancelRequest(request_id="r"),
    ipc_control.SignalGenerateCancelResponse(matched=False),
    ipc_control.ModelControlStatusRequest(),
    ipc_control.WorkerMetricsRequest(),
    ipc_control.ModelResidency(model_id="BAAI/bge-m3", worker="worker-0", device="cuda:0", precision="float16"),
    ipc_control.UnloadModelRequest(model_id="BAAI/bge-m3"),
    ipc_control.UnloadModelResponse(unloaded=False, reason="preloaded (SIE_PRELOAD_MODELS)"),
    ipc_control.WorkerMetricsResponse(text="# TYPE sie_worker_models_loaded gauge\nsie_worker_models_loaded 1.0\n"),
    ipc_control.ModelControlStatusResponse(
        worker_id="w-1",
        device="cuda:1",
        ready=True,
        memory_budget_bytes=2**30,
        memory_used_bytes=90_000_000,
        compute_seconds_total=12.5,
        models=[
            ipc_control.ModelControlEntry(
                model_id="m",
                state=ipc_control.MODEL_STATE_READY,
                memory_bytes=90_000_000,
                cost_per_item_s=0.002,
                max_batch_items=64,
                batches=3,
                items=96,
                compute_seconds=0.19,
            ),
            ipc_control.ModelControlEntry(model_id="n", state=ipc_control.MODEL_STATE_LOADING_IN_PROGRESS),
        ],
    ),
    ipc_control.ModelControlEntry(model_id="f", state=ipc_control.MODEL_STATE_FAILED),
    ipc_batch.PreparedTokens(
        input_ids=[[101, 102], [101, 7, 102]], tokenizer_id="t", attention_mask=[[1, 1], [1, 1, 1]], max_seq_len=8
    ),
    ENCODE_ITEM,
    ipc_batch.PreparedPixels(pixel_values=np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)),
    ipc_batch.PreparedPixels(error="Image 1: cut short"),
    attrs.evolve(
        SCORE_ITEM,
        score_items=[{"text": "a"}, {"images": [{"format": "png"}]}],
        prepared_pixels=[None, None, ipc_batch.PreparedPixels(pixel_values=np.zeros((1, 3, 2, 2), dtype=np.float32))],
    ),
    SCORE_ITEM,
    EXTRACT_ITEM,
    ipc_batch.ProcessEncodeBatchRequest(model_id="m", items=[ENCODE_ITEM], accepts_batched_f16_multivectors=True),
    ipc_batch.ProcessScoreBatchRequest(model_id="m", items=[SCORE_ITEM]),
    ipc_batch.ProcessExtractBatchRequest(model_id="m", items=[EXTRACT_ITEM]),
    ipc_batch.RunBatchItem(op=ipc_batch.OP_SCORE, work_item_id="r.0", request_id="r", score=SCORE_ITEM),
    ipc_batch.RunBatchRequest(
        model_id="m",
        batch_id=7,
        lora_key="",
        total_cost=3,
        items=[ipc_batch.RunBatchItem(op=ipc_batch.OP_ENCODE, encode=ENCODE_ITEM, traceparent="00-a-b-01")],
    ),
    ipc_batch.DenseRaw(values=F32, dim=3, normalize=True),
    ipc_batch.ScoreRaw(scores=[0.5, 0.25], item_ids=["item-0", "w"]),
    ipc_batch.SparseRaw(indices=np.array([3, 9], dtype=np.int32), values=F32[:2], dims=30522),
    ipc_batch.MultivectorRaw(values=np.stack([F32, F32]), num_tokens=2, token_dims=3, values_f16=b"\x00\x3c"),
    ipc_batch.RawOutput(score=ipc_batch.ScoreRaw(scores=[1.0], item_ids=["a"])),
    OUTCOME,
    ipc_batch.BatchOutcome(outcomes=[OUTCOME]),
]


def _has_bytes(value) -> bool:
    if isinstance(value, bytes | ResultBody):
        return True
    if attrs.has(type(value)):
        return any(_has_bytes(getattr(value, field.name)) for field in attrs.fields(type(value)))
    if isinstance(value, list | tuple):
        return any(_has_bytes(element) for element in value)
    return False


def _name(sample) -> str:
    return type(sample).__name__


@pytest.mark.parametrize("sample", SAMPLES, ids=_name)
def test_msgpack_round_trip(sample):
    assert from_msgpack(to_msgpack(sample), type(sample)) == sample


@pytest.mark.parametrize("sample", [s for s in SAMPLES if not _has_bytes(s)], ids=_name)
def test_json_round_trip(sample):
    assert from_json(to_json(sample), type(sample)) == sample


def test_every_message_class_has_a_sample():
    modules = (http, queue, config, ipc, ipc_control, ipc_batch)
    classes = {
        cls
        for module in modules
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if attrs.has(cls) and cls.__module__ == module.__name__
    }
    assert classes - {type(sample) for sample in SAMPLES} == set()


def test_worker_heartbeat_round_trips_as_json() -> None:
    from sie.wire import from_json, to_json
    from sie.wire.health import ModelFailure, WorkerHeartbeat

    heartbeat = WorkerHeartbeat(
        worker_id="w-1", pool="default", machine_profile="l4", bundle="default", ready=True, timestamp=12.5,
        loaded_models=["org/a"], failed_models={"org/b": ModelFailure(error_class="NOT_FOUND", message="gone")},
    )  # fmt: skip
    assert from_json(to_json(heartbeat), WorkerHeartbeat) == heartbeat
