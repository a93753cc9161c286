"""Image bytes to a model's pixel values, exactly as Hugging Face's PIL image processors compute them.

`ImageProcessor` is read from a checkpoint's `preprocessor_config.json` (the settings of transformers'
`CLIPImageProcessor` and `SiglipImageProcessor`, missing ones taking those classes' defaults) and turns one image's
bytes into float32 [3, height, width]: decoded under the limits of `sie.imaging.probe`, turned upright by its EXIF
orientation, converted to RGB (transparency composited onto white), resized with Pillow, center-cropped (padded with
zeros where the image is smaller), rescaled in float64 then cast to float32, and normalized in float32 — the steps
and arithmetic of transformers' `PilBackend` (`CLIPImageProcessorPil`, `SiglipImageProcessorPil`). With our key
`sie_rgb_after_resize` (what an open_clip model's converted config says) the image is resized in its own mode and
converted to RGB after, by Pillow alone (transparency dropped), as open_clip's eval transform does.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from PIL import Image

from sie.imaging.probe import ImageError, ImageLimits, decode_image

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# Pillow's resampling filters, as preprocessor_config.json numbers them (PIL.Image.Resampling).
RESAMPLE_FILTERS = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

RGB_AFTER_RESIZE_KEY = "sie_rgb_after_resize"
# The class defaults of transformers' processors: what a key missing from preprocessor_config.json means.
_CLIP_DEFAULTS: dict[str, Any] = {
    "do_resize": True,
    "size": {"shortest_edge": 224},
    "default_to_square": False,
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 224, "width": 224},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": OPENAI_CLIP_MEAN,
    "image_std": OPENAI_CLIP_STD,
    "do_convert_rgb": True,
    # Ours, not transformers': open_clip's eval transform (`convert/open_clip.py` writes it true) resizes the image in
    # its own mode and then converts it with Pillow's `convert("RGB")`, which drops transparency.
    RGB_AFTER_RESIZE_KEY: False,
}
_SIGLIP_DEFAULTS: dict[str, Any] = {
    **_CLIP_DEFAULTS,
    "size": {"height": 224, "width": 224},
    "do_center_crop": False,
    "crop_size": None,
    "image_mean": (0.5, 0.5, 0.5),
    "image_std": (0.5, 0.5, 0.5),
}
_DEFAULTS_BY_TYPE = {
    "CLIPImageProcessor": _CLIP_DEFAULTS,
    "CLIPImageProcessorFast": _CLIP_DEFAULTS,
    "CLIPImageProcessorPil": _CLIP_DEFAULTS,
    "CLIPFeatureExtractor": _CLIP_DEFAULTS,
    "SiglipImageProcessor": _SIGLIP_DEFAULTS,
    "SiglipImageProcessorFast": _SIGLIP_DEFAULTS,
    "SiglipImageProcessorPil": _SIGLIP_DEFAULTS,
}
# Keys that name the processor or only matter to batches of tensors; they change no pixel value of one image.
_INFORMATIONAL_KEYS = frozenset(
    {
        "image_processor_type",
        "feature_extractor_type",
        "processor_class",
        "return_tensors",
        "device",
        "disable_grouping",
        "input_data_format",
        "pad_size",
        "do_pad",
        "data_format",
    }
)


@attrs.frozen
class ImageProcessor:
    """The preprocessing of a CLIP- or SigLIP-style image tower. `size` is the shortest edge (an int: the aspect
    ratio is kept) or (height, width); `crop_size` is (height, width). Call it with an image's bytes."""

    do_resize: bool
    size: int | tuple[int, int]
    resample: int
    do_center_crop: bool
    crop_size: tuple[int, int] | None
    do_rescale: bool
    rescale_factor: float
    do_normalize: bool
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rgb_after_resize: bool = False  # open_clip's order: resize in the image's mode, then Pillow's RGB conversion

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ImageProcessor:
        """Read a `preprocessor_config.json`; ValueError for one that is not JSON or holds a bad or unknown value."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON: {exc}") from exc
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageProcessor:
        """Read the settings of a `preprocessor_config.json`; ValueError naming the key for a bad or unknown value.
        As in transformers, a key set to null takes the processor's default."""
        if not isinstance(raw, dict):
            raise ValueError(f"preprocessor config must be a JSON object, got {type(raw).__name__}")
        given = {key: value for key, value in raw.items() if value is not None}
        defaults = _defaults_for(given)
        unknown = sorted(set(given) - set(defaults) - _INFORMATIONAL_KEYS)
        if unknown:
            raise ValueError(f"preprocessor config key {unknown[0]!r} is not one SIE reads (CLIP, SigLIP settings)")
        if given.get("do_pad", False) is not False:
            raise ValueError(f"preprocessor config do_pad={given['do_pad']!r} is not supported: only false")
        if given.get("data_format", "channels_first") != "channels_first":
            raise ValueError(f"preprocessor config data_format={given['data_format']!r} is not supported")
        settings = {**defaults, **{key: value for key, value in given.items() if key in defaults}}

        if not _flag(settings, "do_convert_rgb"):
            raise ValueError("preprocessor config do_convert_rgb=false is not supported: SIE always converts to RGB")
        processor = cls(
            do_resize=_flag(settings, "do_resize"),
            size=_size(settings["size"], "size", default_to_square=_flag(settings, "default_to_square")),
            resample=_resample(settings["resample"]),
            do_center_crop=_flag(settings, "do_center_crop"),
            crop_size=_crop_size(settings["crop_size"]),
            do_rescale=_flag(settings, "do_rescale"),
            rescale_factor=_rescale_factor(settings["rescale_factor"]),
            do_normalize=_flag(settings, "do_normalize"),
            image_mean=_per_channel(settings["image_mean"], "image_mean"),
            image_std=_per_channel(settings["image_std"], "image_std"),
            rgb_after_resize=_flag(settings, RGB_AFTER_RESIZE_KEY),
        )
        processor._check_consistent()
        return processor

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the pixel values, the same for every image."""
        if self.do_center_crop and self.crop_size is not None:
            return self.crop_size
        if self.do_resize and isinstance(self.size, tuple):
            return self.size
        raise AssertionError("from_dict refuses a processor without a fixed output size")

    def __call__(self, data: bytes, limits: ImageLimits) -> np.ndarray:
        """Pixel values float32 [3, height, width] for one image's bytes; ImageError for an image SIE will not read
        (see `probe_image`) or one whose resize would exceed the pixel limit (an extreme aspect ratio)."""
        image = decode_image(data, limits)
        if not self.rgb_after_resize:
            image = _to_rgb(image)
        if self.do_resize:
            height, width = self._resized_size(image.height, image.width)
            if height * width > limits.max_pixels:
                raise ImageError(
                    f"the image is {image.width}×{image.height}: resized for this model it would be "
                    f"{width}×{height} = {width * height:,} pixels; at most {limits.max_pixels:,} are accepted"
                )
            image = image.resize((width, height), resample=self.resample)
        if self.rgb_after_resize:
            image = image.convert("RGB")
        pixels = np.asarray(image).transpose(2, 0, 1)  # channels first
        if self.do_center_crop and self.crop_size is not None:
            pixels = _center_crop(pixels, *self.crop_size)
        if self.do_rescale:
            pixels = (pixels.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.do_normalize:
            pixels = pixels.astype(np.float32, copy=False)
            mean = np.asarray(self.image_mean, dtype=np.float32)[:, None, None]
            std = np.asarray(self.image_std, dtype=np.float32)[:, None, None]
            pixels = (pixels - mean) / std
        return np.ascontiguousarray(pixels, dtype=np.float32)

    def _resized_size(self, height: int, width: int) -> tuple[int, int]:
        """(height, width) after the resize: `size` itself, or the shorter side set to `size` and the longer scaled
        and truncated as transformers' `get_resize_output_image_size` does."""
        if isinstance(self.size, tuple):
            return self.size
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.size, int(self.size * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)

    def _check_consistent(self) -> None:
        if self.do_center_crop and self.crop_size is None:
            raise ValueError("preprocessor config do_center_crop is true but crop_size is missing")
        if not self.do_center_crop and not (self.do_resize and isinstance(self.size, tuple)):
            raise ValueError(
                "preprocessor config has neither do_center_crop nor do_resize to a size {height, width}: every image "
                "would keep a size of its own; SIE needs one output size per model"
            )


