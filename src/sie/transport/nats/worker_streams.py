"""Workers' direct-dispatch streams `WORK_WORKER_{worker}` as a sweep sees them: listed with their state, and deleted
only while they are still as listed. nats-py's StreamState leaves out the state's `last_ts` (when the last message
was stored, kept after the message is gone), so these read the JetStream API's JSON themselves.

Control plane only, like `streams`; which streams may go is the gateway's decision.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any, Final

import nats.errors
import nats.js.errors
from nats.js import api

from sie.transport.base import WorkerStream
from sie.transport.nats.connection import API_TIMEOUT_S, Connection
from sie.transport.nats.errors import translated

WORKER_STREAM_PREFIX: Final = "WORK_WORKER_"  # as sie.catalog.names.work_worker_stream_name writes it
# The connection's JetStream contexts use the default API prefix (no domain), as the lane fetchers do.
_STREAM_LIST: Final = f"{api.DEFAULT_PREFIX}.STREAM.LIST"
_STREAM_INFO: Final = f"{api.DEFAULT_PREFIX}.STREAM.INFO."
# The server sends up to 256 streams a page: a bound on one listing, not a count a deployment comes near.
MAX_PAGES: Final = 100
# A stream whose times cannot be read looks active forever, so it is never swept.
_UNKNOWN_TIME: Final = float("inf")


def worker_stream(info: Mapping[str, Any]) -> WorkerStream | None:
    """The WorkerStream one stream info of the JetStream API (its JSON) describes; None for any other stream."""
    config, state = info.get("config") or {}, info.get("state") or {}
    name = config.get("name") or ""
    if not name.startswith(WORKER_STREAM_PREFIX):
        return None
    created = info.get("created") or ""
    last_message = _timestamp(state.get("last_ts"))
    active_at = last_message if last_message is not None else _timestamp(created)
    return WorkerStream(
        name=name,
        messages=int(state.get("messages") or 0),
        max_age_s=int(config.get("max_age") or 0) / 1e9,
        active_at=active_at if active_at is not None else _UNKNOWN_TIME,
        last_seq=int(state.get("last_seq") or 0),
        created=created,
    )


async def list_worker_streams(connection: Connection) -> list[WorkerStream]:
    """Every `WORK_WORKER_*` stream on the broker (all pages of the stream list)."""
    action = "list the workers' direct-dispatch streams"
    connection.check_connected(action)
    found: list[WorkerStream] = []
    offset = 0
    with translated(action):
        for _ in range(MAX_PAGES):
            page = await _api_request(connection, _STREAM_LIST, {"offset": offset})
            infos = page.get("streams") or []
            found += [stream for stream in map(worker_stream, infos) if stream is not None]
            offset += len(infos)
            if not infos or offset >= int(page.get("total") or 0):
                break
    return found


async def delete_worker_stream(connection: Connection, listed: WorkerStream) -> bool:
    """Delete `listed` if it is still empty, with no message stored since it was listed and not created again (a
    stream has no conditional delete: this narrows the race with a worker of the same name coming back to the time
    of one round trip). False when it is gone or changed."""
    action = f"delete stream {listed.name}"
    connection.check_connected(action)
    with translated(action):
        try:
            now = worker_stream(await _api_request(connection, _STREAM_INFO + listed.name))
            if now is None or now.messages or (now.last_seq, now.created) != (listed.last_seq, listed.created):
                return False
            return bool(await connection.jsm.delete_stream(listed.name))
        except nats.js.errors.NotFoundError:
            return False  # another gateway swept it first


async def _api_request(connection: Connection, subject: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One JetStream API request, its JSON answer; an error answer raises as nats-py would raise it."""
    payload = json.dumps(body).encode() if body is not None else b""
    try:
        reply = await connection.client.request(subject, payload, timeout=API_TIMEOUT_S)
    except nats.errors.NoRespondersError as exc:
        raise nats.js.errors.ServiceUnavailableError from exc  # JetStream is not answering (as nats-py says it)
    answer: dict[str, Any] = json.loads(reply.data)
    if "error" in answer:
        nats.js.errors.APIError.from_error(answer["error"])  # raises the class of the error's code
    return answer


def _timestamp(text: object) -> float | None:
    """Epoch seconds of an RFC 3339 time of the broker; None for none, Go's zero time (never) or an unreadable one."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.year <= 1:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.timestamp()
