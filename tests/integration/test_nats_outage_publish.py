"""Publishing work while the broker connection is down fails fast and retryably (issue 33): a publish made while
the client reconnects raises TransportUnavailable at once, and one whose ACK was still owed when the connection
dropped fails as the drop is noticed, not at the 6 s ACK deadline. The gateway turns both into a 503
QUEUE_UNAVAILABLE with Retry-After, which the SDK retries. Real nats-server, stopped and killed under the client."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from launcher import NatsServer, holds_within
from sie.catalog.names import work_subject
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Lane, TransportUnavailable
from sie.transport.nats import NatsTransport
from sie.transport.nats.acks import ACK_TIMEOUT_S
from sie.wire.queue import WorkItem

LANE = Lane("outage", "default", "default")
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def work_item(index: int) -> WorkItem:
    return WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation="encode",
        model_id=MODEL, profile_id="default", pool_name=LANE.pool, machine_profile=LANE.machine_profile,
        reply_subject=f"_INBOX.gw.r{index}", router_id="gw", timestamp=time.time(),
        item={"text": "x"},
    )  # fmt: skip


SUBJECT = work_subject(LANE.pool, LANE.machine_profile, LANE.bundle, MODEL)


def stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


async def test_a_publish_while_reconnecting_fails_at_once(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    try:
        async with NatsTransport(NatsSettings(url=server.url), StreamSettings()) as transport:
            await transport.publish_work(SUBJECT, work_item(0))  # the stream exists and takes work
            await asyncio.to_thread(server.stop)
            started = time.monotonic()
            # A publish sent just before the client read the EOF is failed by the drop itself, as fast and as retryable.
            with pytest.raises(TransportUnavailable, match="reconnecting|not connected|closed|dropped before the ACK"):
                async with asyncio.timeout(ACK_TIMEOUT_S):
                    while True:  # until the client has noticed the drop (it reads EOF within milliseconds)
                        await transport.publish_work(SUBJECT, work_item(1))
                        await asyncio.sleep(0.01)
            assert time.monotonic() - started < ACK_TIMEOUT_S / 3
    finally:
        server.stop()


async def test_a_publish_whose_ack_was_owed_when_the_connection_dropped_fails_at_the_drop(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")
    try:
        async with NatsTransport(NatsSettings(url=server.url), StreamSettings()) as transport:
            await transport.publish_work(SUBJECT, work_item(0))
            os.kill(server.process.pid, signal.SIGSTOP)  # the server takes the publish but answers nothing
            assert holds_within(lambda: stopped(server.process.pid), 5.0)  # stopped before anything is sent
            stored = await transport.submit_work_batch(SUBJECT, [work_item(1)])
            await asyncio.sleep(0.2)
            assert not stored.done()  # the ACK is owed
            started = time.monotonic()
            await asyncio.to_thread(server.kill)  # the connection drops: the kernel closes the socket
            with pytest.raises(TransportUnavailable, match="dropped before the ACK"):
                await stored
            assert time.monotonic() - started < ACK_TIMEOUT_S / 3
    finally:
        server.stop()
