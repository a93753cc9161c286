"""What the zero-shot adapters (GLiNER, GLiClass, NLI classification) share: the per-item refusal of work they cannot
run, before anything is tokenized; the gateway refuses the same first, this covers work that did not pass one."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, TypeVar

import attrs

from sie.catalog.options import labels_problem, structure_problem
from sie.tokenization import TextTokenizer, TokenizedWords
from sie.wire.ipc_batch import OP_EXTRACT
from sie.worker.adapters.base import Adapter, ItemResult, invalid
from sie.worker.adapters.encoder import item_text

# Labels one item may carry: the gateway's default SIE_GATEWAY_MAX_LABELS.
MAX_ITEM_LABELS: Final = 1000

Request = TypeVar("Request")
LabelSet = TypeVar("LabelSet", bound=Hashable)


def marked_prompt(labels: Sequence[str], marker: str, separator: str) -> list[str]:
    """The words a GLiNER-family prompt puts before the text: `marker label … marker label separator`."""
    words: list[str] = []
    for label in labels:
        words += [marker, label]
    return [*words, separator]


@attrs.frozen
class Prompt:
    """One label set's prompt words, their encoding, and the tokens they leave the text (at most 0: none)."""

    words: list[str]
    tokens: TokenizedWords
    room: int

    def refusal(self, labels: int, what: str = "labels") -> ItemResult | None:
        """INVALID_INPUT when the prompt leaves the text no token, else None."""
        if self.room >= 1 and not self.tokens.truncated:
            return None
        return invalid(f"The {labels} {what} take {len(self.tokens)} of the model's {len(self.tokens) + self.room} "
                       "tokens and leave none for the text: send fewer or shorter ones")  # fmt: skip


def prompts_by_label_set(
    tokenizer: TextTokenizer, label_sets: Sequence[LabelSet], prompt: Callable[[LabelSet], list[str]]
) -> dict[LabelSet, Prompt]:
    """Each distinct label set's `prompt`, encoded in one tokenizer call (a label set: any hashable key, a tuple of
    labels or of several lists of them)."""
    distinct = list(dict.fromkeys(label_sets))
    words = [prompt(labels) for labels in distinct]
    encoded = tokenizer.encode_words(words)
    return {labels: Prompt(w, tokens, tokenizer.max_length - len(tokens))
            for labels, w, tokens in zip(distinct, words, encoded, strict=True)}  # fmt: skip


def split_requests(
    items: Sequence[Any], prepare: Callable[[Any], Request | ItemResult]
) -> tuple[list[ItemResult], dict[int, Request]]:
    """Each item `prepare`d: the batch's results (a refused item's in place, the others still empty) and the
    prepared requests by item index."""
    results: list[ItemResult] = [ItemResult() for _ in items]
    requests: dict[int, Request] = {}
    for index, item in enumerate(items):
        prepared = prepare(item)
        if isinstance(prepared, ItemResult):
            results[index] = prepared
        else:
            requests[index] = prepared
    return results, requests


def zero_shot_refusal(adapter: Adapter, item: Any) -> ItemResult | None:
    """INVALID_INPUT for an extract item `adapter` cannot run: options its kind does not read or allow, no
    non-blank text, or labels missing (unless label groups stand in for them), too many or not sane strings; with an
    `output_schema`, one its kind cannot fill or that cannot be read."""
    refused = adapter.refused_options(item.options, OP_EXTRACT)
    if refused is not None:
        return refused
    text = item_text(item.item)
    if text is None or not text.strip():
        return invalid(f"Model '{adapter.model.sie_id}' reads labels against a non-blank text; the item has none")
    if item.output_schema is not None:  # its fields stand in for labels (GLiNER2 only)
        problem = structure_problem(item.output_schema, item.labels, adapter.kind, MAX_ITEM_LABELS, item.options)
    else:
        problem = labels_problem(item.labels, adapter.kind, MAX_ITEM_LABELS, item.options)
    return invalid(problem) if problem is not None else None
