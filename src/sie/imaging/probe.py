"""Untrusted image bytes: what their header declares, checked before any pixel is decoded, and the decode itself.

`probe_image` reads the format, size and pixel mode an image declares and refuses, with a message a client can act
on, whatever SIE will not decode: empty or oversized data, a format other than JPEG, PNG, WebP, GIF and BMP, more
pixels than allowed (a small file can declare a huge image), animations, pixel modes that do not convert to RGB
faithfully, and files cut short where the format marks its end (PNG, JPEG, WebP; a GIF or BMP cut short is found when
decoded). No pixel is decoded there. `decode_image` probes, then decodes under the same guards and turns the image
upright by its EXIF orientation. `decode_base64_image` bounds base64 text before decoding it.

Pillow's own decompression-bomb check (`Image.MAX_IMAGE_PIXELS`) stays in force: the pixel limit applied is the
smaller of `ImageLimits.max_pixels` and Pillow's.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import io
import math
import struct
import warnings
from collections.abc import Iterator

import attrs
from PIL import Image, ImageOps

SUPPORTED_FORMATS = "JPEG, PNG, WebP, GIF, BMP"

# Pixel modes whose conversion to RGB keeps what the image shows (alpha is composited onto white when converted).
# 16-bit and floating-point grayscale ("I;16", "I", "F") are left out: Pillow clips them to 255 when it converts to RGB.
SERVED_MODES = frozenset({"1", "L", "LA", "P", "RGB", "RGBA", "CMYK"})

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: length 0, type, CRC; always the same 12 bytes
_JPEG_START_OF_SCAN = b"\xff\xda"
_JPEG_END = b"\xff\xd9"
_ANIMATED_FORMATS = frozenset({"GIF", "PNG", "WEBP"})

# What Pillow raises for a header or body it cannot read (UnidentifiedImageError is an OSError).
_DAMAGED = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error)


class ImageError(ValueError):
    """An image SIE will not read; the message says what is wrong and, where one applies, the limit."""


@attrs.frozen
class ImageLimits:
    """The most compressed bytes and pixels (width × height, as the header declares them) one image may have."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000

    def __attrs_post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_pixels <= 0:
            raise ValueError(
                f"Image limits must be positive, got max_bytes={self.max_bytes}, max_pixels={self.max_pixels}"
            )


@attrs.frozen
class ImageInfo:
    """What an image's header declares: format (JPEG, PNG, WEBP, GIF, BMP), size as stored (before any EXIF
    orientation turns it) and Pillow's pixel mode."""

    format: str
    width: int
    height: int
    mode: str


def probe_image(data: bytes, limits: ImageLimits) -> ImageInfo:
    """Read an image's header and raise ImageError for anything SIE will not decode; no pixel is decoded."""
    with _pillow_warnings(), _opened(data, limits) as (image, info):
        _check_still(image, info.format)
    return info


