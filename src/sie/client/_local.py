"""LocalIngestClient: sends work items to a sidecar's local-ingest socket (SIE_LOCAL_INGEST_SOCKET) and awaits
their results, for a producer on the same machine that should not pay for HTTP. The frames (`[u32 BE length]
[msgpack map]`: hello, submit, result, error) are written here from their description in docs/using.md "Local ingest",
since the client imports only `sie.wire`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final, Self

from sie.client.errors import RequestError, ServerError, SIEConnectionError, SIETimeoutError
from sie.wire import DecodeError, packb, structure, unpackb, unstructure
from sie.wire.queue import WorkItem, WorkResult

_HEADER: Final = struct.Struct("!I")
PROTOCOL_VERSION: Final = 1
# The hello is a few hundred bytes; anything longer is not a local-ingest server.
_HELLO_MAX_BYTES: Final = 64 * 1024
# Codes of a refused submit that sending the same items again cannot fix.
_REQUEST_CODES: Final = frozenset({"INVALID_INPUT", "PAYLOAD_TOO_LARGE"})


class _Submit:
    """One submit awaiting its results, one slot per item."""

    __slots__ = ("future", "missing", "results")

    def __init__(self, count: int) -> None:
        self.results: list[WorkResult | None] = [None] * count
        self.missing = count
        self.future: asyncio.Future[list[WorkResult]] = asyncio.get_running_loop().create_future()


class LocalIngestClient:
    """An async client of one sidecar's local-ingest socket; many submits may be in flight on it at once.

    Usage:

    ```python
    >>> async with LocalIngestClient("/run/sie/ingest.sock") as client:
    ...     results = await client.encode("sentence-transformers/all-MiniLM-L6-v2", ["Hello world"])
    >>> results[0].result_msgpack.value["dense"]["values"].shape
    (384,)
    ```

    Parameters:

    * **path** - the socket, as the sidecar's SIE_LOCAL_INGEST_SOCKET names it.
    * **timeout_s** - *(optional)* the limit on connecting and reading the server's hello.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 10.0) -> None:
        self.path = os.fspath(path)
        self.timeout_s = timeout_s
        self.hello: dict[str, Any] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._write_lock: asyncio.Lock | None = None
        self._pending: dict[str, _Submit] = {}
        self._ids = itertools.count(1)
        self._closed_reason: str | None = None

    async def __aenter__(self) -> Self:
        try:
            async with asyncio.timeout(self.timeout_s):
                self._reader, self._writer = await asyncio.open_unix_connection(self.path)
                self.hello = self._read_hello(await _read_frame(self._reader, _HELLO_MAX_BYTES))
        except TimeoutError as exc:
            await self.aclose()
            raise SIETimeoutError(
                f"no hello from the local-ingest socket {self.path} within {self.timeout_s} s"
            ) from exc
        except (OSError, asyncio.IncompleteReadError, DecodeError) as exc:
            await self.aclose()
            raise SIEConnectionError(f"cannot use the local-ingest socket {self.path}: {exc}") from exc
        except BaseException:
            await self.aclose()
            raise
        self._write_lock = asyncio.Lock()
        self._reading = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; submits still waiting fail with SIEConnectionError."""
        self._fail_pending("the client closed the connection")
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = None

    async def submit(self, items: Sequence[WorkItem]) -> list[WorkResult]:
        """Send `items` as one submit and return their results in item order. A refused submit raises RequestError
        (INVALID_INPUT: malformed, another lane, a generation; PAYLOAD_TOO_LARGE) or ServerError (QUEUE_FULL: the
        connection has too many items in flight; send again once results arrive); a connection that closes raises
        SIEConnectionError."""
        if self._writer is None or self._write_lock is None or self._closed_reason is not None:
            raise SIEConnectionError(f"the local-ingest connection is closed: {self._closed_reason or 'not open'}")
        submit_id = str(next(self._ids))
        body = packb({"type": "submit", "id": submit_id, "items": [unstructure(item) for item in items]})
        limit = self.hello.get("max_frame_bytes")
        if isinstance(limit, int) and len(body) > limit:
            raise RequestError(f"the submit is {len(body)} bytes, over the socket's {limit}-byte frames",
                               "PAYLOAD_TOO_LARGE")  # fmt: skip
        pending = self._pending[submit_id] = _Submit(len(items))
        try:
            async with self._write_lock:
                self._writer.write(_HEADER.pack(len(body)) + body)
                await self._writer.drain()
            return await pending.future
        except OSError as exc:
            raise SIEConnectionError(f"the local-ingest connection broke: {exc}") from exc
        finally:
            self._pending.pop(submit_id, None)

    async def encode(  # noqa: PLR0913 - the knobs of an encode work item, each with a default
        self,
        model: str,
        texts: Sequence[str],
        *,
        output_types: Sequence[str] = ("dense",),
        profile_id: str = "default",
        is_query: bool = False,
        options: dict[str, Any] | None = None,
    ) -> list[WorkResult]:
        """Encode `texts` with `model` on the socket's lane: one encode work item per text, results in text order."""
        request_id = uuid.uuid4().hex
        now = time.time()
        items = [
            WorkItem(
                work_item_id=f"{request_id}.{index}",
                request_id=request_id,
                item_index=index,
                total_items=len(texts),
                operation="encode",
                model_id=model,
                profile_id=profile_id,
                pool_name=self.hello.get("pool", ""),
                machine_profile=self.hello.get("machine_profile", ""),
                router_id="",
                reply_subject="",
                timestamp=now,
                item={"text": text},
                output_types=list(output_types),
                is_query=is_query,
                options=options,
            )  # fmt: skip
            for index, text in enumerate(texts)
        ]
        return await self.submit(items)

    def _read_hello(self, body: bytes | None) -> dict[str, Any]:
        if body is None:
            raise SIEConnectionError(f"the local-ingest socket {self.path} closed before its hello")
        message = unpackb(body)
        if type(message) is not dict:
            raise SIEConnectionError(f"the local-ingest socket {self.path} sent no hello")
        if message.get("type") == "error":
            raise _refusal(str(message.get("code")), str(message.get("message")))
        if message.get("type") != "hello" or message.get("version") != PROTOCOL_VERSION:
            raise SIEConnectionError(f"the local-ingest socket {self.path} speaks another protocol: {message!r:.200}")
        return message

    async def _read_loop(self) -> None:
        reason = "the server closed the connection"
        limit = self.hello.get("max_frame_bytes")
        try:
            while (body := await _read_frame(self._reader, limit if isinstance(limit, int) else None)) is not None:
                reason = self._on_frame(unpackb(body)) or reason
        except (OSError, asyncio.IncompleteReadError, DecodeError, ValueError) as exc:
            reason = f"the connection broke: {exc}"
        finally:
            self._fail_pending(reason)

    def _on_frame(self, message: Any) -> str | None:
        """Hand one frame to its submit; returns the reason of an error about the whole connection."""
        if type(message) is not dict:
            return None
        kind, submit_id = message.get("type"), message.get("id")
        pending = self._pending.get(submit_id) if isinstance(submit_id, str) else None
        if kind == "error":
            code, text = str(message.get("code")), str(message.get("message"))
            if pending is None:
                return f"{code}: {text}"
            if not pending.future.done():
                pending.future.set_exception(_refusal(code, text))
        elif kind == "result" and pending is not None:
            self._on_result(pending, message)
        return None

    def _on_result(self, pending: _Submit, message: dict[str, Any]) -> None:
        index = message.get("index")
        if type(index) is not int or not 0 <= index < len(pending.results) or pending.results[index] is not None:
            return
        try:
            pending.results[index] = structure(message.get("result"), WorkResult)
        except DecodeError as exc:
            if not pending.future.done():
                pending.future.set_exception(RequestError(f"a result breaks the wire contract: {exc}"))
            return
        pending.missing -= 1
        if pending.missing == 0 and not pending.future.done():
            pending.future.set_result([result for result in pending.results if result is not None])

    def _fail_pending(self, reason: str) -> None:
        self._closed_reason = self._closed_reason or reason
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(SIEConnectionError(f"the local-ingest connection closed: {reason}"))


def _refusal(code: str, message: str) -> RequestError | ServerError:
    if code in _REQUEST_CODES:
        return RequestError(message, code)
    return ServerError(message, code)


async def _read_frame(reader: asyncio.StreamReader | None, limit: int | None) -> bytes | None:
    """One frame's body; None at a clean end of the stream; ValueError for a frame over `limit`."""
    if reader is None:
        return None
    try:
        header = await reader.readexactly(_HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    (length,) = _HEADER.unpack(header)
    if limit is not None and length > limit:
        raise ValueError(f"a frame of {length} bytes, over the socket's {limit}")
    return await reader.readexactly(length)
