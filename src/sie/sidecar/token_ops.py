"""Tokenize and decode work items (TEI's `/tokenize` and `/decode`), answered by the sidecar with the model's own
tokenizer, never sent to a worker. A tokenize item reads `item.text` with the model's query or document template
applied as for an encode (`is_query`), cut at the model's length, and answers `{"tokens": [{id, text, special,
start, stop}]}`; a decode item reads `item.ids` and answers `{"text": ...}`. Options: `add_special_tokens` (tokenize)
and `skip_special_tokens` (decode), both default true. Pure: the preparation stage runs it in its executor.
"""

from __future__ import annotations

from typing import Final

from sie.sidecar.results import error_result
from sie.tokenization import TextTokenizer, prepare_text
from sie.wire import codes
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.payload import ResultBody
from sie.wire.queue import OPERATION_DECODE, OPERATION_TOKENIZE, UnitCounts, WorkItem, WorkResult

TOKEN_OPERATIONS: Final = frozenset({OPERATION_TOKENIZE, OPERATION_DECODE})


class _Refused(Exception):
    """The item cannot be answered as sent: INVALID_INPUT with this message."""


def token_result(
    item: WorkItem, tokenizer: TextTokenizer | None, descriptor: ModelDescriptor, worker_id: str
) -> WorkResult:
    """The answer to one tokenize or decode item."""
    try:
        if tokenizer is None:
            raise _Refused(f"Model '{item.model_id}' has no text tokenizer to tokenize or decode with")
        if item.operation == OPERATION_TOKENIZE:
            body, units = _tokenize(item, tokenizer, descriptor)
        else:
            body, units = _decode(item, tokenizer)
    except _Refused as refused:
        return error_result(item, codes.INVALID_INPUT, str(refused), worker_id)
    return WorkResult(
        work_item_id=item.work_item_id,
        request_id=item.request_id,
        item_index=item.item_index,
        success=True,
        result_msgpack=ResultBody.of(body),
        worker_id=worker_id,
        units=UnitCounts(input_tokens=units),
    )


def _flag(item: WorkItem, name: str) -> bool:
    value = (item.options or {}).get(name, True)
    if not isinstance(value, bool):
        raise _Refused(f"Option '{name}' must be true or false, got {value!r}")
    return value


def _tokenize(item: WorkItem, tokenizer: TextTokenizer, descriptor: ModelDescriptor) -> tuple[dict, int]:
    text = (item.item or {}).get("text")
    if not isinstance(text, str):
        raise _Refused(f"Item {item.item_index} has no text to tokenize")
    options = item.options or {}
    prepared = prepare_text(
        text,
        is_query=item.is_query,
        instruction=item.instruction,
        query_template=options.get("query_template", descriptor.default_query_template),
        doc_template=options.get("doc_template", descriptor.default_doc_template),
    )
    tokens = tokenizer.tokens(prepared, add_special_tokens=_flag(item, "add_special_tokens"))
    return {"tokens": tokens}, len(tokens)


def _decode(item: WorkItem, tokenizer: TextTokenizer) -> tuple[dict, int]:
    ids = (item.item or {}).get("ids")
    if not isinstance(ids, list) or not all(type(token_id) is int for token_id in ids):
        raise _Refused(f"Item {item.item_index}: 'ids' must be a list of token ids (integers)")
    try:
        text = tokenizer.decode(ids, skip_special_tokens=_flag(item, "skip_special_tokens"))
    except ValueError as exc:
        raise _Refused(f"Item {item.item_index}: {exc}") from None
    return {"text": text}, len(ids)
