"""Item images as sie-sdk 0.10.1 sends them: every image becomes `{"data": <bytes>, "format": <token>}`.

Encoded bytes travel unchanged, their format detected from their signature (JPEG, PNG, GIF, WebP, BMP, TIFF; other
bytes are refused here, before anything is sent). A PIL image, a numpy array (H×W or H×W×C) or a file path is encoded
as JPEG at quality 95, converted to RGB first when JPEG cannot hold its mode. Pillow is imported only when such an
image is given.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

JPEG_QUALITY: Final = 95
_SIGNATURES: Final = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"),
    (b"MM\x00+", "tiff"),
)
_FORMAT_ALIASES: Final = {"jpg": "jpeg", "jpe": "jpeg"}


def with_wire_images(item: Any) -> Any:
    """`item` with its `images` in wire form (a new map; the caller's is left as it was); anything else as given."""
    if not isinstance(item, Mapping) or not item.get("images"):
        return item
    return {**item, "images": [wire_image(image) for image in item["images"]]}


def wire_image(image: Any) -> dict[str, Any]:
    """One image as `{"data", "format"}`; a `{"data", "format"?}` map's declared format must match its bytes."""
    declared = None
    if isinstance(image, Mapping) and "data" in image:
        declared, image = image.get("format"), image["data"]
    if isinstance(image, bytes | bytearray):
        data, detected = bytes(image), detect_format(bytes(image))
    else:
        data, detected = jpeg_bytes(image), "jpeg"
    if declared is not None:
        named = _FORMAT_ALIASES.get(str(declared).lower(), str(declared).lower())
        if named != detected:
            raise ValueError(f"Image format mismatch: declared {declared!r}, the bytes are {detected}")
    return {"data": data, "format": detected}


def detect_format(data: bytes) -> str:
    """The format token of encoded image bytes, from their signature; ValueError for bytes of no known format."""
    for signature, name in _SIGNATURES:
        if data.startswith(signature):
            return name
    if len(data) >= 12 and data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "webp"
    raise ValueError("Could not detect the image format of the bytes (JPEG, PNG, GIF, WebP, BMP or TIFF expected)")


def jpeg_bytes(image: Any) -> bytes:
    """A PIL image, numpy array or image file path encoded as JPEG."""
    from PIL import Image

    if isinstance(image, str | Path):
        path = Path(image)
        if not path.exists():
            raise FileNotFoundError(f"Image file not found: {path}")
        image = Image.open(path)
    elif hasattr(image, "shape") and hasattr(image, "dtype"):
        if image.ndim not in (2, 3):
            raise ValueError(f"Expected a 2-D (grayscale) or 3-D (H, W, C) array, got {image.ndim}-D")
        image = Image.fromarray(image)
    if not isinstance(image, Image.Image):
        raise ValueError(
            f"Unsupported image type {type(image).__name__}: expected PIL.Image, numpy array, bytes, str or Path"
        )
    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()
