"""Exactly what each client method puts on the wire: paths, headers and msgpack bodies (contracts Part A §2.5).

Bodies are compared byte for byte with what sie-sdk 0.10.1 packs (`msgpack.packb(..., use_bin_type=True)`).
"""

from __future__ import annotations

import inspect
from typing import Any

import httpx
import msgpack
import pytest

from sie.client import SIEAsyncClient, SIEClient
from sie.client._base import sdk_version

BASE = "http://sie.test:8080"
ENCODE_ANSWER = msgpack.packb({"model": "m", "items": [{"id": "a"}]}, use_bin_type=True)
SCORE_ANSWER = msgpack.packb({"model": "m", "query_id": None, "scores": []}, use_bin_type=True)
EXTRACT_ANSWER = msgpack.packb({"model": "m", "items": [{"id": "item-0"}]}, use_bin_type=True)


class Recorder:
    def __init__(self, answer: bytes = ENCODE_ANSWER) -> None:
        self.answer = answer
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.method == "GET":
            return httpx.Response(200, json={"models": []})
        return httpx.Response(200, content=self.answer, headers={"content-type": "application/msgpack"})

    @property
    def last(self) -> httpx.Request:
        return self.requests[-1]


@pytest.fixture(params=["sync", "async"])
async def connect(request):
    clients: list[Any] = []

    def make(recorder: Recorder, **options: Any) -> Any:
        if request.param == "sync":
            client = SIEClient(BASE, transport=httpx.MockTransport(recorder), **options)
        else:

            async def answer(req: httpx.Request) -> httpx.Response:
                return recorder(req)

            client = SIEAsyncClient(BASE, transport=httpx.MockTransport(answer), **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        if isinstance(client, SIEClient):
            client.close()
        else:
            await client.aclose()


async def call(client: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    result = getattr(client, method)(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def sdk_bytes(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


async def test_encode_request_matches_the_captured_sdk_wire(connect):
    recorder = Recorder()
    client = connect(recorder, api_key="secret", gpu="mypool/l4", options={"profile": "default"})
    await call(
        client,
        "encode",
        "org/model.v1",
        [{"id": "a", "text": "hi"}],
        output_types=["dense"],
        instruction="q:",
        output_dtype="float16",
        is_query=True,
    )
    request = recorder.last
    assert request.method == "POST"
    assert request.url.raw_path == b"/v1/encode/org/model.v1"
    expected = {
        "items": [{"id": "a", "text": "hi"}],
        "params": {
            "output_types": ["dense"],
            "instruction": "q:",
            "output_dtype": "float16",
            "options": {"profile": "default", "is_query": True},
        },
    }
    assert request.content == sdk_bytes(expected)
    headers = request.headers
    assert headers["content-type"] == "application/msgpack"
    assert headers["accept"] == "application/msgpack"
    assert headers["x-sie-sdk-version"] == sdk_version()
    assert headers["authorization"] == "Bearer secret"
    assert headers["x-sie-machine-profile"] == "l4"
    assert headers["x-sie-pool"] == "mypool"


async def test_encode_without_params_sends_items_only_and_no_routing_headers(connect):
    recorder = Recorder()
    client = connect(recorder)
    await call(client, "encode", "m", {"id": "a", "text": "hi"})
    assert recorder.last.content == sdk_bytes({"items": [{"id": "a", "text": "hi"}]})
    for name in ("authorization", "x-sie-machine-profile", "x-sie-pool"):
        assert name not in recorder.last.headers


async def test_per_call_options_win_over_client_options_and_is_query_goes_inside(connect):
    recorder = Recorder()
    client = connect(recorder, options={"profile": "default", "normalize": True})
    await call(client, "encode", "m", {"id": "a"}, options={"normalize": False}, is_query=False)
    params = msgpack.unpackb(recorder.last.content)["params"]
    assert params == {"options": {"profile": "default", "normalize": False, "is_query": False}}


async def test_a_plain_gpu_sets_only_the_machine_profile_and_per_call_gpu_wins(connect):
    recorder = Recorder()
    client = connect(recorder, gpu="pool-a/a100")
    await call(client, "encode", "m", {"id": "a"}, gpu="l4")
    assert recorder.last.headers["x-sie-machine-profile"] == "l4"
    assert "x-sie-pool" not in recorder.last.headers


async def test_model_ids_go_into_the_path_unencoded(connect):
    recorder = Recorder()
    client = connect(recorder)
    await call(client, "encode", "BAAI/bge-m3:banking", {"id": "a"})
    assert recorder.last.url.raw_path == b"/v1/encode/BAAI/bge-m3:banking"


async def test_score_request_is_top_level(connect):
    recorder = Recorder(SCORE_ANSWER)
    client = connect(recorder, options={"profile": "default"})
    query = {"id": "q", "text": "What is ML?"}
    items = [{"text": "ML learns from data."}, {"id": "w", "text": "Sunny"}]
    await call(client, "score", "BAAI/bge-reranker-v2-m3", query, items, instruction="rank:")
    assert recorder.last.url.raw_path == b"/v1/score/BAAI/bge-reranker-v2-m3"
    expected = {"query": query, "items": items, "instruction": "rank:", "options": {"profile": "default"}}
    assert recorder.last.content == sdk_bytes(expected)


async def test_score_without_extras_sends_query_and_items_only(connect):
    recorder = Recorder(SCORE_ANSWER)
    client = connect(recorder)
    await call(client, "score", "m", {"text": "q"}, [{"text": "d"}])
    assert recorder.last.content == sdk_bytes({"query": {"text": "q"}, "items": [{"text": "d"}]})


async def test_extract_request_wraps_params(connect):
    recorder = Recorder(EXTRACT_ANSWER)
    client = connect(recorder)
    await call(
        client,
        "extract",
        "urchade/gliner_multi-v2.1",
        {"text": "Tim Cook is the CEO of Apple."},
        labels=["person", "organization"],
    )
    assert recorder.last.url.raw_path == b"/v1/extract/urchade/gliner_multi-v2.1"
    expected = {"items": [{"text": "Tim Cook is the CEO of Apple."}], "params": {"labels": ["person", "organization"]}}
    assert recorder.last.content == sdk_bytes(expected)


async def test_extract_params_in_sdk_order(connect):
    recorder = Recorder(EXTRACT_ANSWER)
    client = connect(recorder, options={"threshold": 0.5})
    schema = {"type": "object"}
    await call(client, "extract", "m", [{"text": "x"}], labels=["a"], output_schema=schema, instruction="find")
    params = {"labels": ["a"], "output_schema": schema, "instruction": "find", "options": {"threshold": 0.5}}
    assert recorder.last.content == sdk_bytes({"items": [{"text": "x"}], "params": params})


@pytest.mark.parametrize(("args", "path"), [((), b"/v1/models"), (("BAAI/bge-m3",), b"/v1/models/BAAI/bge-m3")])
async def test_catalogue_reads_ask_for_json(connect, args, path):
    recorder = Recorder()
    client = connect(recorder, api_key="k")
    await call(client, "get_model" if args else "list_models", *args)
    assert recorder.last.method == "GET"
    assert recorder.last.url.raw_path == path
    assert recorder.last.headers["accept"] == "application/json"
    assert recorder.last.headers["authorization"] == "Bearer k"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"connect": 10.0, "read": 150.0, "write": 150.0, "pool": 150.0}),
        ({"timeout_s": 7}, {"connect": 7, "read": 7, "write": 7, "pool": 7}),
        ({"timeout_s": 7, "connect_timeout_s": 2}, {"connect": 2, "read": 7, "write": 7, "pool": 7}),
    ],
)
async def test_timeouts(connect, options, expected):
    recorder = Recorder()
    client = connect(recorder, **options)
    await call(client, "encode", "m", {"id": "a"})
    assert recorder.last.extensions["timeout"] == expected


