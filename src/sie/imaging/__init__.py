"""Images from untrusted bytes to a model's pixel values, with Pillow and numpy only.

`probe` owns the checks made before anything is decoded (size, format, declared pixels, animation, pixel mode, a
body cut short) and the bounded decode itself; `preprocess` owns the pixel arithmetic of CLIP- and SigLIP-style
image processors, equal to transformers' PIL image processors. It imports no other sie package.
"""

from sie.imaging.preprocess import ImageProcessor
from sie.imaging.probe import (
    SERVED_MODES,
    ImageError,
    ImageInfo,
    ImageLimits,
    decode_base64_image,
    decode_image,
    probe_image,
)

__all__ = [
    "SERVED_MODES",
    "ImageError",
    "ImageInfo",
    "ImageLimits",
    "ImageProcessor",
    "decode_base64_image",
    "decode_image",
    "probe_image",
]
