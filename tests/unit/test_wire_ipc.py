"""IPC envelopes, method names and method bodies (sie.wire.ipc, ipc_control, ipc_batch)."""

import hashlib

import msgpack
import numpy as np
import pytest

from sie.wire import DecodeError, from_msgpack, ipc, packb, structure, to_msgpack, unpackb, unstructure
from sie.wire.ipc_batch import (
    DISPOSITION_NAK_RETRY,
    BatchOutcome,
    EncodeBatchItem,
    ItemOutcome,
    MultivectorRaw,
    ProcessEncodeBatchRequest,
    RawOutput,
    RunBatchItem,
    RunBatchRequest,
)
from sie.wire.ipc_control import (
    ApplyModelConfigResponse,
    DrainRequest,
    DrainResponse,
    EnsureModelReadyResponse,
    ModelDescriptor,
    PingResponse,
    WorkerCapabilitiesRequest,
)


def test_there_are_seventeen_contract_method_names_and_our_three_additions():
    assert len(ipc.METHODS) == 20
    assert ipc.UNLOAD_MODEL == "UnloadModel" and ipc.UNLOAD_MODEL in ipc.METHODS
    assert ipc.MODEL_CONTROL_STATUS == "ModelControlStatus" and ipc.MODEL_CONTROL_STATUS in ipc.METHODS
    assert ipc.WORKER_METRICS == "WorkerMetrics" and ipc.WORKER_METRICS in ipc.METHODS
    assert {ipc.RUN_BATCH, ipc.SET_PINNED_MODELS, ipc.NUMERICAL_PROFILE_SNAPSHOT} <= ipc.METHODS


def test_request_envelope_shape():
    request = ipc.IpcRequest(
        request_id="ipc-7", method=ipc.RUN_BATCH, body={"model_id": "m"}, accepts_ipc_response_chunks_v1=True
    )
    assert msgpack.unpackb(to_msgpack(request)) == {
        "version": 1,
        "request_id": "ipc-7",
        "method": "RunBatch",
        "body": {"model_id": "m"},
        "accepts_ipc_response_chunks_v1": True,
    }


def test_request_envelope_without_the_capability_reads_as_false():
    raw = {"version": 1, "request_id": "r", "method": "Ping", "body": {"timestamp_ms": 1.0}}
    assert structure(raw, ipc.IpcRequest).accepts_ipc_response_chunks_v1 is False


def test_request_envelope_with_a_wrong_body_type_is_rejected():
    raw = {"version": 1, "request_id": "r", "method": "Ping", "body": []}
    with pytest.raises(DecodeError) as caught:
        structure(raw, ipc.IpcRequest)
    assert str(caught.value) == "Expected `object`, got `array` - at `$.body`"


def test_success_response_carries_a_null_error_and_no_kind():
    response = ipc.IpcResponse(request_id="r", ok=True, body=unstructure(DrainResponse()))
    assert unpackb(to_msgpack(response)) == {
        "version": 1,
        "request_id": "r",
        "ok": True,
        "body": {"acknowledged": True},
        "error": None,
    }