def _defaults_for(given: dict[str, Any]) -> dict[str, Any]:
    processor_type = given.get("image_processor_type", given.get("feature_extractor_type"))
    if processor_type is None:
        raise ValueError(
            "preprocessor config image_processor_type is missing: it names the processor whose defaults apply "
            f"(one of {', '.join(sorted(_DEFAULTS_BY_TYPE))})"
        )
    if processor_type not in _DEFAULTS_BY_TYPE:
        raise ValueError(
            f"preprocessor config image_processor_type {processor_type!r} is not one SIE reads "
            f"(one of {', '.join(sorted(_DEFAULTS_BY_TYPE))})"
        )
    return _DEFAULTS_BY_TYPE[processor_type]


def _flag(settings: dict[str, Any], key: str) -> bool:
    value = settings[key]
    if not isinstance(value, bool):
        raise ValueError(f"preprocessor config {key} must be true or false, got {value!r}")
    return value


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"preprocessor config {key} must hold positive integers, got {value!r}")
    return value


def _size(value: Any, key: str, *, default_to_square: bool) -> int | tuple[int, int]:
    """`size` as transformers' `get_size_dict` reads it: {"shortest_edge": n} or a bare n (unless default_to_square)
    is a shortest edge; {"height", "width"}, [height, width] or a bare n with default_to_square a fixed size."""
    if isinstance(value, dict):
        if set(value) == {"shortest_edge"}:
            return _positive_int(value["shortest_edge"], key)
        if set(value) == {"height", "width"}:
            return _positive_int(value["height"], key), _positive_int(value["width"], key)
        raise ValueError(
            f"preprocessor config {key} must have the keys shortest_edge or height and width, got {sorted(value)}"
        )
    if isinstance(value, list | tuple) and len(value) == 2:
        return _positive_int(value[0], key), _positive_int(value[1], key)
    side = _positive_int(value, key)
    return (side, side) if default_to_square else side


