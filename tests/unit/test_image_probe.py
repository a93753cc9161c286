"""sie.imaging.probe: what untrusted image bytes declare, checked before any pixel is decoded.

Every image is made here with Pillow, or by hand where it must lie (a header declaring a huge image over a tiny
body). The pixel modes SIE serves: 1, L, LA, P (with or without a transparent colour), RGB, RGBA, CMYK (JPEG); it
refuses 16-bit grayscale (I;16), which Pillow clips to white when converting to RGB.
"""

from __future__ import annotations

import base64
import io
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from sie.imaging import (
    SERVED_MODES,
    ImageError,
    ImageInfo,
    ImageLimits,
    decode_base64_image,
    decode_image,
    probe_image,
)

LIMITS = ImageLimits()


def encode(image: Image.Image, image_format: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **params)
    return buffer.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    channels = len(mode)
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    return Image.fromarray(array[:, :, 0] if channels == 1 else array, mode=mode if mode != "RGB" else None)


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def handmade_png(width: int, height: int, *, body_rows: int | None = None) -> bytes:
    """A 1-bit grayscale PNG of zeros, compressed a row block at a time: 20000×20000 is ~50 KB, made in a blink.
    `body_rows` writes fewer rows than the header declares (the decode fails; the header does not tell)."""
    rows = height if body_rows is None else body_rows
    row = bytes(1 + (width + 7) // 8)  # filter byte 0 and the packed bits
    compressor = zlib.compressobj(9)
    body = b"".join(compressor.compress(row * min(1000, rows - start)) for start in range(0, rows, 1000))
    body += compressor.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", body) + png_chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) is rewritten to declare width×height."""
    data = bytearray(encode(noise(16, 16), "JPEG"))
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)  # marker(2) length(2) precision(1), then height, width
    return bytes(data)


# --- what a still image of each format declares


@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
@pytest.mark.parametrize(("width", "height"), [(1, 1), (37, 23), (23, 37), (640, 480), (1, 300)])
def test_a_still_image_of_each_format_is_described_from_its_header(image_format: str, width: int, height: int) -> None:
    image = noise(width, height)
    if image_format == "GIF":
        image = image.convert("P")
    info = probe_image(encode(image, image_format), LIMITS)
    assert info == ImageInfo(image_format, width, height, "P" if image_format == "GIF" else "RGB")


