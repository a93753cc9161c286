"""The KServe V2 gRPC service of the gateway app (SIE_GATEWAY_GRPC_PORT) through a real gRPC channel: bearer tokens
as the HTTP inference routes need them, failures as gRPC statuses with the SIE code and `retry-after` in the trailing
metadata, and a draining gateway refusing new calls. The app runs in-process over the loopback transport with no
worker (its lifespan starts the gRPC server on a free port); Triton's own client against a served model is in
tests/e2e/test_dialects.py. The messages are checked on the wire against tritonclient's generated ones."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import grpc
import pytest
from starlette.applications import Starlette

from sie.catalog import Catalog
from sie.gateway.http import kserve_messages as messages
from sie.gateway.http.app import GatewaySources, build_gateway_app, serving_state
from sie.gateway.http.auth import GatewayAuth
from sie.gateway.publisher import QueueConsumers
from sie.settings import GatewaySettings, LaneSettings, StreamSettings
from sie.telemetry.access import ACCESS_LOGGER
from sie.transport.loopback import LoopbackTransport
from support.gateway_fakes import NoWorkers

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TOKEN = "infer-a"


@asynccontextmanager
async def grpc_gateway(catalog: Catalog, auth: GatewayAuth) -> AsyncIterator[tuple[Starlette, grpc.aio.Channel]]:
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(LoopbackTransport(StreamSettings()))
        sources = GatewaySources(lambda: catalog, transport, QueueConsumers(transport), NoWorkers(), auth=auth)
        app = build_gateway_app(sources, GatewaySettings(grpc_port=0), LaneSettings(), "gw-grpc")
        await stack.enter_async_context(app.router.lifespan_context(app))
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{app.state.grpc_port}"))
        yield app, channel


async def call(channel: grpc.aio.Channel, method: str, request: Any, token: str | None = None) -> Any:
    request_name, response_name = messages.METHODS[method]
    stub = channel.unary_unary(
        f"/{messages.SERVICE}/{method}",
        request_serializer=lambda message: message.SerializeToString(),
        response_deserializer=messages.message_class(response_name).FromString,
    )
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    return await stub(request, metadata=metadata, timeout=30)


def infer_request(model: str = MINILM) -> Any:
    request = messages.ModelInferRequest(model_name=model)
    text = request.inputs.add(name="text", datatype="BYTES", shape=[1])
    text.contents.bytes_contents.append(b"Hello world")
    return request


async def test_calls_need_an_inference_token_when_auth_is_on(baseline_catalog: Catalog) -> None:
    async with grpc_gateway(baseline_catalog, GatewayAuth(mode="token", tokens=(TOKEN,))) as (_, channel):
        live = messages.message_class("ServerLiveRequest")()
        assert (await call(channel, "ServerLive", live, TOKEN)).live
        for token in (None, "wrong"):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(channel, "ServerLive", live, token)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert ("x-sie-error-code", "UNAUTHORIZED") in tuple(refused.value.trailing_metadata())
        metadata = await call(channel, "ModelMetadata", messages.message_class("ModelMetadataRequest")(name=MINILM),
                              TOKEN)  # fmt: skip
        assert metadata.name == MINILM and [tensor.name for tensor in metadata.outputs][0] == "dense"


async def test_failures_are_statuses_with_the_sie_code_and_retry_after(baseline_catalog: Catalog) -> None:
    async with grpc_gateway(baseline_catalog, GatewayAuth()) as (app, channel):
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await call(channel, "ModelInfer", infer_request("acme/missing"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND and "acme/missing" in missing.value.details()
        bad = infer_request()
        bad.inputs[0].datatype = "FP32"
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await call(channel, "ModelInfer", bad)
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "BYTES" in invalid.value.details()
        assert ("x-sie-error-code", "INVALID_INPUT") in tuple(invalid.value.trailing_metadata())
        empty = messages.ModelInferRequest(model_name=MINILM)
        empty.inputs.add(name="text", datatype="BYTES", shape=[0])
        with pytest.raises(grpc.aio.AioRpcError) as nothing:
            await call(channel, "ModelInfer", empty)
        assert nothing.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no texts" in nothing.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as no_worker:  # nobody consumes the lane: a retryable 503
            await call(channel, "ModelInfer", infer_request())
        assert no_worker.value.code() == grpc.StatusCode.UNAVAILABLE
        assert any(key == "retry-after" and int(value) > 0 for key, value in no_worker.value.trailing_metadata())

        serving_state(app).begin_shutdown()
        with pytest.raises(grpc.aio.AioRpcError) as draining:
            await call(channel, "ModelInfer", infer_request())
        assert draining.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("x-sie-error-code", "SHUTTING_DOWN") in tuple(draining.value.trailing_metadata())
        # every call counted has left (a call's count drops after its status is sent, so the client can see the
        # status first): drain returns once none is in flight, False if one stayed counted
        assert await serving_state(app).drain(5.0)


async def test_each_call_gets_an_access_line_like_an_http_request(
    baseline_catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with grpc_gateway(baseline_catalog, GatewayAuth()) as (_, channel):
        await call(channel, "ServerLive", messages.message_class("ServerLiveRequest")())
        with pytest.raises(grpc.aio.AioRpcError):
            await call(channel, "ModelInfer", infer_request("acme/missing"))
    lines = [record.getMessage() for record in caplog.records if record.name == ACCESS_LOGGER]
    assert any('"POST /inference.GRPCInferenceService/ServerLive" 200' in line for line in lines), lines
    missing = next(line for line in lines if "/inference.GRPCInferenceService/ModelInfer" in line)
    assert '" 404 ' in missing and "model=acme/missing" in missing and missing.startswith("127.0.0.1:")


def test_the_messages_are_the_protocols_on_the_wire() -> None:
    """Serialised by tritonclient's generated messages, read by ours, and back: field names and numbers agree."""
    from tritonclient.grpc import service_pb2 as reference

    sent = reference.ModelInferRequest(model_name="m", model_version="1", id="r")
    sent.parameters["is_query"].bool_param = True
    sent.parameters["instruction"].string_param = "find"
    tensor = sent.inputs.add(name="text", datatype="BYTES", shape=[2, 1])
    tensor.contents.bytes_contents.extend([b"a", b"b"])
    sent.outputs.add(name="dense").parameters["binary_data"].bool_param = False
    sent.raw_input_contents.append(b"\x01\x00\x00\x00a")
    ours = messages.ModelInferRequest.FromString(sent.SerializeToString())
    assert ours.parameters["instruction"].string_param == "find" and list(ours.inputs[0].shape) == [2, 1]
    assert reference.ModelInferRequest.FromString(ours.SerializeToString()) == sent

    answer = messages.ModelInferResponse(model_name="m", model_version="1", id="r")
    answer.outputs.add(name="scores", datatype="FP32", shape=[3])
    answer.raw_output_contents.append(bytes(12))
    assert reference.ModelInferResponse.FromString(answer.SerializeToString()).outputs[0].shape == [3]
    described = messages.ModelMetadataResponse(name="m", versions=["1"], platform="sie")
    described.inputs.add(name="text", datatype="BYTES", shape=[-1])
    assert reference.ModelMetadataResponse.FromString(described.SerializeToString()).inputs[0].shape == [-1]