def test_response_chunks_slice_the_serialized_envelope():
    envelope = to_msgpack(ipc.IpcResponse(request_id="r", ok=True, body={"blob": b"z" * 100}))
    digest = hashlib.sha256(envelope).digest()
    size = 40
    count = -(-len(envelope) // size)
    chunks = [
        ipc.IpcResponseChunkV1(
            request_id="r",
            transfer_digest=digest,
            chunk_index=index,
            chunk_count=count,
            total_bytes=len(envelope),
            payload=envelope[index * size : (index + 1) * size],
        )
        for index in range(count)
    ]
    frames = [unpackb(to_msgpack(chunk)) for chunk in chunks]
    assert list(frames[0]) == [
        "version",
        "request_id",
        "transfer_digest",
        "chunk_index",
        "chunk_count",
        "total_bytes",
        "payload",
        "kind",
    ]
    assert {frame["kind"] for frame in frames} == {"ipc_response_chunk_v1"}
    rebuilt = b"".join(structure(frame, ipc.IpcResponseChunkV1).payload for frame in frames)
    assert hashlib.sha256(rebuilt).digest() == digest
    assert from_msgpack(rebuilt, ipc.IpcResponse).body == {"blob": b"z" * 100}


def test_listed_defaults():
    assert structure({"timestamp_ms": 1.0, "worker_id": "w"}, PingResponse) == PingResponse(
        timestamp_ms=1.0, worker_id="w", ready=False, bundle_config_hash="", loaded_models=[], loading_models=[]
    )
    descriptor = structure({}, ModelDescriptor)
    assert (descriptor.output_types, descriptor.supports_run_batch) == ([], False)
    reply = structure({"applied": True, "bundle_config_hash": "h"}, ApplyModelConfigResponse)
    assert (reply.config_version, reply.unsupported_models) == (0, [])
    assert structure({}, DrainResponse).acknowledged is True
    assert unstructure(WorkerCapabilitiesRequest()) == {}


def test_ensure_model_ready_loading_has_no_budget():
    response = structure({"state": "loading_started"}, EnsureModelReadyResponse)
    assert response.batch_budget is None
    assert response.descriptor is None


def test_drain_rejects_a_bool_deadline_and_accepts_an_integer():
    with pytest.raises(DecodeError):
        structure({"deadline_ms": False}, DrainRequest)
    assert structure({"deadline_ms": 3000}, DrainRequest).deadline_ms == 3000.0


def _encode_item(**overrides) -> dict:
    return {
        "work_item_id": "r.0",
        "request_id": "r",
        "item_index": 0,
        "total_items": 1,
        "timestamp": 1.0,
        "item": {"text": "hi"},
    } | overrides


def test_encode_batch_item_defaults():
    item = structure(_encode_item(), EncodeBatchItem)
    assert (item.is_query, item.payload_fetch_ms, item.prepared_tokens, item.output_types) == (False, 0.0, None, None)


def test_process_encode_batch_missing_items_message():
    # The worker answers "bad body for ProcessEncodeBatch: Object missing required field `items`".
    with pytest.raises(DecodeError) as caught:
        structure({"model_id": "m"}, ProcessEncodeBatchRequest)
    assert str(caught.value) == "Object missing required field `items`"


def test_run_batch_round_trip_with_prepared_tokens():
    body = {
        "model_id": "sentence-transformers/all-MiniLM-L6-v2",
        "batch_id": 41,
        "lora_key": "",
        "total_cost": 5,
        "items": [
            {
                "op": "encode",
                "work_item_id": "r.0",
                "request_id": "r",
                "encode": _encode_item(prepared_tokens={"input_ids": [[101, 7592, 102]], "tokenizer_id": "t"}),
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            }
        ],
    }
    request = from_msgpack(msgpack.packb(body), RunBatchRequest)
    (ids,) = request.items[0].encode.prepared_tokens.input_ids
    assert ids.dtype == np.int64 and ids.tolist() == [101, 7592, 102]  # an array in Python
    assert request.accepts_batched_f16_multivectors is False
    wire = msgpack.unpackb(to_msgpack(request))
    assert wire["items"][0]["encode"]["prepared_tokens"]["input_ids"] == [[101, 7592, 102]]  # `[[int]]` on the wire
    assert from_msgpack(to_msgpack(request), RunBatchRequest) == request


def test_a_run_batch_item_leaves_out_an_absent_trace_context():
    # Readers that predate the fields default them to None; writers send them only when there is a context.
    plain = msgpack.unpackb(to_msgpack(structure({"op": "encode", "encode": _encode_item()}, RunBatchItem)))
    assert "traceparent" not in plain and "tracestate" not in plain
    traced = {
        "op": "encode",
        "encode": _encode_item(),
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }
    wire = msgpack.unpackb(to_msgpack(structure(traced, RunBatchItem)))
    assert wire["traceparent"] == traced["traceparent"] and "tracestate" not in wire


def test_run_batch_item_defaults():
    item = structure({"op": "score"}, RunBatchItem)
    assert (item.work_item_id, item.request_id, item.item_index, item.encode) == ("", "", 0, None)


def test_observed_minilm_outcome_with_a_list_of_floats():
    # contracts Part A §2.1: raw_output.dense with 384 floats, normalize false, result_msgpack null.
    values = [float(i) / 8 for i in range(384)]
    outcome_map = {
        "work_item_id": "r.0",
        "request_id": "r",
        "item_index": 0,
        "disposition": "publish_and_ack",
        "nak_delay_ms": 0,
        "result_msgpack": None,
        "error": None,
        "error_code": None,
        "inference_ms": 3.5,
        "tokenization_ms": 0.25,
        "postprocessing_ms": 0.125,
        "raw_output": {"dense": {"values": values, "dim": 384, "normalize": False}},
        "units": {"input_tokens": 4, "pages": 0, "images": 0, "audio_ms": 0, "pairs": 0},
        "retry_after_s": None,
    }
    outcome = from_msgpack(msgpack.packb({"outcomes": [outcome_map]}), BatchOutcome).outcomes[0]
    dense = outcome.raw_output.dense
    assert dense.values.dtype == np.float32
    assert dense.values.shape == (384,)
    assert dense.values[8] == 1.0
    assert outcome.units.input_tokens == 4


def test_hash_gate_nak_outcome():
    outcome = structure(
        {"work_item_id": "r.0", "request_id": "r", "item_index": 0, "disposition": "nak_retry", "nak_delay_ms": 5000},
        ItemOutcome,
    )
    assert outcome.disposition == DISPOSITION_NAK_RETRY
    assert outcome.nak_delay_ms == 5000
    assert outcome.error_code is None


def test_raw_output_needs_exactly_one_variant():
    with pytest.raises(ValueError, match="exactly one"):
        RawOutput()
    with pytest.raises(DecodeError) as caught:
        structure({"dense": {"values": [1.0], "dim": 1}, "score": {"scores": [], "item_ids": []}}, RawOutput)
    assert caught.value.path == "$"


def test_multivector_f16_bytes_stay_bytes():
    halves = np.array([[1.0, 2.0]], dtype=np.float16)
    raw = MultivectorRaw(
        values=np.zeros((0,), dtype=np.float32), num_tokens=1, token_dims=2, values_f16=halves.tobytes()
    )
    decoded = from_msgpack(packb(unstructure(RawOutput(multivector=raw))), RawOutput).multivector
    assert np.frombuffer(decoded.values_f16, dtype=np.float16).tolist() == [1.0, 2.0]
    assert decoded.dtype == "float32"
