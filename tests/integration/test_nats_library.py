"""What nats-py 2.16 and nats-server 2.15.1 do that the NATS transport relies on or works around, pinned so an
upgrade that changes it fails here first (STYLE habit 1: a claim about a library's behaviour needs a test)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import api


def _name() -> str:
    return f"LIB_{uuid.uuid4().hex[:10]}"


async def test_publish_async_never_completes_an_error_ack(nats_client: Client) -> None:
    # acks.py: nats-py's reply handler raises APIError.from_error instead of setting it on the future.
    name = _name()
    js = nats_client.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"], max_msgs=1, discard=api.DiscardPolicy.NEW)
    await js.publish(f"{name}.a", b"1")
    with pytest.raises(nats.js.errors.APIError) as caught:
        await js.publish(f"{name}.a", b"2")
    assert caught.value.err_code == 10077
    future = await js.publish_async(f"{name}.a", b"3")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(future), 0.5)
    future.cancel()


async def test_a_no_wait_pull_with_expires_ends_after_the_first_messages(nats_client: Client) -> None:
    # consumer.py: such a request waits for the first message, hands over what is there, then ends with 404.
    name = _name()
    js = nats_client.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"], retention=api.RetentionPolicy.WORK_QUEUE)
    await js.add_consumer(name, api.ConsumerConfig(durable_name="c", name="c", ack_policy=api.AckPolicy.EXPLICIT))
    inbox, received = nats_client.new_inbox(), asyncio.Queue[Any]()

    async def on_message(msg: Any) -> None:
        received.put_nowait((msg.headers or {}).get("Status") or msg.data)

    await nats_client.subscribe(f"{inbox}.*", cb=on_message)
    request = json.dumps({"batch": 5, "expires": 2_000_000_000, "no_wait": True}).encode()
    await nats_client.publish(f"$JS.API.CONSUMER.MSG.NEXT.{name}.c", request, reply=f"{inbox}.1")
    await nats_client.flush()
    await asyncio.sleep(0.1)  # the request is waiting on the server
    await js.publish(f"{name}.a", b"first")
    assert await asyncio.wait_for(received.get(), 1.0) == b"first"
    assert await asyncio.wait_for(received.get(), 1.0) == "404"  # long before the 2 s expiry


async def test_a_max_delivered_message_stays_in_a_work_queue_stream(nats_client: Client) -> None:
    # transport/nats/dead_letters.py: why the dead letters delete what they capture from the work stream.
    name = _name()
    js = nats_client.jetstream()
    await js.add_stream(name=name, subjects=[f"{name}.>"], retention=api.RetentionPolicy.WORK_QUEUE)
    await js.publish(f"{name}.a", b"poison")
    subscription = await js.pull_subscribe(f"{name}.a", durable="c", stream=name,
                                           config=api.ConsumerConfig(max_deliver=1, ack_wait=5.0))  # fmt: skip
    (msg,) = await subscription.fetch(1, timeout=1.0)
    await msg.nak()
    with pytest.raises(nats.errors.TimeoutError):
        await subscription.fetch(1, timeout=0.3)
    assert (await js.stream_info(name)).state.messages == 1


async def test_a_single_server_refuses_more_than_one_replica(nats_client: Client) -> None:
    # streams.py: SIE_STREAM_REPLICAS > 1 fails on a single server (err_code 10074), unlike seed 000 §8.2 says.
    with pytest.raises(nats.js.errors.APIError) as caught:
        await nats_client.jetstream().add_stream(name=_name(), subjects=[f"{_name()}.>"], num_replicas=3)
    assert caught.value.err_code == 10074
