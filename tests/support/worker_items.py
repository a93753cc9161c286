"""Wire batch items for tests that call a loaded adapter directly (as the worker's runner does)."""

from __future__ import annotations

from typing import Any

from sie.wire.ipc_batch import EncodeBatchItem


def encode_items(texts: list[str], **fields: Any) -> list[EncodeBatchItem]:
    """One encode item per text, of one request; `fields` (is_query, options, output_types, ...) go to every one."""
    return [
        EncodeBatchItem(
            work_item_id=f"e.{index}", request_id="e", item_index=index, total_items=len(texts), timestamp=0.0,
            item={"text": text}, **fields,
        )
        for index, text in enumerate(texts)
    ]  # fmt: skip