def decode_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Probe, decode and turn upright by the EXIF orientation. The image keeps its mode (one of SERVED_MODES) and
    its transparency; ImageError for anything probe_image refuses or a body that does not decode."""
    with _pillow_warnings(), _opened(data, limits) as (image, info):
        _check_still(image, info.format)
        try:
            image.load()
            upright = ImageOps.exif_transpose(image)
        except _DAMAGED as exc:
            raise ImageError(
                f"the {info.format} image could not be decoded; it is damaged or cut short ({exc})"
            ) from exc
    return upright


def decode_base64_image(text: str, max_bytes: int) -> bytes:
    """The bytes of a base64-encoded image; ImageError for text longer than `max_bytes` encodes to (checked before
    decoding), for invalid base64, or for more than `max_bytes` once decoded."""
    max_chars = 4 * math.ceil(max_bytes / 3)
    if len(text) > max_chars:
        raise ImageError(
            f"the base64 image has {len(text):,} characters; at most {max_chars:,} are accepted "
            f"({max_bytes:,} bytes once decoded)"
        )
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"the image is not valid base64 ({exc})") from exc
    if len(data) > max_bytes:
        raise ImageError(f"the image has {len(data):,} bytes; at most {max_bytes:,} are accepted")
    return data


def _sniff_format(data: bytes) -> str | None:
    """The format the leading bytes name (JPEG, PNG, WEBP, GIF, BMP), or None for any other."""
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if data.startswith(_PNG_SIGNATURE):
        return "PNG"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    if data.startswith(b"BM"):
        return "BMP"
    return None


@contextlib.contextmanager
def _opened(data: bytes, limits: ImageLimits) -> Iterator[tuple[Image.Image, ImageInfo]]:
    """The image opened from its header (nothing decoded) and what it declares, every header check passed."""
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageError(f"the image has {len(data):,} bytes; at most {limits.max_bytes:,} are accepted")
    image_format = _sniff_format(data)
    if image_format is None:
        raise ImageError(f"not an image SIE reads ({SUPPORTED_FORMATS})")
    _check_end(data, image_format)
    max_pixels = _pixel_limit(limits)
    try:
        image = Image.open(io.BytesIO(data), formats=[image_format])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(
            f"the image declares too many pixels (width × height); at most {max_pixels:,} are accepted"
        ) from exc
    except _DAMAGED as exc:
        raise ImageError(f"the {image_format} image's header cannot be read; it is damaged or cut short") from exc
    with image:
        info = ImageInfo(image_format, image.width, image.height, image.mode)
        _check_header(info, max_pixels)
        yield image, info


def _check_end(data: bytes, image_format: str) -> None:
    """Refuse a PNG without its IEND chunk or a JPEG with no end-of-image marker after its first scan: the body was
    cut short (Pillow would fail on it when decoding). WebP is checked by Pillow's open; GIF and BMP when decoded."""
    if image_format == "PNG":
        complete = _PNG_END in data
    elif image_format == "JPEG":
        start_of_scan = data.find(_JPEG_START_OF_SCAN)
        complete = start_of_scan >= 0 and data.find(_JPEG_END, start_of_scan) >= 0
    else:
        return
    if not complete:
        raise ImageError(f"the {image_format} image is cut short: its end marker is missing")


def _check_header(info: ImageInfo, max_pixels: int) -> None:
    if info.width <= 0 or info.height <= 0:
        raise ImageError(f"the image has no pixels ({info.width}×{info.height})")
    pixels = info.width * info.height
    if pixels > max_pixels:
        raise ImageError(
            f"the image is {info.width}×{info.height} = {pixels:,} pixels; at most {max_pixels:,} are accepted"
        )
    if info.mode not in SERVED_MODES:
        if info.mode.startswith("I") or info.mode == "F":
            raise ImageError(
                f"{info.format} images with 16-bit or floating-point grayscale (mode {info.mode}) are not read: they "
                "do not convert to RGB faithfully; send 8-bit grayscale or RGB"
            )
        raise ImageError(
            f"{info.format} images of pixel mode {info.mode} are not read; send RGB, RGBA, grayscale or palette images"
        )


def _check_still(image: Image.Image, image_format: str) -> None:
    """Refuse an animation. A JPEG's further frames (MPO: a stereo pair, a depth map) are not an animation: its
    first frame is the photo."""
    if image_format not in _ANIMATED_FORMATS:
        return
    try:
        frames = getattr(image, "n_frames", 1)
    except _DAMAGED as exc:
        raise ImageError(f"the {image_format} image's frames cannot be read; it is damaged or cut short") from exc
    if frames > 1:
        raise ImageError(f"the {image_format} image is animated ({frames} frames); only still images are read")


def _pixel_limit(limits: ImageLimits) -> int:
    if Image.MAX_IMAGE_PIXELS is None:
        return limits.max_pixels
    return min(limits.max_pixels, Image.MAX_IMAGE_PIXELS)


@contextlib.contextmanager
def _pillow_warnings() -> Iterator[None]:
    """Pillow's warnings about an untrusted image are answers, not log lines: its decompression-bomb warning is
    raised (and refused by the caller); any other (a damaged EXIF block, an invalid APNG chunk) is dropped.

    The warning filters are process-wide and catch_warnings is not thread-safe before Python 3.14. Two threads racing
    here can at worst leave these two filters installed (both concern Pillow only) or let one Pillow warning through
    to the log; the pixel limit is checked again from the header, so what is refused does not depend on the race.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL\.")
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        yield