def test_probing_decodes_no_pixel(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse_to_load(self: ImageFile.ImageFile) -> None:
        raise AssertionError("probe_image decoded pixels")

    monkeypatch.setattr(ImageFile.ImageFile, "load", refuse_to_load)
    for image_format in ["PNG", "JPEG", "WEBP", "BMP"]:
        assert probe_image(encode(noise(40, 30), image_format), LIMITS).format == image_format
    assert probe_image(encode(noise(40, 30).convert("P"), "GIF"), LIMITS).format == "GIF"
    with pytest.raises(ImageError, match="pixels"):
        probe_image(handmade_png(20_000, 20_000), LIMITS)


# --- pixel modes: served or refused


def rgba_png() -> bytes:
    return encode(noise(20, 10, "RGBA"), "PNG")


def la_png() -> bytes:
    return encode(noise(20, 10, "LA"), "PNG")


def palette_png_with_transparency() -> bytes:
    return encode(noise(20, 10).convert("P"), "PNG", transparency=3)


def grayscale_png_with_transparency() -> bytes:
    return encode(noise(20, 10, "L"), "PNG", transparency=7)


def bilevel_png() -> bytes:
    return encode(noise(20, 10, "L").convert("1"), "PNG")


def cmyk_jpeg() -> bytes:
    return encode(noise(20, 10, "CMYK"), "JPEG")


def grayscale_jpeg() -> bytes:
    return encode(noise(20, 10, "L"), "JPEG")


def gif_with_transparency() -> bytes:
    return encode(noise(20, 10).convert("P"), "GIF", transparency=0)


def palette_bmp() -> bytes:
    return encode(noise(20, 10).convert("P"), "BMP")


def grayscale_16_bit_png() -> bytes:
    return encode(Image.fromarray((np.arange(200, dtype=np.uint16) * 300).reshape(10, 20)), "PNG")


@pytest.mark.parametrize(
    ("make", "image_format", "mode"),
    [
        (rgba_png, "PNG", "RGBA"),
        (la_png, "PNG", "LA"),
        (palette_png_with_transparency, "PNG", "P"),
        (grayscale_png_with_transparency, "PNG", "L"),
        (bilevel_png, "PNG", "1"),
        (cmyk_jpeg, "JPEG", "CMYK"),
        (grayscale_jpeg, "JPEG", "L"),
        (gif_with_transparency, "GIF", "P"),
        (palette_bmp, "BMP", "P"),
    ],
)
def test_modes_that_convert_to_rgb_faithfully_are_served(make, image_format: str, mode: str) -> None:
    assert mode in SERVED_MODES
    assert probe_image(make(), LIMITS) == ImageInfo(image_format, 20, 10, mode)
    assert decode_image(make(), LIMITS).mode == mode


def test_16_bit_grayscale_is_refused_because_pillow_clips_it_to_white() -> None:
    data = grayscale_16_bit_png()
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == "I;16"
    assert np.asarray(opened.convert("RGB"))[..., 0].max() == 255 == np.asarray(opened.convert("RGB"))[5, 5, 0]
    with pytest.raises(ImageError, match=r"16-bit or floating-point grayscale \(mode I;16\) are not read"):
        probe_image(data, LIMITS)


# --- sizes: bytes and declared pixels


def test_empty_data_is_refused() -> None:
    with pytest.raises(ImageError, match=r"the image is empty \(0 bytes\)"):
        probe_image(b"", LIMITS)


def test_more_bytes_than_the_limit_are_refused_before_anything_is_parsed() -> None:
    data = encode(noise(64, 64), "PNG")
    assert probe_image(data, ImageLimits(max_bytes=len(data), max_pixels=10_000)).width == 64
    with pytest.raises(ImageError, match=f"the image has {len(data):,} bytes; at most {len(data) - 1:,} are accepted"):
        probe_image(data, ImageLimits(max_bytes=len(data) - 1, max_pixels=10_000))


def test_more_pixels_than_the_limit_are_refused_naming_the_size() -> None:
    data = encode(noise(100, 50), "PNG")
    assert probe_image(data, ImageLimits(max_pixels=5000)).height == 50
    with pytest.raises(ImageError, match="the image is 100×50 = 5,000 pixels; at most 4,999 are accepted"):
        probe_image(data, ImageLimits(max_pixels=4999))


def test_a_png_bomb_is_refused_from_its_header() -> None:
    bomb = handmade_png(20_000, 20_000)
    assert len(bomb) < 100_000  # 400 million pixels in a few tens of KB
    with pytest.raises(ImageError, match="the image declares too many pixels .* at most 40,000,000 are accepted"):
        probe_image(bomb, LIMITS)


def test_a_png_over_the_limit_but_under_pillows_own_is_refused_naming_the_size() -> None:
    with pytest.raises(ImageError, match="the image is 10000×5000 = 50,000,000 pixels; at most 40,000,000"):
        probe_image(handmade_png(10_000, 5_000, body_rows=10), LIMITS)


def test_pillows_decompression_bomb_warning_is_refused_not_emitted() -> None:
    # 100 million pixels: over Pillow's MAX_IMAGE_PIXELS (warns) and under twice it (raises); the limit asked for is
    # higher still, and Pillow's stays in force. The suite turns warnings into errors, so one escaping would fail here.
    assert Image.MAX_IMAGE_PIXELS is not None
    assert Image.MAX_IMAGE_PIXELS < 100_000_000 < 2 * Image.MAX_IMAGE_PIXELS
    filters_before = list(warnings.filters)
    with pytest.raises(ImageError, match=f"at most {Image.MAX_IMAGE_PIXELS:,} are accepted"):
        probe_image(handmade_png(10_000, 10_000, body_rows=10), ImageLimits(max_pixels=200_000_000))
    assert warnings.filters == filters_before


def test_other_pillow_warnings_about_the_image_are_dropped() -> None:
    # An APNG animation-control chunk declaring 0 frames: Pillow warns "Invalid APNG" and reads the still image.
    data = encode(noise(12, 8), "PNG")
    after_header = 8 + 8 + 13 + 4  # signature, then IHDR: length and type, body, CRC
    invalid = data[:after_header] + png_chunk(b"acTL", struct.pack(">II", 0, 0)) + data[after_header:]
    with pytest.warns(UserWarning, match="Invalid APNG"):
        Image.open(io.BytesIO(invalid))
    filters_before = list(warnings.filters)
    assert probe_image(invalid, LIMITS) == ImageInfo("PNG", 12, 8, "RGB")
    assert decode_image(invalid, LIMITS).size == (12, 8)
    assert warnings.filters == filters_before


def test_a_jpeg_whose_header_claims_a_huge_image_is_refused() -> None:
    with pytest.raises(ImageError, match="too many pixels"):
        probe_image(jpeg_claiming(65_000, 65_000), LIMITS)
    with pytest.raises(ImageError, match="the image is 8000×6000 = 48,000,000 pixels; at most 40,000,000"):
        probe_image(jpeg_claiming(8000, 6000), LIMITS)


def zero_width(image_format: str) -> bytes:
    image = noise(16, 16)
    data = bytearray(encode(image.convert("P") if image_format == "GIF" else image, image_format))
    if image_format == "PNG":
        return handmade_png(0, 10)
    if image_format == "JPEG":
        struct.pack_into(">H", data, data.index(b"\xff\xc0") + 7, 0)
    elif image_format == "GIF":
        struct.pack_into("<H", data, 6, 0)  # the logical screen
        struct.pack_into("<H", data, data.index(b",") + 5, 0)  # the first frame
    else:
        struct.pack_into("<i", data, 18, 0)  # BITMAPINFOHEADER width
    return bytes(data)


@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "GIF", "BMP"])
def test_an_image_with_no_pixels_is_refused(image_format: str) -> None:
    # Pillow itself identifies no image of zero width (ImageFile refuses it); probe_image would refuse it too.
    with pytest.raises(ImageError, match=f"the {image_format} image's header cannot be read"):
        probe_image(zero_width(image_format), LIMITS)


