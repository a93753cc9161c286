"""Image–text embeddings (CLIP, SigLIP): texts and images encoded into one space by the converted towers
(`sie.worker.convert.clip`: the text graph is the session, the vision graph runs beside it).

An item with images is encoded by the vision tower (its text, if any, is not read: the public adapters do the same),
each image L2-normalised when `normalize` is on and the images of one item averaged; an item with only text by the
text tower. Images arrive as pixel values the sidecar prepared with the model's image processor (`PreparedPixels`),
or are decoded and processed here (`sie.imaging`) when they did not. SigLIP reads every text padded to its full
length, as its processor pads them (`padding="max_length"`), with no attention mask.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import numpy as np

from sie.catalog.adapters import IMAGE_TEXT
from sie.imaging import ImageError, ImageLimits, ImageProcessor
from sie.tokenization import PaddedBatch, TokenizedText, pad_batch
from sie.wire.ipc_batch import OP_ENCODE, OP_SCORE, PreparedPixels
from sie.worker.adapters.base import AdapterContext, BatchResult, ItemResult, Stopwatch, invalid
from sie.worker.adapters.encoder import EncodeSpec, TextEncoderAdapter, check_width, ranked_scores
from sie.worker.convert.names import (
    IMAGE_EMBEDS,
    LOGIT_BIAS_KEY,
    LOGIT_SCALE_KEY,
    PIXEL_VALUES,
    PREPROCESSOR_CONFIG_FILE,
    TEXT_EMBEDS,
)
from sie.worker.outputs import l2_normalize, quantize

# What the worker decodes at most when it prepares images itself (the sidecar's ceiling too).
IMAGE_LIMITS: Final = ImageLimits(max_bytes=256 * 1024 * 1024, max_pixels=89_478_485)
# Images one vision run holds: a larger batch runs in parts, so activation memory stays bounded.
IMAGES_PER_RUN: Final = 32


class ImageTextAdapter(TextEncoderAdapter):
    """`sie.adapters.image_text`: a dense vector per text or per item's images, in one space."""

    kind: ClassVar[str | None] = IMAGE_TEXT
    encode_outputs: ClassVar[tuple[str, ...]] = ("dense",)
    supports_score: ClassVar[bool] = True

    def __init__(self, context: AdapterContext) -> None:
        super().__init__(context)
        self.vision = context.extra_sessions.get("vision")
        path = context.model_dir / PREPROCESSOR_CONFIG_FILE if context.model_dir is not None else None
        if self.vision is None or path is None or not path.is_file():
            raise ValueError(f"an image–text model needs its vision graph and {PREPROCESSOR_CONFIG_FILE}")
        self.image_processor_config = json.loads(path.read_text(encoding="utf-8"))
        self.processor = ImageProcessor.from_dict(dict(self.image_processor_config))
        config = context.model_config_json
        self.model_type = str(config.get("model_type", ""))
        # SigLIP pads with its text config's pad token (its tokenizer's `</s>`, not the vocabulary's `<pad>`).
        pad = (config.get("text_config") or {}).get("pad_token_id")
        self.text_pad_id = int(pad) if isinstance(pad, int) else self.tokenizer.pad_id
        vision = config.get("vision_config") or {}
        patches = (int(vision.get("image_size", 224)) // int(vision.get("patch_size", 32))) ** 2
        self.image_cost = patches + (1 if self.model_type == "clip" else 0)  # CLIP reads a class token too
        similarity = self.session.get_modelmeta().custom_metadata_map
        # The model's own similarity for score: exp(logit_scale) × cosine, plus SigLIP's bias through a sigmoid.
        self.logit_scale = float(np.exp(float(similarity[LOGIT_SCALE_KEY]))) if LOGIT_SCALE_KEY in similarity else None
        self.logit_bias = float(similarity[LOGIT_BIAS_KEY]) if LOGIT_BIAS_KEY in similarity else None
        width = next(node.shape[-1] for node in self.session.get_outputs() if node.name == TEXT_EMBEDS)
        check_width(self.model, "dense", width if isinstance(width, int) else None, "the model gives")

    # --- encode: image items here, text items through the text encoder ---------------------------------------

    def encode(self, items: Sequence[Any]) -> BatchResult:
        pictured = [index for index, item in enumerate(items) if _has_images(item)]
        if not pictured:
            return super().encode(items)
        pictured_set = set(pictured)
        texts = [index for index in range(len(items)) if index not in pictured_set]
        results: list[ItemResult] = [ItemResult() for _ in items]
        watch = Stopwatch()
        text_part = super().encode([items[index] for index in texts]) if texts else BatchResult([])
        for index, result in zip(texts, text_part.items, strict=True):
            results[index] = result
        self._encode_images([(index, items[index]) for index in pictured], results, watch)
        finished = watch.finish(results)
        finished.tokenization_ms += text_part.tokenization_ms
        finished.inference_ms += text_part.inference_ms
        finished.postprocessing_ms += text_part.postprocessing_ms
        return finished

    def _encode_images(self, pictured: list[tuple[int, Any]], results: list[ItemResult], watch: Stopwatch) -> None:
        """Every pictured item's images through the vision tower; each item's vector the mean of its images'."""
        prepared: list[tuple[int, np.ndarray, str, bool]] = []  # (item, pixels, output dtype, normalize)
        with watch.stage("tokenization"):
            for index, item in pictured:
                refused = self.refused_options(item.options, OP_ENCODE) or self._refused_outputs(item)
                if refused is not None:
                    results[index] = refused
                    continue
                pixels = self._pixels(item.item, getattr(item, "prepared_pixels", None))
                if isinstance(pixels, str):
                    results[index] = invalid(pixels)
                    continue
                options = self.options_for(item.options)
                dtype = str(options.get("output_dtype") or "float32")
                prepared.append((index, pixels, dtype, bool(options.get("normalize", True))))
        if not prepared:
            return
        with watch.stage("inference"):
            embeds = self._image_embeds([pixels for _, pixels, _, _ in prepared])
        with watch.stage("postprocessing"):
            for (index, _, dtype, normalize), vectors in zip(prepared, embeds, strict=True):
                vectors = l2_normalize(vectors) if normalize else vectors
                vector = vectors[0] if len(vectors) == 1 else vectors.mean(axis=0)
                dense = {"dims": int(vector.shape[0]), "dtype": dtype, "values": quantize(vector, dtype)}
                results[index] = ItemResult(result={"dense": dense}, input_tokens=0)

    def _refused_outputs(self, item: Any) -> ItemResult | None:
        options = self.options_for(item.options)
        wanted = set(item.output_types or options.get("output_types") or (self.default_output,))
        if wanted - set(self.encode_outputs):
            return invalid(f"Model '{self.model.sie_id}' does not support output types: {wanted - {'dense'}}. "
                           "Supported: {'dense'}")  # fmt: skip
        return None

    def _image_embeds(self, pixel_sets: list[np.ndarray]) -> list[np.ndarray]:
        """The vision tower's embeddings of every set of pixel values [images, 3, height, width], all sets run
        together in parts of IMAGES_PER_RUN images: one [images, width] array per set."""
        stacked = np.concatenate(pixel_sets).astype(np.float32, copy=False)
        parts = [
            self.vision.run([IMAGE_EMBEDS], {PIXEL_VALUES: stacked[start : start + IMAGES_PER_RUN]})[0]
            for start in range(0, len(stacked), IMAGES_PER_RUN)
        ]
        embeds = np.concatenate(parts).astype(np.float32, copy=False)
        return np.split(embeds, np.cumsum([len(pixels) for pixels in pixel_sets])[:-1])

    def _pixels(self, item: dict[str, Any] | None, prepared: PreparedPixels | None) -> np.ndarray | str:
        """An item's (or score entry's) pixel values [images, 3, height, width]: the sidecar's `prepared`, else
        made here from its images; or why they cannot be."""
        if prepared is not None:
            if prepared.error:
                return prepared.error
            if prepared.pixel_values is not None:
                return prepared.pixel_values
        arrays = []
        for number, image in enumerate((item or {}).get("images") or []):
            data = image.get("data") if isinstance(image, dict) else None
            if not isinstance(data, bytes | bytearray):
                return f"Image {number} has no bytes"
            try:
                arrays.append(self.processor(bytes(data), IMAGE_LIMITS))
            except ImageError as exc:
                return f"Image {number}: {exc}"
        return np.stack(arrays)

    # --- score: the model's own similarity between a query and each candidate, text or images -----------------

    def score(self, items: Sequence[Any]) -> BatchResult:
        watch = Stopwatch()
        results: list[ItemResult] = []
        for item in items:
            refused = self.refused_options(item.options, OP_SCORE)
            if refused is not None:
                results.append(refused)
                continue
            entries = [item.query_item or {}, *(item.score_items or [])]
            embedded = self._entry_vectors(entries, getattr(item, "prepared_pixels", None), watch)
            if isinstance(embedded, str):
                results.append(invalid(embedded))
                continue
            vectors, tokens = embedded
            with watch.stage("postprocessing"):
                logits = (self.logit_scale or 1.0) * (vectors[1:] @ vectors[0])
                if self.logit_bias is not None:  # SigLIP: each pair's own probability
                    logits = 0.5 * (1.0 + np.tanh(0.5 * (logits + self.logit_bias)))
                results.append(ItemResult(ranked_scores(logits.tolist(), item.score_items), input_tokens=tokens))
        return watch.finish(results)

    def _entry_vectors(
        self, entries: list[dict[str, Any]], prepared: list[Any] | None, watch: Stopwatch
    ) -> tuple[np.ndarray, int] | str:
        """One L2-normalised vector per entry (its images' mean, else its text) and the tokens its texts took, or why
        an entry cannot be read; `prepared` holds the sidecar's pixels of each entry (None: made here)."""
        texts = {index: entry.get("text") for index, entry in enumerate(entries) if not entry.get("images")}
        if any(not isinstance(text, str) for text in texts.values()):
            return "Every score query and item needs a text or images"
        pixels: dict[int, np.ndarray] = {}
        with watch.stage("tokenization"):
            for index, entry in enumerate(entries):
                if index not in texts:
                    sidecar = prepared[index] if prepared is not None and index < len(prepared) else None
                    made = self._pixels(entry, sidecar)
                    if isinstance(made, str):
                        return made
                    pixels[index] = made
            tokens = [self.fit(t, False, {}) for t in self.tokenizer.encode_batch(list(texts.values()))]
        with watch.stage("inference"):
            rows: dict[int, np.ndarray] = {}
            if texts:
                embedded = self.forward(self.pad(tokens, [(False, {})] * len(tokens)))[0]
                rows.update(zip(texts, l2_normalize(embedded.astype(np.float32, copy=False)), strict=True))
            if pixels:
                for index, embedded in zip(pixels, self._image_embeds(list(pixels.values())), strict=True):
                    rows[index] = l2_normalize(l2_normalize(embedded).mean(axis=0)[None, :])[0]
        return np.stack([rows[index] for index in range(len(entries))]), sum(len(t.input_ids) for t in tokens)

    # --- the text tower -----------------------------------------------------------------------------------------

    def pad(self, tokens: Sequence[TokenizedText], roles: Sequence[tuple[bool, Mapping[str, Any]]]) -> PaddedBatch:
        if self.model_type != "siglip":
            return pad_batch([t.input_ids for t in tokens], [t.token_type_ids for t in tokens], self.tokenizer.pad_id)
        # SigLIP reads every text at its full length, its pad token included (its processor pads to max_length).
        full = max([self.tokenizer.max_length, *(len(t.input_ids) for t in tokens)])
        ids = np.full((len(tokens), full), self.text_pad_id, dtype=np.int64)
        for row, tokenized in enumerate(tokens):
            ids[row, : len(tokenized.input_ids)] = tokenized.input_ids
        return PaddedBatch(ids, np.ones_like(ids), np.zeros_like(ids))

    def forward(self, batch: PaddedBatch) -> list[np.ndarray]:
        feeds = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        return self.run_session(feeds, [TEXT_EMBEDS])

    def represent(self, outputs: list[np.ndarray], batch: PaddedBatch, specs: list[EncodeSpec]) -> list[dict]:
        results = []
        for vector, spec in zip(outputs[0].astype(np.float32, copy=False), specs, strict=True):
            if spec.options.get("normalize", True):
                vector = l2_normalize(vector[None, :])[0]
            dense = {
                "dims": int(vector.shape[0]),
                "dtype": spec.output_dtype,
                "values": quantize(vector, spec.output_dtype),
            }
            results.append({"dense": dense})
        return results

    def similarities(self, outputs: list[np.ndarray], batch: PaddedBatch, query: int, docs: range) -> np.ndarray:
        vectors = l2_normalize(outputs[0][[query, *docs]].astype(np.float32, copy=False))
        return vectors[1:] @ vectors[0]


def _has_images(item: Any) -> bool:
    images = (item.item or {}).get("images")
    return bool(images) or getattr(item, "prepared_pixels", None) is not None
