"""Exceptions of the IPC client and server; every socket, framing and chunking failure leaves `sie.ipc` as one of these.

IpcError                  base; `message` is the text a caller logs or forwards
├── IpcRemoteError        the worker answered `ok: false`; `message` is its error string, verbatim
├── IpcConnectionError    no connection, or it dropped with the call pending (the call may have run)
├── IpcTimeoutError       no answer within the call's timeout (also a TimeoutError)
└── IpcProtocolError      bytes that break the protocol: a bad frame, chunk or response body
"""

from __future__ import annotations


class IpcError(Exception):
    """Base of every IPC failure; the sidecar treats one on RunBatch as a transient backend failure."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class IpcRemoteError(IpcError):
    """The worker answered the call with an error response (contracts Part A §2.1 error strings)."""


class IpcConnectionError(IpcError):
    """The socket could not be reached, or closed while the call waited for its answer."""


class IpcTimeoutError(IpcError, TimeoutError):
    """The call's answer did not arrive within its timeout; the connection stays open."""


class IpcProtocolError(IpcError):
    """A frame over its limit, a response that is not msgpack, or a response chunk that fails verification."""
