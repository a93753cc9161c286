"""Offloaded work-item payloads (contracts Part B §4.1, seed 000 §16.2): what a gateway moves out of a WorkItem
into the payload store, the key it is stored under, and how a sidecar puts it back. Pure; the store is
`sie.stores.payload_store`, the decisions are the gateway's and the sidecar's.

An encode or extract item's `item` map is stored under `{request_id}_{index}.bin` and named by `payload_ref`; a
score item's query and candidates are stored together as `{"query", "items"}` under `{request_id}_score.bin` and
named by `query_payload_ref`. A generate item's prompt or chat messages (ours: the public contract offloads only the
three above) are stored as `{"prompt", "messages"}` under `{request_id}_{index}.bin`, named by `payload_ref`, its
other generation settings left in the item. The stored bytes are the msgpack of exactly what was removed.
"""

from __future__ import annotations

from typing import Any

import attrs

from sie.wire.codec import packb, unpackb
from sie.wire.errors import DecodeError
from sie.wire.queue import OPERATION_GENERATE, OPERATION_SCORE, GenerateParams, WorkItem


def payload_key(item: WorkItem) -> str:
    """The exact store key of one work item's payload: `{request_id}_{index}.bin`, `{request_id}_score.bin`."""
    if item.operation == OPERATION_SCORE:
        return f"{item.request_id}_score.bin"
    return f"{item.request_id}_{item.item_index}.bin"


def inline_payload(item: WorkItem) -> Any:
    """What offloading would move out of `item` (plain data, not yet packed)."""
    if item.operation == OPERATION_SCORE:
        return {"query": item.query_item, "items": item.score_items}
    if item.operation == OPERATION_GENERATE:
        params = item.generate or GenerateParams()
        return {"prompt": params.prompt, "messages": params.messages}
    return item.item


def packed_payload(item: WorkItem) -> bytes:
    """The bytes an offloaded payload is stored as."""
    return packb(inline_payload(item))


def offloaded(item: WorkItem, key: str) -> WorkItem:
    """`item` without its payload, naming the stored payload by `key` instead."""
    if item.operation == OPERATION_SCORE:
        return attrs.evolve(item, query_item=None, score_items=None, query_payload_ref=key)
    if item.operation == OPERATION_GENERATE and item.generate is not None:
        return attrs.evolve(item, generate=attrs.evolve(item.generate, prompt=None, messages=None), payload_ref=key)
    return attrs.evolve(item, item=None, payload_ref=key)


def payload_ref(item: WorkItem) -> str | None:
    """The key of the item's offloaded payload, or None when it travels inline."""
    return item.query_payload_ref if item.operation == OPERATION_SCORE else item.payload_ref


def restored(item: WorkItem, data: bytes) -> WorkItem:
    """`item` with the payload read back from the store inlined again; DecodeError when the bytes are not the
    payload shape its operation stores."""
    payload = unpackb(data)
    if item.operation == OPERATION_SCORE:
        if not isinstance(payload, dict) or not isinstance(payload.get("query"), dict):
            raise DecodeError("an offloaded score payload is a map with a `query` map")
        candidates = payload.get("items")
        if not isinstance(candidates, list) or not all(isinstance(entry, dict) for entry in candidates):
            raise DecodeError("an offloaded score payload lists its `items` as maps")
        return attrs.evolve(item, query_item=payload["query"], score_items=candidates, query_payload_ref=None)
    if not isinstance(payload, dict):
        raise DecodeError("an offloaded item payload is a map")
    if item.operation == OPERATION_GENERATE:
        return _restored_prompt(item, payload)
    return attrs.evolve(item, item=payload, payload_ref=None)


def _restored_prompt(item: WorkItem, payload: dict[str, Any]) -> WorkItem:
    prompt, messages = payload.get("prompt"), payload.get("messages")
    if item.generate is None or not isinstance(prompt, str | None) or not isinstance(messages, list | None):
        raise DecodeError("an offloaded generate payload is a map of its `prompt` string or `messages` list")
    if messages is not None and not all(isinstance(message, dict) for message in messages):
        raise DecodeError("an offloaded generate payload lists its `messages` as maps")
    generate = attrs.evolve(item.generate, prompt=prompt, messages=messages)
    return attrs.evolve(item, generate=generate, payload_ref=None)
