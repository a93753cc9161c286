"""The access log (an observer of ObservedRequests) and the JSON log format, driven through ASGI with httpx: one line
per request with its fields, what the request path notes, escaping of caller-chosen values, failures, probes at
DEBUG."""

from __future__ import annotations

import logging

import httpx
import orjson
import pytest

from sie.telemetry.access import ACCESS_LOGGER, log_access
from sie.telemetry.logs import JsonFormatter, log_fields
from sie.telemetry.requests import Message, ObservedRequests, Receive, Scope, Send, note_request


async def _inference_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers like a gateway route: notes the model, items and request id, then 200 (or 418 on /teapot)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/boom":
        raise RuntimeError("a bug")
    if scope["path"].startswith("/v1/encode/"):
        note_request(model=scope["path"].removeprefix("/v1/encode/"), items=3)
        note_request(request_id="req-1")
    status = 418 if scope["path"] == "/teapot" else 200
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _client(app: object = _inference_app) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=ObservedRequests(app, [log_access]), client=("10.1.2.3", 4567))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://sie.test")


def _access_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == ACCESS_LOGGER]


async def test_one_line_per_request_with_what_the_request_path_noted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with _client() as client:
        response = await client.post("/v1/encode/acme/model-a?token=secret", json={"items": ["private words"]})
    assert response.status_code == 200
    [record] = _access_records(caplog)
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith('10.1.2.3:4567 "POST /v1/encode/acme/model-a" 200 ')
    assert message.endswith("ms request_id=req-1 model=acme/model-a items=3")
    assert "secret" not in message  # the query string is left out
    assert "private words" not in message


async def test_a_json_line_carries_the_fields_as_keys(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with _client() as client:
        await client.get("/teapot")
    [record] = _access_records(caplog)
    line = orjson.loads(JsonFormatter().format(record))
    assert line["logger"] == ACCESS_LOGGER
    assert line["level"] == "info"
    assert line["event"] == "access"
    assert (line["method"], line["path"], line["status"]) == ("GET", "/teapot", 418)
    assert (line["request_id"], line["model"], line["items"]) == (None, None, None)
    assert line["client"] == "10.1.2.3:4567"
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    assert "request_id=- model=- items=-" in line["message"]


async def test_caller_chosen_values_cannot_forge_a_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with _client() as client:
        await client.post('/v1/encode/evil%0A2026-01-01 INFO sie.access: "forged', content=b"")
    [record] = _access_records(caplog)
    message = record.getMessage()
    assert "\n" not in message
    assert '"forged' not in message
    assert "model=evil%0A2026-01-01%20INFO%20sie.access:%20%22forged" in message


async def test_a_long_model_name_is_cut(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with _client() as client:
        await client.post("/v1/encode/" + "m" * 5000)
    [record] = _access_records(caplog)
    assert len(record.getMessage()) < 700


async def test_an_exception_is_logged_as_500_and_propagates(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with _client() as client:
        with pytest.raises(RuntimeError, match="a bug"):
            await client.get("/boom")
    [record] = _access_records(caplog)
    assert ' "GET /boom" 500 ' in record.getMessage()


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
async def test_probes_and_scrapes_log_at_debug(caplog: pytest.LogCaptureFixture, path: str) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with _client() as client:
        await client.get(path)
    assert _access_records(caplog) == []
    caplog.set_level(logging.DEBUG, logger=ACCESS_LOGGER)
    async with _client() as client:
        await client.get(path)
    [record] = _access_records(caplog)
    assert record.levelno == logging.DEBUG


async def test_other_scopes_pass_through_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=ACCESS_LOGGER)
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        return None

    await ObservedRequests(app, [log_access])({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan"]
    assert _access_records(caplog) == []


async def test_a_note_outside_a_request_reaches_no_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    note_request(request_id="stray", model="stray", items=9)
    async with _client() as client:
        await client.get("/teapot")
    [record] = _access_records(caplog)
    assert record.getMessage().endswith("request_id=- model=- items=-")


def test_json_fields_never_hide_the_line_keys() -> None:
    record = logging.LogRecord("sie.x", logging.INFO, __file__, 1, "hello %s", ("world",), None)
    for key, value in log_fields(message="forged", level="debug", model="m").items():
        setattr(record, key, value)
    line = orjson.loads(JsonFormatter().format(record))
    assert (line["message"], line["level"], line["model"]) == ("hello world", "info", "m")
