"""Preparation: each admitted work item becomes an IPC batch item with a batch cost. Encode text is
tokenized with the model's own tokenizer, one `encode_batch` call per group, in a shared thread pool
(never on the event loop); score and extract are not tokenized here (seed 001 "Preparation And Framing").
Offloaded payloads are fetched back first (payloads.py), after the abandonment check, so nobody pays for them.

Costs: encode = prepared-token count; score = the seed's character proxy; extract = 1 ("Scheduling"). An image
model's items with images are decoded and processed into pixel values here (`sie.imaging`, the model's image
processor settings from its descriptor), each image costing its patches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final

import numpy as np

from sie.catalog.options import option_problem
from sie.imaging import ImageError, ImageLimits, ImageProcessor
from sie.sidecar.payloads import PayloadResolver
from sie.sidecar.token_ops import TOKEN_OPERATIONS, token_result
from sie.sidecar.work import Channel, Outbox, ReadyGroup, ReadyModel, Work
from sie.telemetry.tracing import SIDECAR_PREPARE, Tracing
from sie.tokenization import TextTokenizer, TokenizerError, prepare_text
from sie.wire.ipc_batch import (
    OP_ENCODE,
    OP_EXTRACT,
    OP_SCORE,
    EncodeBatchItem,
    ExtractBatchItem,
    PreparedPixels,
    PreparedTokens,
    RunBatchItem,
    ScoreBatchItem,
)
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.queue import WorkItem, WorkResult

logger = logging.getLogger(__name__)

MEDIA_INPUT_COST: Final = 1024
_MEDIA_KEYS: Final = ("images", "image", "audio", "video", "documents", "document")

Fail = Callable[[list[Work]], Awaitable[None]]
# The works of a group somebody still waits for (the others settled): `Settler.live`.
Live = Callable[[list[Work]], Awaitable[list[Work]]]
# Publish the results of works answered here (tokenize, decode): `Settler.reply`.
Answer = Callable[[list[tuple[Work, WorkResult]]], Awaitable[None]]


# --- costs -----------------------------------------------------------------------------------------


def _media_count(item: dict[str, Any]) -> int:
    count = 0
    for key in _MEDIA_KEYS:
        value = item.get(key)
        if isinstance(value, list | tuple):
            count += len(value)
        elif value is not None:
            count += 1
    return count


def input_cost(item: dict[str, Any] | None) -> int:
    """Unicode characters of the text plus 1024 per media input (the seed's model-independent proxy)."""
    if not item:
        return 0
    text = item.get("text")
    chars = len(text) if isinstance(text, str) else 0
    return chars + MEDIA_INPUT_COST * _media_count(item)


def score_cost(query: dict[str, Any] | None, documents: Sequence[dict[str, Any]] | None) -> int:
    """The proxy summed once per query/document pair; at least 1."""
    query_cost = input_cost(query)
    docs = documents or ()
    return max(1, sum(query_cost + input_cost(doc) for doc in docs) if docs else query_cost)


def extract_cost(item: dict[str, Any] | None, max_seq_len: int | None, labels: Sequence[str] | None = None) -> int:
    """The input proxy capped at the model's sequence length, plus the characters of the labels (a zero-shot model
    reads them with every text: 100 labels cost as much as a long text): the batch former then fills a batch by what
    the graph really reads (a 100,000-character text is `max_seq_len` tokens, not 100,000), at least 1."""
    cost = max(1, input_cost(item))
    cost = min(cost, max_seq_len) if max_seq_len else cost
    return cost + sum(len(label) + 1 for label in labels or () if isinstance(label, str))


# --- text preparation (identical to the worker's) ----------------------------------------------------


def encode_text(item: WorkItem, descriptor: ModelDescriptor) -> str | None:
    """The exact text the worker would tokenize: the descriptor's templates overlaid by the item's options.
    None when there is nothing to prepare: no text, or options the worker will refuse (work that skipped a
    gateway's checks), so the worker answers the item INVALID_INPUT with the reason."""
    text = (item.item or {}).get("text")
    if not isinstance(text, str):
        return None
    options = item.options or {}
    if option_problem(options, None, OP_ENCODE) is not None:
        return None
    return prepare_text(
        text,
        is_query=item.is_query,
        instruction=item.instruction or options.get("instruction"),
        query_template=options.get("query_template", descriptor.default_query_template),
        doc_template=options.get("doc_template", descriptor.default_doc_template),
    )


def _reusable(item: WorkItem) -> bool:
    # With `truncate: false` the worker must see the full text to refuse it, so no prepared tokens.
    return (item.options or {}).get("truncate") is not False


# --- images ----------------------------------------------------------------------------------------

# What the sidecar decodes at most, whatever the gateway's limits (SIE_GATEWAY_MAX_IMAGE_*) let through: a ceiling
# against work that reached the queue past a gateway.
PREPARE_IMAGE_LIMITS: Final = ImageLimits(max_bytes=256 * 1024 * 1024, max_pixels=89_478_485)


def item_images(item: dict[str, Any] | None) -> list[Any]:
    """The item's images as they travel (`{"data": bytes, "format": ...}` maps); [] when it has none."""
    images = (item or {}).get("images")
    return images if isinstance(images, list) else []


def prepare_pixels(processor: ImageProcessor, item: dict[str, Any] | None) -> PreparedPixels:
    """Pixel values [images, 3, height, width] of the item's images, or the first one's problem."""
    arrays = []
    for number, image in enumerate(item_images(item)):
        data = image.get("data") if isinstance(image, dict) else None
        if not isinstance(data, bytes | bytearray):
            return PreparedPixels(error=f"Image {number} has no bytes")
        try:
            arrays.append(processor(bytes(data), PREPARE_IMAGE_LIMITS))
        except ImageError as exc:
            return PreparedPixels(error=f"Image {number}: {exc}")
    return PreparedPixels(pixel_values=np.stack(arrays))


class ImageProcessors:
    """One ImageProcessor per distinct image processor config, built on first use."""

    def __init__(self) -> None:
        self._built: dict[str, ImageProcessor] = {}

    def get(self, config: dict[str, Any]) -> ImageProcessor:
        key = json.dumps(config, sort_keys=True)
        processor = self._built.get(key)
        if processor is None:
            processor = self._built[key] = ImageProcessor.from_dict(config)
        return processor


# --- IPC items -------------------------------------------------------------------------------------


def encode_item(item: WorkItem, prepared: PreparedTokens | None, pixels: PreparedPixels | None = None) -> RunBatchItem:
    body = EncodeBatchItem(
        work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
        total_items=item.total_items, timestamp=item.timestamp, item=item.item or {},
        output_types=item.output_types, instruction=item.instruction, is_query=item.is_query,
        options=item.options, profile_id=item.profile_id, bundle_config_hash=item.bundle_config_hash,
        prepared_tokens=prepared, prepared_pixels=pixels,
    )  # fmt: skip
    return _run_item(item, OP_ENCODE, encode=body)


def score_item(item: WorkItem, pixels: list[PreparedPixels | None] | None = None) -> RunBatchItem:
    body = ScoreBatchItem(
        work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
        total_items=item.total_items, timestamp=item.timestamp, query_item=item.query_item or {},
        score_items=item.score_items or [], instruction=item.instruction, options=item.options,
        profile_id=item.profile_id, bundle_config_hash=item.bundle_config_hash, prepared_pixels=pixels,
    )  # fmt: skip
    return _run_item(item, OP_SCORE, score=body)


def extract_item(item: WorkItem) -> RunBatchItem:
    body = ExtractBatchItem(
        work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
        total_items=item.total_items, timestamp=item.timestamp, item=item.item or {}, labels=item.labels,
        output_schema=item.output_schema, instruction=item.instruction, options=item.options,
        profile_id=item.profile_id, bundle_config_hash=item.bundle_config_hash,
    )  # fmt: skip
    return _run_item(item, OP_EXTRACT, extract=body)


def _run_item(item: WorkItem, op: str, **body: Any) -> RunBatchItem:
    return RunBatchItem(
        op=op, work_item_id=item.work_item_id, request_id=item.request_id, item_index=item.item_index,
        traceparent=item.traceparent, tracestate=item.tracestate, **body,
    )  # fmt: skip


def prepare_unencoded(works: Sequence[Work], descriptor: ModelDescriptor) -> None:
    """Score and extract items: no tokenization, a cost proxy, the IPC item."""
    for work in works:
        item = work.item
        if item.operation == OP_SCORE:
            work.cost = score_cost(item.query_item, item.score_items)
            work.run_item = score_item(item)
        else:
            # a GLiNER relation model reads the relation types with every text, as it reads the labels
            relation_labels = (item.options or {}).get("relation_labels")
            labels = [*(item.labels or ()), *(relation_labels if isinstance(relation_labels, list) else ())]
            work.cost = extract_cost(item.item, descriptor.max_seq_len, labels)
            work.run_item = extract_item(item)


# --- the stage -------------------------------------------------------------------------------------


class TokenizerCache:
    """One TextTokenizer per `tokenizer_id`, loaded once from the descriptor's path in the executor."""

    def __init__(self, executor: Executor) -> None:
        self._executor = executor
        self._loaded: dict[str, asyncio.Future[TextTokenizer | None]] = {}

    async def get(self, descriptor: ModelDescriptor) -> TextTokenizer | None:
        """The model's tokenizer, or None when it has none or it cannot be read (the worker tokenizes)."""
        key, path = descriptor.tokenizer_id, descriptor.tokenizer_path
        if not key or not path:
            return None
        future = self._loaded.get(key)
        if future is None:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self._executor, _load_tokenizer, path, descriptor.max_seq_len, key)
            self._loaded[key] = future
        return await asyncio.shield(future)


