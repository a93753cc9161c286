"""What one request may ask for, checked before anything is queued (issue 13 §1): how many items it carries,
how long each item's text is and how many labels an extraction names. The body size is bounded where the body is
read (`sie.http.bodies`)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from sie.gateway.errors import InvalidRequestError, PayloadTooLargeError
from sie.wire import codes
from sie.wire.http import Item


@attrs.frozen
class RequestLimits:
    """Most items per request (SIE_GATEWAY_MAX_ITEMS), characters per item text (SIE_GATEWAY_MAX_ITEM_CHARS) and
    labels per extraction (SIE_GATEWAY_MAX_LABELS)."""

    max_items: int = 4096
    max_item_chars: int = 100_000
    max_labels: int = 1000

    def check(self, items: Sequence[Item], query: Item | None = None) -> None:
        """Raise PayloadTooLargeError (413) for too many items, InvalidRequestError INPUT_TOO_LONG (400) for a
        text over the limit, naming the item."""
        if len(items) > self.max_items:
            raise PayloadTooLargeError(
                f"The request has {len(items)} items; at most {self.max_items} are accepted per request "
                "(SIE_GATEWAY_MAX_ITEMS): split it"
            )
        if query is not None and query.text is not None and len(query.text) > self.max_item_chars:
            raise self._too_long("the query", len(query.text))
        for index, item in enumerate(items):
            if item.text is not None and len(item.text) > self.max_item_chars:
                raise self._too_long(f"item {index}", len(item.text))

    def check_prompt(self, chars: int) -> None:
        """InvalidRequestError INPUT_TOO_LONG (400) for a generation prompt (a raw prompt, or the text of all its
        chat messages together) over the per-item limit: it travels as one work item."""
        if chars > self.max_item_chars:
            raise self._too_long("the prompt", chars)

    def _too_long(self, which: str, length: int) -> InvalidRequestError:
        return InvalidRequestError(
            f"The text of {which} has {length} characters; at most {self.max_item_chars} are accepted "
            "(SIE_GATEWAY_MAX_ITEM_CHARS)",
            code=codes.INPUT_TOO_LONG,
        )
