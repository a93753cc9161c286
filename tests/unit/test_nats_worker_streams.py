"""A worker's direct-dispatch stream as read from the JetStream API's JSON (nats-py drops `state.last_ts`): when it
was last active, its max_age in seconds, other streams left out. The listing and the conditional delete on a real
nats-server are tests/integration/test_worker_stream_sweep.py."""

from __future__ import annotations

import datetime
from typing import Any

from sie.transport.nats.worker_streams import worker_stream

CREATED = "2026-12-06T02:30:44.826753189Z"
NEVER = "0001-01-01T00:00:00Z"  # Go's zero time: what the broker sends for "no message yet"


def _epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text).timestamp()


def _info(name: str = "WORK_WORKER_pod-1", last_ts: str = NEVER, **state: Any) -> dict[str, Any]:
    return {
        "config": {"name": name, "subjects": ["sie.work.p.l4.default.*.pod-1"], "max_age": 1_800_000_000_000},
        "created": CREATED,
        "state": {"messages": 0, "first_seq": 0, "last_seq": 0, "last_ts": last_ts, **state},
        "ts": "2026-12-06T03:00:00Z",
    }


def test_a_stream_that_never_had_a_message_was_last_active_at_its_creation() -> None:
    stream = worker_stream(_info())
    assert stream is not None
    assert (stream.name, stream.messages, stream.max_age_s, stream.last_seq) == ("WORK_WORKER_pod-1", 0, 1800.0, 0)
    assert stream.created == CREATED
    assert abs(stream.active_at - _epoch("2026-12-06T02:30:44.826753+00:00")) < 1e-3


def test_a_stream_whose_messages_are_gone_was_last_active_at_its_last_message() -> None:
    stream = worker_stream(_info(last_ts="2026-12-06T02:40:00.5Z", messages=2, last_seq=7))
    assert stream is not None
    assert (stream.messages, stream.last_seq) == (2, 7)
    assert abs(stream.active_at - _epoch("2026-12-06T02:40:00.5+00:00")) < 1e-3


def test_other_streams_are_not_worker_streams() -> None:
    assert worker_stream(_info(name="WORK_POOL_default")) is None
    assert worker_stream(_info(name="DEAD_LETTERS")) is None
    assert worker_stream({}) is None


def test_a_stream_whose_times_cannot_be_read_looks_active_forever() -> None:
    info = _info(last_ts="yesterday")
    info["created"] = "not a time"
    stream = worker_stream(info)
    assert stream is not None
    assert stream.active_at == float("inf")
