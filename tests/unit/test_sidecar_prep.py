"""Preparation: cost functions, text preparation identical to the worker's, and the stage that
tokenizes a group in one call and attaches PreparedTokens only when they can be reused."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers, processors

from sie.sidecar.prep import (
    MEDIA_INPUT_COST,
    Preparer,
    encode_text,
    input_cost,
    score_cost,
)
from sie.sidecar.work import BatchLimits, Channel, ReadyGroup, ReadyModel, Work
from sie.tokenization import TextTokenizer, prepare_text
from sie.wire.ipc_control import ModelDescriptor
from sie.wire.queue import WorkItem

VOCAB = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "query:": 6, "find": 7}


class _Delivery:
    def __init__(self, item: WorkItem) -> None:
        self.item = item
        self.subject = "sie.work.default.default.default.m"
        self.num_delivered = 1


def item(index: int = 0, operation: str = "encode", **fields) -> WorkItem:
    return WorkItem(
        work_item_id=f"r{index}.0", request_id=f"r{index}", item_index=0, total_items=1, operation=operation,
        model_id="m", profile_id="default", pool_name="default", machine_profile="default", router_id="gw",
        reply_subject=f"_INBOX.gw.r{index}", timestamp=0.0, **fields,
    )  # fmt: skip


@pytest.fixture()
def tokenizer_file(tmp_path: Path) -> Path:
    tok = tokenizers.Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def ready(tokenizer_file: Path | None, **descriptor) -> ReadyModel:
    if tokenizer_file is not None:
        tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=6)
        descriptor.setdefault("tokenizer_path", str(tokenizer_file))
        descriptor.setdefault("tokenizer_id", tokenizer.tokenizer_id)
        descriptor.setdefault("max_seq_len", 6)
    return ReadyModel("m", ModelDescriptor(**descriptor), BatchLimits(100, 8))


# --- costs ----------------------------------------------------------------------------------------


def test_input_cost_counts_unicode_characters_and_media() -> None:
    assert input_cost({"text": "héllo"}) == 5
    assert input_cost({"text": "ab", "images": [{"data": b""}, {"data": b""}]}) == 2 + 2 * MEDIA_INPUT_COST
    assert input_cost(None) == 0


def test_score_cost_sums_each_query_document_pair() -> None:
    assert score_cost({"text": "abc"}, [{"text": "d"}, {"text": "efgh"}]) == (3 + 1) + (3 + 4)
    assert score_cost({"text": ""}, []) == 1


# --- text -----------------------------------------------------------------------------------------


def test_encode_text_matches_the_worker_overlay() -> None:
    descriptor = ModelDescriptor(default_query_template="query: {text}", default_doc_template="passage: {text}")
    query = item(item={"text": "find"}, is_query=True, instruction="Retrieve:")
    assert encode_text(query, descriptor) == prepare_text(
        "find", is_query=True, instruction="Retrieve:", query_template="query: {text}"
    )
    # The item's options override the profile's templates, even with None (as the worker's dict overlay).
    doc = item(item={"text": "hello"}, options={"doc_template": None})
    assert encode_text(doc, descriptor) == "hello"
    assert encode_text(item(item={"text": "hello"}), descriptor) == "passage: hello"
    assert encode_text(item(item={"images": []}), descriptor) is None


@pytest.mark.parametrize("options", [{"doc_template": {"a": 1}}, {"query_template": "{text}{text}"}, {"normalize": []}])
def test_options_the_worker_refuses_are_left_unprepared(options) -> None:
    """Work that skipped a gateway's checks: nothing is tokenized, so the worker answers INVALID_INPUT itself."""
    assert encode_text(item(item={"text": "hello"}, options=options), ModelDescriptor()) is None


# --- the stage ------------------------------------------------------------------------------------


async def prepare(model: ReadyModel, works: list[Work]) -> None:
    with ThreadPoolExecutor(2) as executor:

        async def fail(works: list[Work]) -> None:
            raise AssertionError("preparation failed")

        preparer = Preparer(executor, Channel(1), fail)
        await preparer.prepare(model, works)


