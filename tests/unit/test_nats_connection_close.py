"""Closing a NATS connection while nats-py reconnects: its close cancels the reconnecting task and can then raise
that task's CancelledError from its socket's close; that is not our cancellation and must not escape our close,
while a cancellation of our own task still does (tests/integration/test_nats_outage_publish.py runs the real case,
which shows it only now and then)."""

from __future__ import annotations

import asyncio

import pytest

from sie.transport.nats.connection import Connection, _Events


class ReconnectingClient:
    """nats-py's client as close finds it while reconnecting: not connected, not closed; its close raises the
    CancelledError of the socket wait (or waits, to be cancelled from outside)."""

    is_connected = False

    def __init__(self, hang: bool = False) -> None:
        self.is_closed = False
        self.hang = hang

    def jetstream(self, **_: object) -> None:  # the connection's JetStream contexts are not used here
        return None

    def jsm(self, **_: object) -> None:
        return None

    async def close(self) -> None:
        self.is_closed = True
        if self.hang:
            await asyncio.sleep(60)
        raise asyncio.CancelledError


async def test_a_cancelled_socket_close_inside_nats_py_does_not_escape() -> None:
    client = ReconnectingClient()
    connection = Connection(client, _Events())  # type: ignore[arg-type]
    await connection.close()
    assert connection.is_closed and client.is_closed


async def test_cancelling_the_closing_task_still_cancels_it() -> None:
    connection = Connection(ReconnectingClient(hang=True), _Events())  # type: ignore[arg-type]
    closing = asyncio.create_task(connection.close())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
