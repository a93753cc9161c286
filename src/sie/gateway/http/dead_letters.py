"""The operator's HTTP surface of the dead-letter queue (gateway/dead_letters.py), JSON in and out:

    GET    /v1/dlq?after=ID&limit=N   letters with ids above `after` (default 0), oldest first, at most N (100)
    GET    /v1/dlq/{id}               one letter, with its work item
    POST   /v1/dlq/{id}/replay        send its work item again (fresh request id and deadline; results discarded)
    DELETE /v1/dlq/{id}               drop one letter
    POST   /v1/dlq/purge              drop every letter

They are admin routes: the gateway's auth middleware (gateway/http/auth.py) requires SIE_ADMIN_TOKEN on every one of
them, since letters hold users' inputs. Errors go through replies.py.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sie.catalog.names import dead_letter_subject
from sie.gateway.dead_letters import DeadLetterQueue
from sie.gateway.errors import InvalidRequestError
from sie.gateway.http.edge import endpoint, json_response
from sie.gateway.http.replies import Surface
from sie.transport.base import DeadLetter
from sie.wire import unstructure

DEFAULT_LIMIT = 100


def letter_summary(letter: DeadLetter) -> dict[str, Any]:
    """What a listing shows of one letter."""
    item = letter.item
    return {
        "id": letter.letter_id,
        "model": item.model_id if item is not None else None,
        "request_id": item.request_id if item is not None else None,
        "work_item_id": item.work_item_id if item is not None else None,
        "operation": item.operation if item is not None else None,
        "subject": letter.subject,
        "dead_letter_subject": dead_letter_subject(letter.subject) if letter.subject.count(".") >= 5 else None,
        "stream": letter.stream,
        "stream_seq": letter.stream_seq,
        "consumer": letter.consumer,
        "deliveries": letter.deliveries,
        "dead_at": letter.dead_at,
        "published_at": letter.published_at,
        "replayable": item is not None,
    }


def letter_document(letter: DeadLetter) -> dict[str, Any]:
    """One letter in full: its summary and its work item (binary values shown by their size)."""
    item = unstructure(letter.item) if letter.item is not None else None
    return {**letter_summary(letter), "item": _shown(item)}


def _shown(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"binary_bytes": len(value)}
    if isinstance(value, dict):
        return {key: _shown(entry) for key, entry in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(entry) for entry in value]
    return value


class DeadLetterHandlers:
    """Thin handlers: parse the path and query, call the queue, render JSON."""

    def __init__(self, queue: DeadLetterQueue) -> None:
        self._queue = queue

    @endpoint(Surface.NATIVE)
    async def list_letters(self, request: Request) -> Response:
        after = _whole(request.query_params.get("after"), "after", 0)
        limit = _whole(request.query_params.get("limit"), "limit", DEFAULT_LIMIT)
        letters = await self._queue.letters(after, limit)
        next_after = letters[-1].letter_id if len(letters) == limit else None
        return json_response({"dead_letters": [letter_summary(letter) for letter in letters], "next_after": next_after})

    @endpoint(Surface.NATIVE)
    async def show(self, request: Request) -> Response:
        return json_response(letter_document(await self._queue.letter(request.path_params["letter_id"])))

    @endpoint(Surface.NATIVE)
    async def replay(self, request: Request) -> Response:
        replayed = await self._queue.replay(request.path_params["letter_id"])
        item = replayed.item
        body = {"replayed": replayed.letter.letter_id, "subject": replayed.letter.subject}
        return json_response({**body, "request_id": item.request_id, "deadline": item.deadline})

    @endpoint(Surface.NATIVE)
    async def delete(self, request: Request) -> Response:
        letter_id = request.path_params["letter_id"]
        await self._queue.delete(letter_id)
        return json_response({"deleted": letter_id})

    @endpoint(Surface.NATIVE)
    async def purge(self, request: Request) -> Response:
        return json_response({"purged": await self._queue.purge()})


def _whole(text: str | None, name: str, default: int) -> int:
    if text is None or text == "":
        return default
    if not text.isdigit():
        raise InvalidRequestError(f"{name} must be a whole number, got {text!r}")
    return int(text)


def dead_letter_routes(queue: DeadLetterQueue | None) -> list[Route]:
    """The `/v1/dlq` routes over `queue`; none when the gateway keeps no dead letters."""
    if queue is None:
        return []
    handlers = DeadLetterHandlers(queue)
    return [
        Route("/v1/dlq", handlers.list_letters, methods=["GET"]),
        Route("/v1/dlq/purge", handlers.purge, methods=["POST"]),
        Route("/v1/dlq/{letter_id:int}", handlers.show, methods=["GET"]),
        Route("/v1/dlq/{letter_id:int}", handlers.delete, methods=["DELETE"]),
        Route("/v1/dlq/{letter_id:int}/replay", handlers.replay, methods=["POST"]),
    ]