# --- formats, animations, damage


@pytest.mark.parametrize(
    "data",
    [
        b"hello, world",
        b"%PDF-1.7\n",
        encode(noise(8, 8), "TIFF"),
        encode(noise(8, 8), "ICO"),
        b"\x00" * 64,
    ],
    ids=["text", "pdf", "tiff", "ico", "zeros"],
)
def test_anything_but_jpeg_png_webp_gif_bmp_is_not_an_image_sie_reads(data: bytes) -> None:
    with pytest.raises(ImageError, match=r"^not an image SIE reads \(JPEG, PNG, WebP, GIF, BMP\)$"):
        probe_image(data, LIMITS)


@pytest.mark.parametrize("image_format", ["GIF", "PNG", "WEBP"])
def test_animations_are_refused(image_format: str) -> None:
    frames = [Image.new("RGB", (8, 8), colour) for colour in ("red", "green", "blue")]
    data = encode(frames[0], image_format, save_all=True, append_images=frames[1:], duration=100)
    with pytest.raises(ImageError, match=rf"the {image_format} image is animated \(3 frames\); only still images"):
        probe_image(data, LIMITS)


def test_a_jpeg_with_further_pictures_mpo_is_a_still_photo() -> None:
    first, second = noise(24, 16, seed=1), noise(24, 16, seed=2)
    data = encode(first, "MPO", save_all=True, append_images=[second])
    assert Image.open(io.BytesIO(data)).format == "MPO"
    assert probe_image(data, LIMITS) == ImageInfo("JPEG", 24, 16, "RGB")
    decoded = decode_image(data, LIMITS)
    assert np.array_equal(np.asarray(decoded), np.asarray(Image.open(io.BytesIO(encode(first, "JPEG")))))