def _crop_size(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    size = _size(value, "crop_size", default_to_square=True)
    if isinstance(size, int):
        raise ValueError("preprocessor config crop_size must have the keys height and width, got shortest_edge")
    return size


def _resample(value: Any) -> int:
    if isinstance(value, bool) or value not in RESAMPLE_FILTERS:
        choices = ", ".join(f"{number} ({name})" for number, name in RESAMPLE_FILTERS.items())
        raise ValueError(f"preprocessor config resample must be one of {choices}, got {value!r}")
    return int(value)


def _rescale_factor(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"preprocessor config rescale_factor must be a positive number, got {value!r}")
    return float(value)


def _per_channel(value: Any, key: str) -> tuple[float, float, float]:
    """A mean or std: one number for every channel, or three (R, G, B)."""
    values = list(value) if isinstance(value, list | tuple) else [value] * 3
    if len(values) != 3 or not all(
        isinstance(number, int | float) and not isinstance(number, bool) and math.isfinite(number) for number in values
    ):
        raise ValueError(f"preprocessor config {key} must be a number or three numbers (R, G, B), got {value!r}")
    if key == "image_std" and any(number == 0 for number in values):
        raise ValueError(f"preprocessor config image_std must not hold zero, got {value!r}")
    return float(values[0]), float(values[1]), float(values[2])


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB as transformers' `convert_to_rgb` makes it: an image with an alpha band or a transparent colour is
    composited onto white, any other converted by Pillow."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def _center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The (height, width) center of channels-first pixels, padded with zeros where they are smaller: the offsets
    of transformers' `image_transforms.center_crop`."""
    _, image_height, image_width = pixels.shape
    top = (image_height - height) // 2
    left = (image_width - width) // 2
    if top >= 0 and left >= 0:
        return pixels[:, top : top + height, left : left + width]
    padded_height = max(height, image_height)
    padded_width = max(width, image_width)
    padded = np.zeros((pixels.shape[0], padded_height, padded_width), dtype=pixels.dtype)
    top_pad = math.ceil((padded_height - image_height) / 2)
    left_pad = math.ceil((padded_width - image_width) / 2)
    padded[:, top_pad : top_pad + image_height, left_pad : left_pad + image_width] = pixels
    top += top_pad
    left += left_pad
    return padded[:, max(0, top) : min(padded_height, top + height), max(0, left) : min(padded_width, left + width)]