def test_base_url_is_required_and_checked():
    with pytest.raises(TypeError):
        SIEClient()  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="sie.test"):
        SIEClient("sie.test:8080")
    client = SIEClient(BASE + "/")
    assert client.base_url == BASE
    client.close()


async def test_score_refuses_a_single_item_where_a_list_belongs(connect):
    client = connect(Recorder(SCORE_ANSWER))
    with pytest.raises(TypeError, match="list of items"):
        await call(client, "score", "m", {"text": "q"}, {"text": "d"})


async def test_images_travel_as_the_sdk_sends_them(connect, tmp_path) -> None:
    """Encoded bytes unchanged with their detected format; PIL images, arrays and paths as JPEG at quality 95; the
    caller's item is left as it was; bytes of no image format are refused before anything is sent."""
    import io

    import numpy as np
    from PIL import Image

    picture = Image.new("RGBA", (4, 3), (10, 20, 30, 128))
    jpeg = io.BytesIO()
    picture.convert("RGB").save(jpeg, format="JPEG", quality=95)
    png = io.BytesIO()
    picture.save(png, format="PNG")
    array = np.zeros((3, 4, 3), dtype=np.uint8)
    array_jpeg = io.BytesIO()
    Image.fromarray(array).save(array_jpeg, format="JPEG", quality=95)
    path = tmp_path / "p.png"
    path.write_bytes(png.getvalue())
    recorder = Recorder()
    client = connect(recorder)
    item = {"id": "a", "images": [picture, png.getvalue(), array, str(path), {"data": png.getvalue(), "format": "PNG"}]}
    await call(client, "encode", "m", [item])
    expected_images = [
        {"data": jpeg.getvalue(), "format": "jpeg"}, {"data": png.getvalue(), "format": "png"},
        {"data": array_jpeg.getvalue(), "format": "jpeg"}, {"data": jpeg.getvalue(), "format": "jpeg"},
        {"data": png.getvalue(), "format": "png"},
    ]  # fmt: skip
    assert recorder.last.content == sdk_bytes({"items": [{"id": "a", "images": expected_images}]})
    assert item["images"][0] is picture  # not converted in place
    sent = len(recorder.requests)
    with pytest.raises(ValueError, match="Could not detect the image format"):
        await call(client, "encode", "m", [{"images": [b"%PDF-1.4"]}])
    with pytest.raises(ValueError, match="declared 'jpeg', the bytes are png"):
        await call(client, "extract", "m", [{"images": [{"data": png.getvalue(), "format": "jpeg"}]}])
    assert len(recorder.requests) == sent