async def test_encode_group_gets_prepared_tokens_and_token_costs(tokenizer_file: Path) -> None:
    works = [Work(_Delivery(item(0, item={"text": "hello world"})), 0.0),
             Work(_Delivery(item(1, item={"text": "hello"})), 0.0)]  # fmt: skip
    model = ready(tokenizer_file)
    await prepare(model, works)
    first = works[0].run_item.encode.prepared_tokens
    assert [row.tolist() for row in first.input_ids] == [[2, 4, 5, 3]]
    assert [row.tolist() for row in first.token_type_ids] == [[0, 0, 0, 0]]
    assert first.input_ids[0].dtype == np.int64  # arrays from the tokenizer to the worker, never lists
    assert first.tokenizer_id == model.descriptor.tokenizer_id and first.max_seq_len == 6
    assert [w.cost for w in works] == [4, 3]
    assert works[0].run_item.op == "encode" and works[0].run_item.work_item_id == "r0.0"


async def test_truncate_false_leaves_tokenization_to_the_worker(tokenizer_file: Path) -> None:
    works = [Work(_Delivery(item(0, item={"text": "hello " * 20}, options={"truncate": False})), 0.0)]
    await prepare(ready(tokenizer_file), works)
    assert works[0].run_item.encode.prepared_tokens is None
    assert works[0].cost == 6  # still costed by the (truncated) token count


async def test_without_a_tokenizer_the_cost_is_the_character_proxy() -> None:
    works = [Work(_Delivery(item(0, item={"text": "hello world"})), 0.0)]
    await prepare(ready(None), works)
    assert works[0].run_item.encode.prepared_tokens is None and works[0].cost == len("hello world")


async def test_a_tokenizer_with_another_id_is_not_used(tokenizer_file: Path) -> None:
    works = [Work(_Delivery(item(0, item={"text": "hello"})), 0.0)]
    await prepare(ready(tokenizer_file, tokenizer_id="0" * 32), works)
    assert works[0].run_item.encode.prepared_tokens is None


async def test_score_and_extract_are_costed_without_tokenizing(tokenizer_file: Path) -> None:
    score = item(0, "score", query_item={"text": "ab"}, score_items=[{"text": "c"}, {"text": "de"}])
    extract = item(1, "extract", item={"text": "hey"}, labels=["person"])
    long_extract = item(2, "extract", item={"text": "a long text " * 1000})
    relations = item(3, "extract", item={"text": "hey"}, labels=["person"], options={"relation_labels": ["born in"]})
    works = [Work(_Delivery(one), 0.0) for one in (score, extract, long_extract, relations)]
    await prepare(ready(tokenizer_file), works)
    assert works[0].cost == 3 + 4 and works[0].run_item.score.score_items == [{"text": "c"}, {"text": "de"}]
    # Extract is costed by its characters up to the model's sequence length (6 here), what the graph reads, plus its
    # labels' (a zero-shot model reads them with the text).
    assert works[1].cost == 3 + len("person") + 1 and works[1].run_item.extract.labels == ["person"]
    assert works[2].cost == 6
    # and a relation model's relation types, read with them
    assert works[3].cost == 3 + len("person") + 1 + len("born in") + 1