def _load_tokenizer(path: str, max_seq_len: int | None, expected_id: str) -> TextTokenizer | None:
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    try:
        tokenizer = TextTokenizer.from_file(file, max_length=max_seq_len or 512)
    except TokenizerError:
        logger.warning("cannot load tokenizer %s; the worker will tokenize", file, exc_info=True)
        return None
    if tokenizer.tokenizer_id != expected_id:
        logger.warning("tokenizer %s has id %s, the worker said %s; the worker will tokenize",
                       file, tokenizer.tokenizer_id, expected_id)  # fmt: skip
        return None
    return tokenizer


class Preparer:
    """The preparation stage: prepares each ready group and passes it to `out` (the scheduler); when a group's
    preparation fails, its items are prepared one by one and those that still fail go to `fail` (answered).
    Tokenize and decode items are answered here through `answer` (token_ops.py; results stamped `worker_id`).
    Several `serve` loops may share one inbox. With `payloads`, offloaded payloads are fetched back before
    anything else is done with them. With `tracing` on, each group is a `sidecar.prepare` span."""

    def __init__(  # noqa: PLR0913 - the stage's collaborators, each optional but the first three
        self,
        executor: Executor,
        out: Outbox[ReadyGroup],
        fail: Fail,
        live: Live | None = None,
        payloads: PayloadResolver | None = None,
        tracing: Tracing | None = None,
        *,
        answer: Answer | None = None,
        worker_id: str = "",
    ) -> None:
        self._executor = executor
        self._live = live
        self._payloads = payloads
        self._out = out
        self._fail = fail
        self._answer = answer
        self._worker_id = worker_id
        self._tokenizers = TokenizerCache(executor)
        self._image_processors = ImageProcessors()
        self._tracing = tracing or Tracing.off()

    async def serve(self, inbox: Channel[ReadyGroup]) -> None:
        """One of the stage's loops: prepare each group as it arrives."""
        while True:
            model, works = await inbox.get()
            works = await self._prepare_traced(model, works)
            if works:
                await self._out.put((model, works))

    async def _prepare_group(self, model: ReadyModel, works: list[Work]) -> list[Work]:
        """The group's live works, prepared (those that failed alone were answered through `fail`)."""
        try:
            if self._live is not None:  # before tokenization: nobody pays for abandoned text
                works = await self._live(works)
            if self._payloads is not None and works:
                works = await self._payloads.resolve(works)
            if any(work.item.operation in TOKEN_OPERATIONS for work in works):
                works = await self._answer_token_works(model, works)
            if works:
                await self.prepare(model, works)
        except Exception:  # noqa: BLE001 - a preparation bug must not kill the stage: each item on its own
            logger.warning("preparing %d items of %s failed; preparing them one by one", len(works),
                           model.model_id, exc_info=True)  # fmt: skip
            works = await self._prepare_one_by_one(model, works)
        return works

    async def _answer_token_works(self, model: ReadyModel, works: list[Work]) -> list[Work]:
        """Answer the group's tokenize and decode items with the model's tokenizer; the other works, to prepare."""
        if self._answer is None:
            raise RuntimeError("tokenize and decode items reached a preparation stage that cannot answer; a bug")
        answered = [work for work in works if work.item.operation in TOKEN_OPERATIONS]
        rest = [work for work in works if work.item.operation not in TOKEN_OPERATIONS]
        descriptor = model.descriptor

        def results(tokenizer: TextTokenizer | None) -> list[WorkResult]:
            return [token_result(work.item, tokenizer, descriptor, self._worker_id) for work in answered]

        try:
            tokenizer = await self._tokenizers.get(descriptor)
            computed = await asyncio.get_running_loop().run_in_executor(self._executor, results, tokenizer)
        except Exception:  # noqa: BLE001 - a bug answers these items (logged), never their batch-mates
            logger.exception("tokenizing or decoding %d items of %s failed", len(answered), model.model_id)
            await self._fail(answered)
            return rest
        await self._answer(list(zip(answered, computed, strict=True)))
        return rest

    async def _prepare_traced(self, model: ReadyModel, works: list[Work]) -> list[Work]:
        """`_prepare_group` in a span continuing the items' traces; with tracing on, stamps when each work's batch
        wait starts (the `sidecar.batch_wait` span's start)."""
        with self._tracing.span(SIDECAR_PREPARE, works) as span:
            if span.is_recording():
                span.set_attributes({"sie.model": model.model_id, "sie.items": len(works)})
            works = await self._prepare_group(model, works)
        if self._tracing.enabled:
            prepared = time.monotonic()
            for work in works:
                work.prepared = prepared
        return works

    async def _prepare_one_by_one(self, model: ReadyModel, works: list[Work]) -> list[Work]:
        """The items of a failed group that prepare alone; the others go to `fail` (answered, never redelivered
        into the same failure), so one bad item does not hold back its batch-mates."""
        prepared, failed = [], []
        # Tokenize and decode items are answered before anything can fail here; one still here is unsettled (its
        # answer could not be published) and is left for redelivery.
        for work in (work for work in works if work.item.operation not in TOKEN_OPERATIONS):
            try:
                await self.prepare(model, [work])
            except Exception:  # noqa: BLE001 - logged with its traceback, answered through `fail`
                logger.exception("preparing %s (%s) failed", work.item.work_item_id, model.model_id)
                failed.append(work)
            else:
                prepared.append(work)
        if failed:
            await self._fail(failed)
        return prepared

    async def prepare(self, model: ReadyModel, works: list[Work]) -> None:
        """Fill in cost and IPC item of every work item of one model."""
        encode = [work for work in works if work.item.operation == OP_ENCODE]
        if len(encode) != len(works):
            prepare_unencoded([work for work in works if work.item.operation != OP_ENCODE], model.descriptor)
            if model.descriptor.image_processor:
                await self._prepare_score_images(model.descriptor, works)
        if encode:
            await self._prepare_encode(model.descriptor, encode)

    async def _prepare_score_images(self, descriptor: ModelDescriptor, works: list[Work]) -> None:
        """An image model's score items with images: the pixels of the query and of each candidate, prepared in the
        executor like encode's."""
        pictured = [work for work in works if work.item.operation == OP_SCORE and any(
            item_images(entry) for entry in [work.item.query_item, *(work.item.score_items or [])])]  # fmt: skip
        if not pictured:
            return
        processor = self._image_processors.get(descriptor.image_processor or {})

        def pixels(item: WorkItem) -> list[PreparedPixels | None]:
            entries = [item.query_item, *(item.score_items or [])]
            return [prepare_pixels(processor, entry) if item_images(entry) else None for entry in entries]

        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(self._executor, lambda: [pixels(work.item) for work in pictured])
        for work, entry_pixels in zip(pictured, prepared, strict=True):
            work.run_item = score_item(work.item, entry_pixels)

    async def _prepare_encode(self, descriptor: ModelDescriptor, works: list[Work]) -> None:
        if descriptor.image_processor:
            pictured = [work for work in works if item_images(work.item.item)]
            if pictured:
                await self._prepare_images(descriptor, pictured)
                works = [work for work in works if not item_images(work.item.item)]
        if works:
            await self._prepare_texts(descriptor, works)

    async def _prepare_images(self, descriptor: ModelDescriptor, works: list[Work]) -> None:
        """Each item's images as the model's pixel values (decoded and processed in the executor, never on the event
        loop); an image that cannot be decoded becomes that item's error, which the worker answers."""
        processor = self._image_processors.get(descriptor.image_processor or {})
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(
            self._executor, lambda: [prepare_pixels(processor, work.item.item) for work in works]
        )
        prep_ms = (time.perf_counter() - started) * 1000.0
        for work, pixels in zip(works, prepared, strict=True):
            work.prep_ms = prep_ms
            work.cost = max(1, (descriptor.image_cost or MEDIA_INPUT_COST) * len(item_images(work.item.item)))
            work.run_item = encode_item(work.item, None, pixels)

    async def _prepare_texts(self, descriptor: ModelDescriptor, works: list[Work]) -> None:
        texts = [encode_text(work.item, descriptor) for work in works]
        tokenizer = await self._tokenizers.get(descriptor)
        indices = [index for index, text in enumerate(texts) if text is not None]
        if tokenizer is None or not indices:
            for work, text in zip(works, texts, strict=True):
                work.cost = len(text) if text is not None else max(1, input_cost(work.item.item))
                work.run_item = encode_item(work.item, None)
            return
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        encoded = await loop.run_in_executor(self._executor, tokenizer.encode_batch, [texts[i] for i in indices])
        prep_ms = (time.perf_counter() - started) * 1000.0
        tokens: list[Any] = [None] * len(works)
        for index, tokenized in zip(indices, encoded, strict=True):
            tokens[index] = tokenized
        for work, tokenized in zip(works, tokens, strict=True):
            work.prep_ms = prep_ms
            _attach(work, tokenized, tokenizer, descriptor)


def _attach(work: Work, tokenized: Any, tokenizer: TextTokenizer, descriptor: ModelDescriptor) -> None:
    if tokenized is None:  # no text: media input, the worker decides
        work.cost = max(1, input_cost(work.item.item))
        work.run_item = encode_item(work.item, None)
        return
    work.cost = max(1, len(tokenized.input_ids))
    prepared = None
    if _reusable(work.item):
        prepared = PreparedTokens(
            input_ids=[tokenized.input_ids],
            tokenizer_id=tokenizer.tokenizer_id,
            token_type_ids=[tokenized.token_type_ids],
            max_seq_len=descriptor.max_seq_len or tokenizer.max_length,
        )
    work.run_item = encode_item(work.item, prepared)
