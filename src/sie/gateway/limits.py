"""What one request may ask for, checked before anything is queued (issue 13 §1): how many items it carries,
how long each item's text is, how many labels an extraction names, and each item's images — how many, how many
compressed bytes and how many pixels their headers declare, probed without decoding a pixel (`sie.imaging`). The body
size is bounded where the body is read (`sie.http.bodies`)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from sie.gateway.errors import InvalidRequestError, PayloadTooLargeError
from sie.imaging import ImageError, ImageLimits, probe_image
from sie.wire import codes
from sie.wire.http import Item


@attrs.frozen
class RequestLimits:
    """Most items per request (SIE_GATEWAY_MAX_ITEMS), characters per item text (SIE_GATEWAY_MAX_ITEM_CHARS),
    labels per extraction (SIE_GATEWAY_MAX_LABELS), and images per item, compressed bytes and pixels per image
    (SIE_GATEWAY_MAX_IMAGES_PER_ITEM, SIE_GATEWAY_MAX_IMAGE_BYTES, SIE_GATEWAY_MAX_IMAGE_PIXELS)."""

    max_items: int = 4096
    max_item_chars: int = 100_000
    max_labels: int = 1000
    max_images_per_item: int = 16
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000

    @property
    def image_limits(self) -> ImageLimits:
        return ImageLimits(self.max_image_bytes, self.max_image_pixels)

    def check_images(self, items: Sequence[Item], query: Item | None = None) -> None:
        """Raise InvalidRequestError (400) naming the item and image for more images than an item may carry, or one
        that is too large, declares too many pixels, is not a still image of a format SIE reads, or is cut short;
        each is probed from its header, never decoded. Work for a thread: many images take a while."""
        named = [("the query", query)] if query is not None else []
        named += [(f"item {index}", item) for index, item in enumerate(items)]
        limits = self.image_limits
        for which, item in named:
            images = item.images or []
            if len(images) > self.max_images_per_item:
                raise InvalidRequestError(
                    f"{which.capitalize()} has {len(images)} images; at most {self.max_images_per_item} are accepted "
                    "per item (SIE_GATEWAY_MAX_IMAGES_PER_ITEM)"
                )
            for number, image in enumerate(images):
                try:
                    probe_image(bytes(image.data), limits)
                except ImageError as exc:
                    raise InvalidRequestError(f"Image {number} of {which}: {exc}") from exc

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