async def test_group_is_tokenized_in_one_call(tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = TextTokenizer.encode_batch

    def counting(self, texts):
        calls.append(len(texts))
        return original(self, texts)

    monkeypatch.setattr(TextTokenizer, "encode_batch", counting)
    works = [Work(_Delivery(item(i, item={"text": "hello"})), 0.0) for i in range(5)]
    await prepare(ready(tokenizer_file), works)
    assert calls == [5]


async def test_stage_hands_prepared_groups_to_the_scheduler(tokenizer_file: Path) -> None:
    inbox: Channel[ReadyGroup] = Channel(2)
    out: Channel[ReadyGroup] = Channel(2)
    with ThreadPoolExecutor(2) as executor:

        async def fail(works: list[Work]) -> None:
            raise AssertionError("preparation failed")

        serving = asyncio.ensure_future(Preparer(executor, out, fail).serve(inbox))
        try:
            await inbox.put((ready(tokenizer_file), [Work(_Delivery(item(0, item={"text": "hello"})), 0.0)]))
            model, works = await asyncio.wait_for(out.get(), 5.0)
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    assert (model.model_id, len(works)) == ("m", 1) and works[0].run_item is not None


async def test_a_group_that_fails_to_prepare_is_prepared_item_by_item_and_only_the_bad_item_fails(
    tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = TextTokenizer.encode_batch

    def choking(self, texts):
        if "poison" in texts:
            raise RuntimeError("the tokenizer choked")
        return original(self, texts)

    monkeypatch.setattr(TextTokenizer, "encode_batch", choking)
    inbox: Channel[ReadyGroup] = Channel(2)
    out: Channel[ReadyGroup] = Channel(2)
    failed: list[str] = []
    with ThreadPoolExecutor(2) as executor:

        async def fail(works: list[Work]) -> None:
            failed.extend(work.item.work_item_id for work in works)

        serving = asyncio.ensure_future(Preparer(executor, out, fail).serve(inbox))
        try:
            texts = ["hello", "poison", "world"]
            group = [Work(_Delivery(item(index, item={"text": text})), 0.0) for index, text in enumerate(texts)]
            await inbox.put((ready(tokenizer_file), group))
            _, works = await asyncio.wait_for(out.get(), 5.0)
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    assert failed == ["r1.0"]
    assert [work.item.work_item_id for work in works] == ["r0.0", "r2.0"]
    assert all(work.run_item is not None for work in works)


# --- tokenize and decode items: answered here, never scheduled ---------------------------------------------


async def answered_by_the_stage(model: ReadyModel, group: list[Work]) -> tuple[list, list[Work], list[str]]:
    """(the results the stage answered, the works it passed on, the work ids it failed) for one group."""
    inbox: Channel[ReadyGroup] = Channel(2)
    out: Channel[ReadyGroup] = Channel(2)
    answers: list = []
    failed: list[str] = []

    async def answer(replies) -> None:
        answers.extend(replies)

    async def fail(works: list[Work]) -> None:
        failed.extend(work.item.work_item_id for work in works)

    with ThreadPoolExecutor(2) as executor:
        stage = Preparer(executor, out, fail, answer=answer, worker_id="w-1")
        serving = asyncio.ensure_future(stage.serve(inbox))
        try:
            await inbox.put((model, group))
            passed: list[Work] = []
            if any(work.item.operation not in ("tokenize", "decode") for work in group):
                _, passed = await asyncio.wait_for(out.get(), 5.0)
            for _ in range(50):
                if len(answers) + len(failed) >= len(group) - len(passed):
                    break
                await asyncio.sleep(0.02)
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    return answers, passed, failed


@pytest.fixture()
def special_tokenizer_file(tokenizer_file: Path) -> Path:
    """The same tokenizer with [PAD], [CLS] and [SEP] registered as special tokens (as real ones are)."""
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    tok.add_special_tokens(["[PAD]", "[CLS]", "[SEP]"])
    tok.save(str(tokenizer_file))
    return tokenizer_file


async def test_tokenize_and_decode_items_are_answered_with_the_models_tokenizer(special_tokenizer_file: Path) -> None:
    tokenizer_file = special_tokenizer_file
    group = [
        Work(_Delivery(item(0, operation="tokenize", item={"text": "hello world"})), 0.0),
        Work(_Delivery(item(1, item={"text": "hello"})), 0.0),
        Work(_Delivery(item(2, operation="tokenize", item={"text": "hello"}, options={"add_special_tokens": False})),
             0.0),
        Work(_Delivery(item(3, operation="decode", item={"ids": [2, 4, 5, 3]})), 0.0),
        Work(_Delivery(item(4, operation="decode", item={"ids": [2, 4, 3]}, options={"skip_special_tokens": False})),
             0.0),
        Work(_Delivery(item(5, operation="decode", item={"ids": [4, 999]})), 0.0),
    ]  # fmt: skip
    answers, passed, failed = await answered_by_the_stage(ready(tokenizer_file), group)
    assert [work.item.work_item_id for work in passed] == ["r1.0"] and failed == []
    results = {work.item.work_item_id: result for work, result in answers}
    assert all(result.worker_id == "w-1" for result in results.values())
    tokens = results["r0.0"].result_msgpack.value["tokens"]
    assert [(t["id"], t["text"], t["special"], t["start"], t["stop"]) for t in tokens] == [
        (2, "[CLS]", True, None, None), (4, "hello", False, 0, 5), (5, "world", False, 6, 11),
        (3, "[SEP]", True, None, None),
    ]  # fmt: skip
    assert results["r0.0"].units.input_tokens == 4
    assert [t["id"] for t in results["r2.0"].result_msgpack.value["tokens"]] == [4]
    assert results["r3.0"].result_msgpack.value == {"text": "hello world"}
    assert results["r4.0"].result_msgpack.value == {"text": "[CLS] hello [SEP]"}
    refused = results["r5.0"]
    assert not refused.success and refused.error_code == "INVALID_INPUT" and "999" in refused.error


async def test_a_tokenize_item_reads_the_text_the_model_would(tokenizer_file: Path) -> None:
    """The model's query template applies to a query's tokens, as it does to its encode; no tokenizer: refused."""
    query = item(0, operation="tokenize", item={"text": "world"}, is_query=True)
    answers, _, _ = await answered_by_the_stage(ready(tokenizer_file, default_query_template="hello {text}"),
                                                [Work(_Delivery(query), 0.0)])  # fmt: skip
    assert [t["text"] for t in answers[0][1].result_msgpack.value["tokens"]] == ["[CLS]", "hello", "world", "[SEP]"]
    answers, _, _ = await answered_by_the_stage(ready(None), [Work(_Delivery(query), 0.0)])
    assert answers[0][1].error_code == "INVALID_INPUT" and "no text tokenizer" in answers[0][1].error


async def test_a_tokenizer_bug_fails_only_the_token_items(
    tokenizer_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self, text, add_special_tokens=True):
        raise RuntimeError("the tokenizer choked")

    monkeypatch.setattr(TextTokenizer, "tokens", broken)
    group = [Work(_Delivery(item(0, operation="tokenize", item={"text": "hello"})), 0.0),
             Work(_Delivery(item(1, item={"text": "hello"})), 0.0)]  # fmt: skip
    answers, passed, failed = await answered_by_the_stage(ready(tokenizer_file), group)
    assert answers == [] and failed == ["r0.0"] and [work.item.work_item_id for work in passed] == ["r1.0"]


# --- images ---------------------------------------------------------------------------------------------------------

SIGLIP_STYLE = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 8, "width": 8}, "resample": 2,
                "rescale_factor": 1 / 255, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}  # fmt: skip


