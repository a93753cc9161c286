"""Wire batch items for tests that call a loaded adapter directly (as the worker's runner does)."""

from __future__ import annotations

from typing import Any

from sie.wire.ipc_batch import EncodeBatchItem, ExtractBatchItem


def encode_items(texts: list[str], **fields: Any) -> list[EncodeBatchItem]:
    """One encode item per text, of one request; `fields` (is_query, options, output_types, ...) go to every one."""
    return [
        EncodeBatchItem(
            work_item_id=f"e.{index}", request_id="e", item_index=index, total_items=len(texts), timestamp=0.0,
            item={"text": text}, **fields,
        )
        for index, text in enumerate(texts)
    ]  # fmt: skip


def extract_items(texts: list[str], labels: list[str] | list[list[str]], **options: Any) -> list[ExtractBatchItem]:
    """One extract item per text, of one request: every text with `labels`, or each with its own label list;
    `options` go to every one."""
    per_item = labels if labels and isinstance(labels[0], list) else [labels] * len(texts)
    return [
        ExtractBatchItem(
            work_item_id=f"x.{index}", request_id="x", item_index=index, total_items=len(texts), timestamp=0.0,
            item={"text": text}, labels=list(item_labels), options=options or None,
        )
        for index, (text, item_labels) in enumerate(zip(texts, per_item, strict=True))
    ]  # fmt: skip
