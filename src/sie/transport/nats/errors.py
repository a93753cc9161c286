"""The one place nats-py exceptions become the transport's own (STYLE habit 6): most specific match first,
always chained with `from`. Nothing outside `sie.transport.nats` ever sees a nats-py exception.

    nats-py                                              sie.transport.base
    APIError err_code 10077 (maximum messages exceeded)  BackpressureError
    TooManyStalledMsgsError (publish_async bound full)   BackpressureError
    ServiceUnavailableError (JetStream not answering)    TransportUnavailable
    connection closed / draining / reconnecting / stale  TransportUnavailable
    timeouts (no answer from the broker in time)         TransportUnavailable
    NoStreamResponseError / NoRespondersError            TransportError (no stream captures the subject)
      ... on a worker direct-dispatch subject            NoConsumerError (the worker has no stream: `for_worker`)
    any other APIError or nats error                     TransportError
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import nats.errors
import nats.js.errors

from sie.transport.base import BackpressureError, NoConsumerError, TransportError, TransportUnavailable

# JetStream error codes that mean "the stream is full": maximum messages (10077), maximum bytes (10078).
BACKPRESSURE_ERR_CODES = frozenset({10077, 10078})

_UNAVAILABLE = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionDrainingError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.NoServersError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,  # asyncio.TimeoutError; nats.errors.TimeoutError and FlushTimeoutError derive from it
    OSError,
)
_NO_STREAM = (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError)


def translate(exc: BaseException, action: str) -> TransportError:
    """Our exception for a nats-py one raised while doing `action` (a short verb phrase for the message)."""
    if isinstance(exc, nats.js.errors.APIError) and exc.err_code in BACKPRESSURE_ERR_CODES:
        return BackpressureError(f"{action}: the stream is full ({exc.description}, err_code {exc.err_code})")
    if isinstance(exc, nats.js.errors.TooManyStalledMsgsError):
        return BackpressureError(f"{action}: too many JetStream publishes await their ACK")
    if isinstance(exc, _UNAVAILABLE):
        return TransportUnavailable(f"{action}: NATS is unavailable ({_describe(exc)})")
    if isinstance(exc, _NO_STREAM):
        return TransportError(f"{action}: no stream captures the subject ({_describe(exc)})")
    return TransportError(f"{action}: {_describe(exc)}")


def for_worker(error: TransportError, subject: str) -> TransportError:
    """`error` from a publish on worker direct-dispatch `subject`, where "no stream captures it" means the worker
    has no direct-dispatch stream: NoConsumerError (chained to `error`), so the gateway publishes on the lane."""
    if not isinstance(error.__cause__, _NO_STREAM):
        return error
    refused = NoConsumerError(f"publish to {subject}: the worker has no direct-dispatch stream")
    refused.__cause__ = error
    return refused


@contextlib.contextmanager
def translated(action: str) -> Iterator[None]:
    """Re-raise nats-py (and socket/timeout) failures inside the block as TransportError subclasses."""
    try:
        yield
    except TransportError:
        raise
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        raise translate(exc, action) from exc


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text and type(exc).__name__ not in text else text or type(exc).__name__