def png(width: int, height: int) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (255, 0, 0)).save(buffer, format="PNG")
    return buffer.getvalue()


async def test_an_image_models_items_get_pixel_values_and_cost_their_patches(tokenizer_file: Path) -> None:
    """With the descriptor's image processor: each item's images become [images, 3, H, W] pixel values, costing
    image_cost each; an image that cannot be decoded becomes that item's error; text items are tokenized as ever."""
    pictured = item(0, item={"images": [{"data": png(12, 9)}, {"data": png(4, 4)}]})
    broken = item(1, item={"images": [{"data": png(12, 9)[:50]}]})
    text = item(2, item={"text": "hello world"})
    works = [Work(_Delivery(one), 0.0) for one in (pictured, broken, text)]
    await prepare(ready(tokenizer_file, image_processor=SIGLIP_STYLE, image_cost=17), works)
    pixels = works[0].run_item.encode.prepared_pixels.pixel_values
    assert pixels.shape == (2, 3, 8, 8) and pixels.dtype == np.float32
    assert np.allclose(pixels[0, 0], 1.0) and np.allclose(pixels[0, 1:], -1.0)  # red, normalised to [-1, 1]
    assert works[0].cost == 2 * 17
    assert works[1].run_item.encode.prepared_pixels.error.startswith("Image 0:")
    assert works[2].run_item.encode.prepared_tokens is not None and works[2].cost == 4


async def test_without_an_image_processor_images_are_left_to_the_worker(tokenizer_file: Path) -> None:
    works = [Work(_Delivery(item(0, item={"images": [{"data": png(4, 4)}]})), 0.0)]
    await prepare(ready(tokenizer_file), works)
    assert works[0].run_item.encode.prepared_pixels is None and works[0].cost == MEDIA_INPUT_COST


async def test_an_image_models_score_items_get_the_pixels_of_each_entry(tokenizer_file: Path) -> None:
    score = item(0, "score", query_item={"text": "hello"},
                 score_items=[{"images": [{"data": png(12, 9)}]}, {"text": "world"}])  # fmt: skip
    works = [Work(_Delivery(score), 0.0)]
    await prepare(ready(tokenizer_file, image_processor=SIGLIP_STYLE, image_cost=17), works)
    query, pictured, text = works[0].run_item.score.prepared_pixels
    assert query is None and text is None and pictured.pixel_values.shape == (1, 3, 8, 8)