@pytest.mark.parametrize("image_format", ["PNG", "JPEG"])
@pytest.mark.parametrize("kept", [0.5, 0.99])
def test_a_png_or_jpeg_cut_short_is_refused_by_its_missing_end_marker(image_format: str, kept: float) -> None:
    data = encode(noise(60, 40), image_format)
    with pytest.raises(ImageError, match=f"the {image_format} image is cut short: its end marker is missing"):
        probe_image(data[: int(len(data) * kept)], LIMITS)


def test_a_webp_cut_short_is_refused() -> None:
    data = encode(noise(60, 40), "WEBP")
    with pytest.raises(ImageError, match="the WEBP image's header cannot be read; it is damaged or cut short"):
        probe_image(data[: len(data) // 2], LIMITS)


@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "GIF", "BMP"])
def test_a_header_cut_short_is_refused(image_format: str) -> None:
    data = encode(noise(60, 40).convert("P") if image_format == "GIF" else noise(60, 40), image_format)
    with pytest.raises(ImageError, match="cut short"):
        probe_image(data[:30], LIMITS)


@pytest.mark.parametrize("image_format", ["GIF", "BMP"])
def test_a_gif_or_bmp_cut_short_passes_the_probe_and_is_refused_when_decoded(image_format: str) -> None:
    image = noise(60, 40).convert("P") if image_format == "GIF" else noise(60, 40)
    data = encode(image, image_format)
    cut = data[: len(data) // 2]
    assert probe_image(cut, LIMITS) == ImageInfo(image_format, 60, 40, image.mode)
    with pytest.raises(ImageError, match=f"the {image_format} image could not be decoded; it is damaged or cut short"):
        decode_image(cut, LIMITS)


# --- decoding


def test_decode_turns_the_image_upright_by_its_exif_orientation() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90° clockwise to display
    data = encode(noise(40, 20), "JPEG", exif=exif)
    assert probe_image(data, LIMITS) == ImageInfo("JPEG", 40, 20, "RGB")  # as stored
    upright = decode_image(data, LIMITS)
    assert upright.size == (20, 40)
    stored = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(np.asarray(upright), np.rot90(stored, k=-1))


def test_decode_keeps_the_mode_and_transparency() -> None:
    decoded = decode_image(palette_png_with_transparency(), LIMITS)
    assert decoded.mode == "P"
    assert decoded.info["transparency"] == 3


def test_decode_refuses_what_the_probe_refuses() -> None:
    with pytest.raises(ImageError, match="too many pixels"):
        decode_image(handmade_png(20_000, 20_000), LIMITS)
    with pytest.raises(ImageError, match="not an image SIE reads"):
        decode_image(b"GIF90a nothing", LIMITS)


# --- base64


def test_base64_text_decodes_to_the_image_bytes() -> None:
    data = encode(noise(10, 10), "PNG")
    assert decode_base64_image(base64.b64encode(data).decode(), len(data)) == data


def test_base64_text_longer_than_the_limit_encodes_to_is_refused_before_decoding() -> None:
    # 1000 bytes encode to at most 1336 characters: the text is not even base64, so only the length can refuse it.
    with pytest.raises(ImageError, match=r"the base64 image has 1,337 characters; at most 1,336 are accepted \(1,000"):
        decode_base64_image("!" * 1337, 1000)


def test_base64_that_decodes_to_a_byte_or_two_over_the_limit_is_refused() -> None:
    text = base64.b64encode(bytes(1002)).decode()
    assert len(text) == 1336
    with pytest.raises(ImageError, match="the image has 1,002 bytes; at most 1,000 are accepted"):
        decode_base64_image(text, 1000)


@pytest.mark.parametrize("text", ["not base64!", "abc", "YWJj\nZGVm", "aé=="])
def test_invalid_base64_is_refused(text: str) -> None:
    with pytest.raises(ImageError, match="the image is not valid base64"):
        decode_base64_image(text, 1000)


# --- limits


def test_limits_default_to_20_mib_and_40_million_pixels() -> None:
    assert ImageLimits() == ImageLimits(20 * 1024 * 1024, 40_000_000)


@pytest.mark.parametrize(("max_bytes", "max_pixels"), [(0, 1), (1, 0), (-1, 1)])
def test_limits_must_be_positive(max_bytes: int, max_pixels: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        ImageLimits(max_bytes, max_pixels)
