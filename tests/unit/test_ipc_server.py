"""Request envelope validation and response envelopes of the IPC server, without a socket (sie.ipc.server)."""

import msgpack
import pytest

from sie.ipc.errors import IpcProtocolError
from sie.ipc.methods import METHODS
from sie.ipc.server import RequestEnvelope, error_payload, parse_envelope, response_payload
from sie.wire import ipc


def frame(**fields) -> bytes:
    return msgpack.packb({"version": 1, "request_id": "ipc-7", "method": "Ping", "body": {}} | fields)


def test_a_valid_envelope():
    assert parse_envelope(frame(accepts_ipc_response_chunks_v1=True)) == RequestEnvelope("ipc-7", "Ping", {}, True)


@pytest.mark.parametrize("value", [1, "true", None, False])
def test_only_exactly_true_negotiates_chunking(value):
    assert parse_envelope(frame(accepts_ipc_response_chunks_v1=value)).accepts_chunks is False


@pytest.mark.parametrize(
    ("fields", "request_id", "error"),
    [
        ({"version": 2}, "ipc-7", "unsupported version 2"),
        ({"version": None}, "ipc-7", "unsupported version None"),
        ({"version": True}, "ipc-7", "unsupported version True"),
        ({"version": 2, "request_id": 5}, "", "unsupported version 2"),
        ({"method": 3}, "ipc-7", "envelope missing fields"),
        ({"method": None}, "ipc-7", "envelope missing fields"),
        ({"request_id": 9}, "", "envelope missing fields"),
        ({"body": []}, "ipc-7", "envelope missing fields"),
        ({"body": "x"}, "ipc-7", "envelope missing fields"),
    ],
)
def test_envelope_errors(fields: dict, request_id: str, error: str):
    assert parse_envelope(frame(**fields)) == RequestEnvelope(request_id, error=error)


def test_a_missing_request_id_and_a_null_body_are_tolerated():
    raw = msgpack.packb({"version": 1, "method": "Ping", "body": None})
    assert parse_envelope(raw) == RequestEnvelope("", "Ping", {}, False)


@pytest.mark.parametrize("data", [msgpack.packb([1, 2]), msgpack.packb("Ping"), b"", b"\xc1", b"\x81\xa1"])
def test_not_a_map_or_malformed_msgpack_closes_the_connection(data: bytes):
    with pytest.raises(IpcProtocolError):
        parse_envelope(data)


def test_response_envelopes_have_no_kind_and_keep_bytes_as_bin():
    ok = msgpack.unpackb(response_payload("r", {"blob": b"\x00\x01"}), raw=False)
    assert ok == {"version": 1, "request_id": "r", "ok": True, "body": {"blob": b"\x00\x01"}, "error": None}
    assert list(ok) == ["version", "request_id", "ok", "body", "error"]
    error = msgpack.unpackb(error_payload("ipc-7", "unknown method NoSuchMethod"))
    assert error == {"version": 1, "request_id": "ipc-7", "ok": False, "body": None,
                     "error": "unknown method NoSuchMethod"}  # fmt: skip


def test_served_methods_are_contract_names_and_batches_run_in_the_background():
    assert set(METHODS) <= ipc.METHODS
    background = {name for name, method in METHODS.items() if method.background}
    assert background == {ipc.RUN_BATCH, ipc.PROCESS_ENCODE_BATCH, ipc.PROCESS_SCORE_BATCH, ipc.PROCESS_EXTRACT_BATCH,
                          ipc.PROCESS_GENERATE}  # fmt: skip
    assert {name for name, method in METHODS.items() if method.streaming} == {ipc.PROCESS_GENERATE}
    assert ipc.PROCESS_GENERATE_WITH_EXECUTION_AUTHORITY_V1 not in METHODS
    assert {ipc.PING, ipc.ENSURE_MODEL_READY, ipc.WORKER_CAPABILITIES, ipc.APPLY_MODEL_CONFIG,
            ipc.REPLACE_MODEL_CONFIGS, ipc.DRAIN} <= set(METHODS)  # fmt: skip
