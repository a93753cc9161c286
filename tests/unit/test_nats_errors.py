"""nats-py exceptions become TransportError subclasses in one place, most specific first, chained with `from`."""

from __future__ import annotations

import asyncio

import nats.errors
import nats.js.errors
import pytest

from sie.transport.base import BackpressureError, NoConsumerError, TransportError, TransportUnavailable
from sie.transport.nats.errors import for_worker, translate, translated


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (nats.js.errors.ServiceUnavailableError(code=503, err_code=10077, description="maximum messages exceeded"),
         BackpressureError),
        (nats.js.errors.APIError(code=503, err_code=10078, description="maximum bytes exceeded"), BackpressureError),
        (nats.js.errors.TooManyStalledMsgsError(), BackpressureError),
        (nats.js.errors.ServiceUnavailableError(), TransportUnavailable),
        (nats.errors.ConnectionClosedError(), TransportUnavailable),
        (nats.errors.ConnectionDrainingError(), TransportUnavailable),
        (nats.errors.ConnectionReconnectingError(), TransportUnavailable),
        (nats.errors.StaleConnectionError(), TransportUnavailable),
        (nats.errors.NoServersError(), TransportUnavailable),
        (nats.errors.OutboundBufferLimitError(), TransportUnavailable),
        (nats.errors.TimeoutError(), TransportUnavailable),
        (nats.errors.FlushTimeoutError(), TransportUnavailable),
        (TimeoutError(), TransportUnavailable),
        (ConnectionRefusedError(111, "refused"), TransportUnavailable),
        (nats.js.errors.NoStreamResponseError(), TransportError),
        (nats.errors.NoRespondersError(), TransportError),
        (nats.js.errors.NotFoundError(code=404, err_code=10059, description="stream not found"), TransportError),
        (nats.js.errors.BadRequestError(code=400, err_code=10100, description="filtered consumer not unique"),
         TransportError),
        (nats.errors.BadSubjectError(), TransportError),
    ],
)  # fmt: skip
def test_translation_table(exc: BaseException, expected: type[TransportError]) -> None:
    translated_exc = translate(exc, "publish_work")
    assert type(translated_exc) is expected
    assert str(translated_exc).startswith("publish_work: ")


def test_messages_name_the_server_error() -> None:
    exc = nats.js.errors.ServiceUnavailableError(code=503, err_code=10077, description="maximum messages exceeded")
    assert "maximum messages exceeded" in str(translate(exc, "publish_work"))
    assert "10077" in str(translate(exc, "publish_work"))


def test_translated_chains_the_original() -> None:
    original = nats.errors.ConnectionClosedError()
    with pytest.raises(TransportUnavailable) as caught, translated("ack"):
        raise original
    assert caught.value.__cause__ is original


def test_translated_lets_our_errors_and_cancellation_through() -> None:
    ours = BackpressureError("full")
    with pytest.raises(BackpressureError) as caught, translated("publish_work"):
        raise ours
    assert caught.value is ours
    with pytest.raises(asyncio.CancelledError), translated("fetch"):
        raise asyncio.CancelledError


def test_translated_leaves_unrelated_bugs_alone() -> None:
    with pytest.raises(KeyError), translated("fetch"):
        raise KeyError("a bug")


def test_no_stream_for_a_worker_subject_is_no_consumer() -> None:
    subject = "sie.work.default.l4.default.m.w-1"
    no_stream = translate(nats.js.errors.NoStreamResponseError(), "publish")
    no_stream.__cause__ = nats.js.errors.NoStreamResponseError()
    refused = for_worker(no_stream, subject)
    assert isinstance(refused, NoConsumerError) and refused.__cause__ is no_stream and subject in str(refused)
    full = BackpressureError("the stream is full")
    assert for_worker(full, subject) is full
