"""`sie dlq …` through the CLI against a real `sie run --role gateway` process on a real nats-server, with
SIE_ADMIN_TOKEN set: work NAKed until max_deliver shows up in `list`, `show` prints it, `replay` queues it again,
`purge` asks first. Exit codes: 0 ok, 1 refused by the gateway (its message printed), 2 usage or connection."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from launcher import NatsServer, RoleProcess, free_port
from sie.catalog.names import work_subject
from sie.cli.main import app
from sie.settings import StreamSettings
from sie.settings.messaging import NatsSettings
from sie.transport.base import Lane, LaneConsumer
from sie.transport.nats import NatsTransport
from sie.wire.queue import WorkItem
from support.polling import eventually

MODEL = "BAAI/bge-m3"
TOKEN = "s3cret"
MAX_DELIVER = 2
LONG_WAIT_S = 15.0
runner = CliRunner()


@pytest.fixture(scope="module")
def gateway_url(nats_server: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("cli-dlq")
    port = free_port()
    env = {"SIE_NATS_URL": nats_server.url, "SIE_ADMIN_TOKEN": TOKEN}
    process = RoleProcess("gateway", ["--host", "127.0.0.1", "--port", str(port)], env, root / "gateway.log")
    url = f"http://127.0.0.1:{port}"
    try:
        process.wait_http_ready(f"{url}/readyz")
        process.wait_gateway_routing(url)  # connected to NATS: the dead-letter stream is reachable
        yield url
    finally:
        process.stop()


@pytest.fixture
def no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIE_ADMIN_TOKEN", raising=False)


@pytest.fixture
async def sidecar(nats_server: NatsServer) -> AsyncIterator[NatsTransport]:
    """A lane consumer's transport that NAKs what it is given."""
    settings = StreamSettings(max_deliver=MAX_DELIVER, ack_wait_s=5.0)
    async with NatsTransport(NatsSettings(url=nats_server.url), settings) as transport:
        yield transport


async def sie(*args: str, stdin: str | None = None) -> Result:
    """Run the CLI off the event loop (the test's NATS connection lives on it), with a wide terminal."""
    return await asyncio.to_thread(runner.invoke, app, ["dlq", *args], input=stdin, env={"COLUMNS": "200"})


def _item(lane: Lane) -> WorkItem:
    request_id = f"cli-{uuid.uuid4().hex[:10]}"
    return WorkItem(
        work_item_id=f"{request_id}.0", request_id=request_id, item_index=0, total_items=1, operation="encode",
        model_id=MODEL, profile_id="default", pool_name=lane.pool, machine_profile=lane.machine_profile,
        router_id="gw-cli", reply_subject=f"_INBOX.gw-cli.{request_id}", timestamp=time.time(), item={"text": "bad"},
    )  # fmt: skip


async def _dead_letter(sidecar: NatsTransport, url: str) -> tuple[WorkItem, dict[str, Any], LaneConsumer]:
    """Queue one item, NAK it on every delivery, and pull until the gateway lists its dead letter."""
    lane = Lane(pool=f"c{uuid.uuid4().hex[:10]}", machine_profile="l4", bundle="default")
    consumer = await sidecar.consumer(lane)
    item = _item(lane)
    await sidecar.publish_work(work_subject(lane.pool, lane.machine_profile, lane.bundle, MODEL), item)
    for _ in range(MAX_DELIVER):
        (delivery,) = await consumer.fetch(1, LONG_WAIT_S)
        await delivery.nak()
    found: list[dict[str, Any]] = []

    async def listed() -> bool:
        assert await consumer.fetch(1, 0.1) == []  # JetStream advises once a pull finds the item spent
        result = await sie("list", "--json", "--limit", "1000", "--url", url, "--token", TOKEN)
        assert result.exit_code == 0, result.output
        letters = json.loads(result.stdout)["dead_letters"]
        found[:] = [entry for entry in letters if entry["request_id"] == item.request_id]
        return bool(found)

    await eventually(listed, timeout_s=LONG_WAIT_S, interval_s=0, what="the dead letter in `sie dlq list`")
    return item, found[0], consumer


async def test_list_show_replay_and_purge(gateway_url: str, sidecar: NatsTransport, no_token_in_env: None) -> None:
    item, letter, consumer = await _dead_letter(sidecar, gateway_url)
    assert (letter["model"], letter["deliveries"]) == (MODEL, MAX_DELIVER)

    table = await sie("list", "--url", gateway_url, "--token", TOKEN)
    assert table.exit_code == 0, table.output
    assert item.request_id in table.stdout and "dead letters" in table.stdout

    shown = await sie("show", str(letter["id"]), "--url", gateway_url, "--token", TOKEN)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["item"]["item"] == {"text": "bad"}

    replayed = await sie("replay", str(letter["id"]), "--url", gateway_url, "--token", TOKEN)
    assert replayed.exit_code == 0, replayed.output
    (again,) = await consumer.fetch(1, LONG_WAIT_S)
    assert again.item.request_id == json.loads(replayed.stdout)["request_id"] == f"{item.request_id}-dlq{letter['id']}"
    await again.ack()
    gone = await sie("show", str(letter["id"]), "--url", gateway_url, "--token", TOKEN)
    assert gone.exit_code == 1 and f"404 No dead letter {letter['id']}" in gone.stderr

    await _dead_letter(sidecar, gateway_url)
    declined = await sie("purge", "--url", gateway_url, "--token", TOKEN, stdin="n\n")
    assert declined.exit_code == 1 and "nothing purged" in declined.stdout
    purged = await sie("purge", "--yes", "--url", gateway_url, "--token", TOKEN)
    assert purged.exit_code == 0, purged.output
    assert json.loads(purged.stdout)["purged"] >= 1
    empty = await sie("list", "--url", gateway_url, "--token", TOKEN)
    assert empty.exit_code == 0 and "no dead letters" in empty.stdout


async def test_the_token_comes_from_the_option_or_sie_admin_token(
    gateway_url: str, monkeypatch: pytest.MonkeyPatch, no_token_in_env: None
) -> None:
    refused = await sie("list", "--url", gateway_url)
    assert refused.exit_code == 1 and "401" in refused.stderr and "admin token" in refused.stderr
    wrong = await sie("list", "--url", gateway_url, "--token", "nope")
    assert wrong.exit_code == 1 and "403" in wrong.stderr
    monkeypatch.setenv("SIE_ADMIN_TOKEN", TOKEN)
    assert (await sie("list", "--json", "--url", gateway_url)).exit_code == 0


async def test_usage_and_connection_problems_exit_2(no_token_in_env: None) -> None:
    assert (await sie("show", "seven", "--url", "http://127.0.0.1:9")).exit_code == 2
    unreachable = await sie("list", "--url", f"http://127.0.0.1:{free_port()}")
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.stderr
