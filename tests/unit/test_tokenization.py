"""Tokenizer wrapper: explicit truncation, baked-in padding cleared, pairs, padding and tokenizer_id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from sie.tokenization import TextTokenizer, TokenizerError, length_groups, pad_batch, prepare_text, tokenizer_id_for

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "the", "cat", "sat", "on", "mat", "##s"]


@pytest.fixture()
def tokenizer_file(tmp_path: Path) -> Path:
    """A real WordPiece tokenizer.json that, like the MiniLM files, pads every input to 16."""
    vocab = {token: index for index, token in enumerate(VOCAB)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=16)
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_baked_in_padding_is_cleared(tokenizer_file: Path) -> None:
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=8)
    (encoded,) = tokenizer.encode_batch(["Hello world"])
    assert encoded.input_ids.tolist() == [2, 4, 5, 3] and encoded.input_ids.dtype == np.int64
    assert encoded.special_tokens_mask.tolist() == [1, 0, 0, 1]
    assert encoded.offsets[1:3] == [(0, 5), (6, 11)]
    assert not encoded.truncated


def test_truncation_is_reported(tokenizer_file: Path) -> None:
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=5)
    long, short = tokenizer.encode_batch(["the cat sat on the mat", "cats"])
    assert len(long) == 5 and long.truncated and long.input_ids[-1] == 3
    assert short.input_ids.tolist() == [2, 7, 11, 3] and not short.truncated


def test_a_text_far_past_max_length_is_cut_before_tokenizing_with_the_same_tokens_and_offsets(
    tokenizer_file: Path,
) -> None:
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=5)
    huge = "the cat sat on the mat " * 10_000  # 230,000 characters for 5 tokens
    (cut,) = tokenizer.encode_batch([huge])
    (short,) = tokenizer.encode_batch(["the cat sat on the mat"])
    assert cut.input_ids.tolist() == short.input_ids.tolist() and cut.truncated
    assert cut.offsets == short.offsets
    (pair,) = tokenizer.encode_batch([("hello", huge)])
    assert pair.input_ids.tolist()[:4] == [2, 4, 3, 6] and len(pair) == 5 and pair.truncated


def test_a_cut_text_counts_as_truncated_even_if_what_is_left_fits(tokenizer_file: Path) -> None:
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=5)
    (mostly_blank,) = tokenizer.encode_batch(["cat" + " " * 1_000 + "mat"])  # past 5 × 64 characters
    assert mostly_blank.input_ids.tolist() == [2, 7, 3] and mostly_blank.truncated


def test_pairs_carry_type_ids(tokenizer_file: Path) -> None:
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=16)
    (pair,) = tokenizer.encode_batch([("hello", "the cat")])
    assert pair.input_ids.tolist() == [2, 4, 3, 6, 7, 3]
    assert pair.token_type_ids.tolist() == [0, 0, 0, 1, 1, 1]


def test_pad_batch_pads_to_longest_only() -> None:
    batch = pad_batch([[2, 4, 3], [2, 3]], [[0, 0, 0], [0, 0]], pad_id=0)
    assert batch.input_ids.tolist() == [[2, 4, 3], [2, 3, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch.input_ids.dtype == np.int64


def test_length_groups_cut_only_where_padding_is_worth_a_run() -> None:
    # Four long sentences among 28 short ones: padded together they compute 32 x 18 = 576 tokens; the long ones
    # alone and the rest at 14 compute 72 + 392 = 464.
    lengths = [13, 12, 14, 13, 14, 13, 12, 18] * 4
    groups = length_groups(lengths)
    assert [sorted(lengths[row] for row in group) for group in groups][0] == [18, 18, 18, 18]
    assert sorted(row for group in groups for row in group) == list(range(32))
    assert sum(len(group) * max(lengths[row] for row in group) for group in groups) == 464
    # One outlier far longer than the rest goes alone.
    assert length_groups([512, 10, 10, 10]) == [[0], [1, 2, 3]]


@pytest.mark.parametrize(
    "lengths",
    [
        [16, 16, 16],  # all alike
        [14, 13, 12, 13],  # a few tokens apart: a cut would save 2 of 56 tokens
        [20, 19, 18, 17, 16, 15, 14, 13],  # an even spread: no single cut saves an eighth of 160
    ],
)
def test_length_groups_keep_batches_that_pad_little_whole(lengths: list[int]) -> None:
    (group,) = length_groups(lengths)
    assert sorted(group) == list(range(len(lengths)))


def test_length_groups_of_nothing() -> None:
    assert length_groups([]) == []


def test_tokenizer_id_is_stable_content_hash(tokenizer_file: Path) -> None:
    data = tokenizer_file.read_bytes()
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=8)
    assert tokenizer.tokenizer_id == tokenizer_id_for(data)
    assert len(tokenizer.tokenizer_id) == 32
    assert tokenizer_id_for(data + b" ") != tokenizer.tokenizer_id
    assert tokenizer.pad_id == 0 and tokenizer.vocab_size == len(VOCAB)


def test_special_ids(tmp_path: Path) -> None:
    vocab = {token: index for index, token in enumerate(VOCAB)}
    raw = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    raw.add_special_tokens(["[PAD]", "[CLS]", "[SEP]"])
    raw.save(str(tmp_path / "t.json"))
    assert TextTokenizer.from_file(tmp_path / "t.json", 8).special_ids == {0, 2, 3}


def test_prepared_ids_get_their_special_mask_by_id_and_no_offsets(tmp_path: Path) -> None:
    vocab = {token: index for index, token in enumerate(VOCAB)}
    raw = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    raw.add_special_tokens(["[PAD]", "[CLS]", "[SEP]"])
    raw.save(str(tmp_path / "t.json"))
    tokenizer = TextTokenizer.from_file(tmp_path / "t.json", 8)
    prepared = tokenizer.prepared(np.array([2, 4, 5, 3], dtype=np.int64))
    assert prepared.special_tokens_mask.tolist() == [1, 0, 0, 1]
    assert prepared.token_type_ids.tolist() == [0, 0, 0, 0] and prepared.offsets == [] and len(prepared) == 4


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="missing.json"):
        TextTokenizer.from_file(tmp_path / "missing.json", max_length=8)


def test_cut_keeps_the_closing_special_token_as_truncation_would(tokenizer_file: Path) -> None:
    tokenizer = TextTokenizer.from_file(tokenizer_file, max_length=64)
    (long,) = tokenizer.encode_batch(["hello world and more words"])
    (short,) = tokenizer.encode_batch(["hello world"])
    cut = tokenizer.cut(long, len(short))
    assert cut.input_ids.tolist() == short.input_ids.tolist() and cut.truncated
    assert tokenizer.cut(short, len(short)) is short


def test_a_template_placing_the_instruction_gets_it_or_the_default_and_no_prefix() -> None:
    template = "Instruct: {instruction}\nQuery: {text}"
    assert prepare_text("q", is_query=True, query_template=template, default_instruction="find") == (
        "Instruct: find\nQuery: q"
    )
    assert prepare_text("q", is_query=True, query_template=template, instruction="rank", default_instruction="x") == (
        "Instruct: rank\nQuery: q"
    )
    # placeholders inside the text or the instruction are left as they are
    assert prepare_text("{instruction}", is_query=True, query_template=template, instruction="{text}") == (
        "Instruct: {text}\nQuery: {instruction}"
    )
    assert prepare_text("d", query_template=template, instruction="rank") == "rank d"  # documents: no template
