"""`with_end_token` (sie.tokenization): a tokenizer.json rewritten to end every text with a vocabulary token, as a
decoder embedder's `append_eos` asks."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, pre_tokenizers, processors
from tokenizers import models as tokenizer_models

from sie.tokenization import TextTokenizer, TokenizerError, with_end_token

VOCAB = {"<s>": 0, "</s>": 1, "<unk>": 2, "a": 3, "b": 4}


def word_level(post: processors.PostProcessor | None) -> Tokenizer:
    tokenizer = Tokenizer(tokenizer_models.WordLevel(VOCAB, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>", "</s>"])
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer


def test_a_template_gets_the_token_after_its_text() -> None:
    llama_like = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1", special_tokens=[("<s>", 0)])
    rewritten = Tokenizer.from_str(with_end_token(word_level(llama_like).to_str(), "</s>"))
    encoding = rewritten.encode("a b a")
    assert (encoding.ids, encoding.special_tokens_mask) == ([0, 3, 4, 3, 1], [1, 0, 0, 0, 1])
    assert rewritten.encode("a", "b").ids == [0, 3, 4, 1]
    again = Tokenizer.from_str(with_end_token(rewritten.to_str(), "</s>"))  # applied twice, added once
    assert again.encode("a").ids == [0, 3, 1]


def test_no_post_processor_gets_a_template_and_truncation_keeps_the_token(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(with_end_token(word_level(None).to_str(), "</s>"))
    tokenizer = TextTokenizer.from_file(path, max_length=3)
    (tokenized,) = tokenizer.encode_batch(["a b a b"])
    assert tokenized.input_ids.tolist() == [3, 4, 1]


def test_what_cannot_be_rewritten_is_named() -> None:
    with pytest.raises(TokenizerError, match="not in the tokenizer's vocabulary"):
        with_end_token(word_level(None).to_str(), "<eos>")
    with pytest.raises(TokenizerError, match="the post-processor is a ByteLevel, not a template"):
        with_end_token(word_level(processors.ByteLevel()).to_str(), "</s>")
    with pytest.raises(TokenizerError, match="cannot read the tokenizer"):
        with_end_token("{not json", "</s>")
