"""sie.imaging.preprocess against transformers' PIL image processors.

The reference is `CLIPImageProcessorPil` and `SiglipImageProcessorPil` (transformers 5: `CLIPImageProcessor` and
`SiglipImageProcessor` are the torchvision backend there, and fall back to these without torchvision), built from
the same preprocessor config and given the same image decoded by Pillow and turned upright with
`ImageOps.exif_transpose`. Without transparency the reference is also given that image `.convert("RGB")`; with
transparency transformers 5 composites onto white (its `convert_to_rgb`), and so does SIE.

transformers is imported by the tests that use it, not at collection: its image processors take each pytest-xdist
worker ~8 s of CPU to import, and only the worker running this module needs them.
"""

from __future__ import annotations

import functools
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageOps

from sie.imaging import ImageError, ImageLimits, ImageProcessor

LIMITS = ImageLimits()
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

CONFIGS: dict[str, dict[str, Any]] = {
    "clip": {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "CLIPProcessor",
        "do_resize": True,
        "size": {"shortest_edge": 32},
        "resample": 3,
        "do_center_crop": True,
        "crop_size": {"height": 32, "width": 32},
        "do_rescale": True,
        "rescale_factor": 0.00392156862745098,
        "do_normalize": True,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "do_convert_rgb": True,
    },
    # crop larger than the resized image in height, smaller in width: the zero padding of center_crop
    "clip-padded": {
        "image_processor_type": "CLIPImageProcessor",
        "size": {"shortest_edge": 24},
        "crop_size": {"height": 33, "width": 20},
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    },
    # the old CLIPFeatureExtractor layout (openai/clip-vit-base-patch32): bare ints, the rest by default
    "clip-legacy": {
        "feature_extractor_type": "CLIPFeatureExtractor",
        "size": 32,
        "crop_size": 32,
        "do_center_crop": True,
        "do_normalize": True,
        "do_resize": True,
        "resample": 3,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
    },
    "siglip": {
        "image_processor_type": "SiglipImageProcessor",
        "processor_class": "SiglipProcessor",
        "do_resize": True,
        "size": {"height": 32, "width": 32},
        "resample": 2,
        "do_rescale": True,
        "rescale_factor": 0.00392156862745098,
        "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
    # a non-square output, bicubic, the normalization as single numbers, no rescale
    "siglip-wide": {
        "image_processor_type": "SiglipImageProcessor",
        "size": {"height": 24, "width": 40},
        "resample": 3,
        "do_rescale": False,
        "image_mean": 127.5,
        "image_std": 127.5,
    },
}


@functools.cache
def reference_classes() -> dict[str, type]:
    """transformers' PIL processors by family, imported on first use."""
    from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

    return {"clip": CLIPImageProcessorPil, "siglip": SiglipImageProcessorPil}


def reference_class(name: str) -> type:
    return reference_classes()[name.split("-")[0]]


def reference(name: str, image: Image.Image) -> np.ndarray:
    processor = reference_class(name).from_dict(CONFIGS[name])
    return processor(images=image, return_tensors="np")["pixel_values"][0]


def encode(image: Image.Image, image_format: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, image_format, **params)
    return buffer.getvalue()


def noise(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Smooth-ish noise (a gradient plus random values), so resampling filters have something to differ on."""
    channels = len(mode)
    rng = np.random.default_rng(seed)
    gradient = np.linspace(0, 255, width)[None, :, None] * np.linspace(0.2, 1, height)[:, None, None]
    array = np.clip(gradient + rng.normal(0, 40, (height, width, channels)), 0, 255).astype(np.uint8)
    return Image.fromarray(array[:, :, 0] if channels == 1 else array, mode=mode if mode != "RGB" else None)


def has_transparency(image: Image.Image) -> bool:
    return "A" in image.getbands() or image.info.get("transparency") is not None


def assert_equal_to_reference(name: str, data: bytes) -> np.ndarray:
    processor = ImageProcessor.from_dict(CONFIGS[name])
    ours = processor(data, LIMITS)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    expected = reference(name, upright)
    assert ours.dtype == np.float32
    assert ours.shape == expected.shape == (3, *processor.output_size)
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-5)
    if not has_transparency(upright):
        np.testing.assert_allclose(ours, reference(name, upright.convert("RGB")), rtol=0, atol=1e-5)
    return ours


# --- sizes and aspect ratios

SIZES = [(32, 32), (20, 13), (13, 20), (64, 48), (45, 97), (1, 50), (50, 1), (300, 7), (33, 31), (257, 255)]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize(("width", "height"), SIZES)
@pytest.mark.parametrize("image_format", ["PNG", "JPEG"])
def test_rgb_images_of_every_size_equal_transformers(name: str, width: int, height: int, image_format: str) -> None:
    assert_equal_to_reference(name, encode(noise(width, height, seed=width * height), image_format))


# --- modes and formats


def rgba_with_clear_and_opaque_pixels(width: int, height: int) -> Image.Image:
    image = noise(width, height, "RGBA")
    alpha = np.asarray(image.getchannel("A")).copy()
    alpha[: height // 3] = 0
    alpha[-height // 3 :] = 255
    image.putalpha(Image.fromarray(alpha))
    return image


MODE_CASES = {
    "RGBA PNG": lambda w, h: encode(rgba_with_clear_and_opaque_pixels(w, h), "PNG"),
    "LA PNG": lambda w, h: encode(noise(w, h, "LA"), "PNG"),
    "L PNG": lambda w, h: encode(noise(w, h, "L"), "PNG"),
    "L PNG with a transparent grey": lambda w, h: encode(noise(w, h, "L"), "PNG", transparency=100),
    "RGB PNG with a transparent colour": lambda w, h: encode(
        noise(w, h).quantize(4).convert("RGB"),
        "PNG",
        transparency=noise(w, h).quantize(4).convert("RGB").getpixel((0, 0)),
    ),
    "P PNG": lambda w, h: encode(noise(w, h).quantize(64), "PNG"),
    "P PNG with transparency": lambda w, h: encode(noise(w, h).quantize(64), "PNG", transparency=5),
    "1 PNG": lambda w, h: encode(noise(w, h, "L").convert("1"), "PNG"),
    "L JPEG": lambda w, h: encode(noise(w, h, "L"), "JPEG"),
    "CMYK JPEG": lambda w, h: encode(noise(w, h, "CMYK"), "JPEG"),
    "P GIF": lambda w, h: encode(noise(w, h).quantize(32), "GIF"),
    "P GIF with transparency": lambda w, h: encode(noise(w, h).quantize(32), "GIF", transparency=3),
    "RGB WEBP": lambda w, h: encode(noise(w, h), "WEBP", lossless=True),
    "RGBA WEBP": lambda w, h: encode(rgba_with_clear_and_opaque_pixels(w, h), "WEBP", quality=90),
    "RGB BMP": lambda w, h: encode(noise(w, h), "BMP"),
    "P BMP": lambda w, h: encode(noise(w, h).quantize(16), "BMP"),
}


@pytest.mark.parametrize("name", ["clip", "siglip"])
@pytest.mark.parametrize(("width", "height"), [(45, 31), (23, 40), (16, 16)])
@pytest.mark.parametrize("case", sorted(MODE_CASES))
def test_every_served_mode_and_format_equals_transformers(name: str, width: int, height: int, case: str) -> None:
    assert_equal_to_reference(name, MODE_CASES[case](width, height))


def test_transparency_is_composited_onto_white_as_transformers_5_does() -> None:
    clear = Image.new("RGBA", (40, 40), (200, 10, 10, 0))
    ours = assert_equal_to_reference("siglip", encode(clear, "PNG"))
    np.testing.assert_allclose(ours, 1.0, atol=1e-6)  # white: (1 - 0.5) / 0.5
    dropped_alpha = reference("siglip", clear.convert("RGB"))  # what .convert("RGB") alone would give
    assert not np.allclose(ours, dropped_alpha)


# --- EXIF orientation


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("name", ["clip", "siglip-wide"])
def test_an_exif_rotated_jpeg_is_turned_upright_as_transformers_is_given_it(orientation: int, name: str) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(noise(48, 30), "JPEG", exif=exif)
    ours = assert_equal_to_reference(name, data)
    if orientation != 1:
        stored = reference(name, Image.open(io.BytesIO(data)).convert("RGB"))
        assert not np.allclose(ours, stored)


# --- full-size configs as published


def test_a_clip_vit_config_at_224_equals_transformers() -> None:
    CONFIGS["clip-224"] = {
        **CONFIGS["clip"],
        "size": {"shortest_edge": 224},
        "crop_size": {"height": 224, "width": 224},
    }
    try:
        for width, height in [(640, 480), (300, 500), (100, 90)]:
            assert_equal_to_reference("clip-224", encode(noise(width, height), "JPEG", quality=85))
    finally:
        del CONFIGS["clip-224"]


def test_a_siglip_config_at_224_equals_transformers() -> None:
    CONFIGS["siglip-224"] = {**CONFIGS["siglip"], "size": {"height": 224, "width": 224}, "resample": 3}
    try:
        for width, height in [(640, 480), (300, 500), (100, 90)]:
            assert_equal_to_reference("siglip-224", encode(noise(width, height), "PNG"))
    finally:
        del CONFIGS["siglip-224"]


# --- reading preprocessor_config.json


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("clip", (32, 32)),
        ("clip-padded", (33, 20)),
        ("clip-legacy", (32, 32)),
        ("siglip", (32, 32)),
        ("siglip-wide", (24, 40)),
    ],
)
def test_output_size_is_height_and_width(name: str, size: tuple[int, int]) -> None:
    assert ImageProcessor.from_dict(CONFIGS[name]).output_size == size


def test_missing_keys_take_the_defaults_of_the_named_processor() -> None:
    clip = ImageProcessor.from_dict({"image_processor_type": "CLIPImageProcessor"})
    assert (clip.size, clip.crop_size, clip.resample, clip.output_size) == (224, (224, 224), 3, (224, 224))
    assert clip.image_mean == tuple(CLIP_MEAN)
    assert clip.image_std == tuple(CLIP_STD)
    siglip = ImageProcessor.from_dict({"image_processor_type": "SiglipImageProcessor"})
    assert (siglip.size, siglip.do_center_crop, siglip.resample, siglip.output_size) == (
        (224, 224),
        False,
        3,
        (224, 224),
    )
    assert siglip.image_mean == siglip.image_std == (0.5, 0.5, 0.5)
    for name in ("clip", "siglip"):
        reference_processor = reference_class(name)()
        ours = clip if name == "clip" else siglip
        assert ours.rescale_factor == reference_processor.rescale_factor
        assert ours.resample == reference_processor.resample
        assert ours.image_mean == tuple(reference_processor.image_mean)
        assert ours.do_center_crop == bool(reference_processor.do_center_crop)


def test_null_values_take_the_defaults_and_tensor_settings_are_ignored() -> None:
    # what a transformers 4 fast processor writes with save_pretrained
    saved = {
        **CONFIGS["siglip"],
        "image_processor_type": "SiglipImageProcessorFast",
        "crop_size": None,
        "data_format": "channels_first",
        "default_to_square": True,
        "device": None,
        "disable_grouping": None,
        "do_center_crop": None,
        "do_pad": None,
        "input_data_format": None,
        "return_tensors": None,
    }
    assert ImageProcessor.from_dict(saved) == ImageProcessor.from_dict(CONFIGS["siglip"])


def test_configs_transformers_saves_are_read_as_its_processors_hold_them(tmp_path: Path) -> None:
    saved = [
        reference_class("clip")(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        reference_class("siglip")(size={"height": 24, "width": 40}, resample=2),
    ]
    for number, processor in enumerate(saved):
        processor.save_pretrained(tmp_path / str(number))
        ours = ImageProcessor.from_file(tmp_path / str(number) / "preprocessor_config.json")
        data = encode(noise(50, 30), "PNG")
        np.testing.assert_allclose(
            ours(data, LIMITS), processor(images=Image.open(io.BytesIO(data)), return_tensors="np")["pixel_values"][0],
            rtol=0, atol=1e-5,
        )  # fmt: skip


def test_from_file_reads_preprocessor_config_json(tmp_path: Path) -> None:
    path = tmp_path / "preprocessor_config.json"
    path.write_text(json.dumps(CONFIGS["clip"]))
    assert ImageProcessor.from_file(path) == ImageProcessor.from_dict(CONFIGS["clip"])
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        ImageProcessor.from_file(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"size": {"shortest_edge": 32, "longest_edge": 64}},
            r"config size must have the keys shortest_edge or height",
        ),
        ({"size": {"shortest_edge": 0}}, r"config size must hold positive integers"),
        ({"size": "big"}, r"config size must hold positive integers"),
        ({"crop_size": {"shortest_edge": 32}}, r"config crop_size must have the keys height and width"),
        ({"crop_size": [32, -1]}, r"config crop_size must hold positive integers"),
        ({"resample": 7}, r"config resample must be one of 0 \(nearest\)"),
        ({"resample": True}, r"config resample must be one of"),
        ({"image_mean": [0.5, 0.5]}, r"config image_mean must be a number or three numbers"),
        ({"image_std": [0.5, 0.0, 0.5]}, r"config image_std must not hold zero"),
        ({"image_std": "wide"}, r"config image_std must be a number or three numbers"),
        ({"rescale_factor": -1}, r"config rescale_factor must be a positive number"),
        ({"do_resize": "yes"}, r"config do_resize must be true or false"),
        ({"crop_pct": 0.9}, r"config key 'crop_pct' is not one SIE reads"),
        ({"image_processor_type": "Siglip2ImageProcessor"}, r"config image_processor_type 'Siglip2ImageProcessor'"),
        ({"do_convert_rgb": False}, r"config do_convert_rgb=false is not supported"),
        ({"do_pad": True}, r"config do_pad=True is not supported"),
        ({"do_center_crop": False, "do_resize": False}, r"neither do_center_crop nor do_resize"),
        ({"data_format": "channels_last"}, r"config data_format='channels_last' is not supported"),
        ({"do_center_crop": False}, r"neither do_center_crop nor do_resize to a size \{height, width\}"),
    ],
)
def test_a_bad_or_unknown_value_is_refused_naming_the_key(changes: dict[str, Any], message: str) -> None:
    config = {**CONFIGS["clip"], **changes}
    with pytest.raises(ValueError, match=message):
        ImageProcessor.from_dict(config)


def test_a_config_without_a_processor_type_is_refused() -> None:
    config = {key: value for key, value in CONFIGS["clip"].items() if key != "image_processor_type"}
    with pytest.raises(ValueError, match="image_processor_type is missing"):
        ImageProcessor.from_dict(config)


def test_center_crop_without_crop_size_is_refused() -> None:
    with pytest.raises(ValueError, match="do_center_crop is true but crop_size is missing"):
        ImageProcessor.from_dict({**CONFIGS["siglip"], "do_center_crop": True})


# --- refusals at preprocessing


def test_an_image_the_probe_refuses_is_refused() -> None:
    processor = ImageProcessor.from_dict(CONFIGS["clip"])
    sixteen_bit = encode(Image.fromarray(np.full((8, 8), 40_000, dtype=np.uint16)), "PNG")
    with pytest.raises(ImageError, match="16-bit"):
        processor(sixteen_bit, LIMITS)
    with pytest.raises(ImageError, match="not an image SIE reads"):
        processor(b"plain text", LIMITS)
    with pytest.raises(ImageError, match="at most 100 are accepted"):
        processor(encode(noise(20, 20), "PNG"), ImageLimits(max_pixels=100))


def test_an_aspect_ratio_whose_resize_exceeds_the_pixel_limit_is_refused() -> None:
    processor = ImageProcessor.from_dict(CONFIGS["clip"])  # shortest edge 32: 1×2000 resizes to 32×64000
    data = encode(noise(1, 2000), "PNG")
    assert processor(data, ImageLimits(max_pixels=2_048_000)).shape == (3, 32, 32)
    with pytest.raises(
        ImageError, match=r"the image is 1×2000: resized for this model it would be 32×64000 = 2,048,000"
    ):
        processor(data, ImageLimits(max_pixels=2_047_999))
