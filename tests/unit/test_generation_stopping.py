"""Stop/length/UTF-8 release rules of sie.worker.generation.stopping on token ids decoded by a real byte-level BPE
decoder (`tokenizers`' ByteLevel, as the SmolLM2 tokenizer uses), and a thinking model's reasoning kept out of the
released text (sie.worker.generation.reasoning)."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sie.wire.generate import FINISH_LENGTH, FINISH_STOP
from sie.worker.generation.reasoning import CHANNEL, THINK, ReasoningMarkers, answer_text, decoded_with_markers
from sie.worker.generation.sampling import SamplingParams
from sie.worker.generation.stopping import StopChecker, StopStep

EOS_ID = 0


def byte_level(text: str) -> str:
    """`text` in the byte-level alphabet: one character per UTF-8 byte."""
    [(mapped, _offsets)] = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)
    return mapped


class ByteVocabulary:
    """A byte-level BPE tokenizer whose vocabulary is the pieces it is given, in order of first use."""

    def __init__(self) -> None:
        self._vocab: dict[str, int] = {"<|im_end|>": EOS_ID}

    def ids(self, *pieces: str) -> list[int]:
        """Ids of byte-level pieces (already in the byte-level alphabet)."""
        return [self._vocab.setdefault(piece, len(self._vocab)) for piece in pieces]

    def text_ids(self, *texts: str) -> list[int]:
        return self.ids(*(byte_level(text) for text in texts))

    def decoder(self):
        tokenizer = Tokenizer(models.BPE(vocab=dict(self._vocab), merges=[]))
        tokenizer.decoder = decoders.ByteLevel()
        return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def run(params: SamplingParams, vocabulary: ByteVocabulary, ids: Sequence[int]) -> list[StopStep]:
    checker = StopChecker(params, vocabulary.decoder())
    steps = []
    for token_id in ids:
        steps.append(checker.push(token_id))
        if steps[-1].finished:
            break
    return steps


def released(steps: list[StopStep]) -> str:
    return "".join(step.text for step in steps)


# --- StopChecker ----------------------------------------------------------------------------------------------


def test_a_stop_string_split_across_three_tokens_is_never_partly_released() -> None:
    vocabulary = ByteVocabulary()
    ids = vocabulary.text_ids("Hello", " wor", "ld", "\n#", "#", "#", " tail")
    steps = run(SamplingParams(stop=["###"], max_tokens=20), vocabulary, ids)
    assert [step.text for step in steps] == ["Hello", " wor", "ld", "\n", "", ""]
    assert steps[-1].finish_reason == FINISH_STOP
    assert released(steps) == "Hello world\n"


def test_text_after_a_stop_string_in_the_same_token_is_never_released() -> None:
    vocabulary = ByteVocabulary()
    ids = vocabulary.text_ids("The answer", " is 4.", "END and more", " more")
    steps = run(SamplingParams(stop=["END"], max_tokens=20), vocabulary, ids)
    assert released(steps) == "The answer is 4."
    assert steps[-1].finish_reason == FINISH_STOP
    assert len(steps) == 3


def test_a_held_back_prefix_is_released_once_it_stops_matching() -> None:
    vocabulary = ByteVocabulary()
    ids = vocabulary.text_ids("a <", "/", "b> c", " <", "/s>")
    steps = run(SamplingParams(stop=["</s>"], max_tokens=20), vocabulary, ids)
    assert [step.text for step in steps] == ["a ", "", "</b> c", " ", ""]
    assert steps[-1].finish_reason == FINISH_STOP


def test_the_earliest_of_several_stop_strings_wins() -> None:
    vocabulary = ByteVocabulary()
    ids = vocabulary.text_ids("one STOP two HALT")
    steps = run(SamplingParams(stop=["HALT", "STOP"]), vocabulary, ids)
    assert released(steps) == "one "


def test_max_tokens_ends_with_length_and_releases_held_text() -> None:
    vocabulary = ByteVocabulary()
    ids = vocabulary.text_ids("x", "y", "#", "z")
    steps = run(SamplingParams(stop=["##"], max_tokens=3), vocabulary, ids)
    assert len(steps) == 3
    assert [step.finish_reason for step in steps] == [None, None, FINISH_LENGTH]
    assert released(steps) == "xy#"


def test_a_stop_token_ends_with_stop_and_is_not_released() -> None:
    vocabulary = ByteVocabulary()
    ids = [*vocabulary.text_ids("Paris", "."), EOS_ID, *vocabulary.text_ids(" more")]
    checker = StopChecker(SamplingParams(stop_token_ids=[EOS_ID], max_tokens=10), vocabulary.decoder())
    steps = [checker.push(token_id) for token_id in ids[:3]]
    assert steps[-1] == StopStep("", FINISH_STOP)
    assert released(steps) == "Paris."
    assert checker.token_ids == tuple(ids[:2])
    with pytest.raises(RuntimeError, match="bug"):
        checker.push(ids[3])


@pytest.mark.parametrize("character", ["é", "€", "🙂"])
def test_a_multi_byte_character_split_across_tokens_is_released_whole(character: str) -> None:
    vocabulary = ByteVocabulary()
    split = list(byte_level(character))  # one token per UTF-8 byte
    assert len(split) > 1
    ids = [*vocabulary.text_ids("caf"), *vocabulary.ids(*split), *vocabulary.text_ids("!")]
    steps = run(SamplingParams(max_tokens=20), vocabulary, ids)
    assert [step.text for step in steps] == ["caf", *[""] * (len(split) - 1), character, "!"]
    assert "\ufffd" not in released(steps)


def test_a_stop_string_with_a_multi_byte_character_is_held_across_its_bytes() -> None:
    vocabulary = ByteVocabulary()
    first, second = byte_level("é")
    ids = [*vocabulary.text_ids("cafe", " caf"), *vocabulary.ids(first, second), *vocabulary.text_ids("s")]
    steps = run(SamplingParams(stop=["fé"], max_tokens=20), vocabulary, ids)
    assert released(steps) == "cafe ca"
    assert steps[-1].finish_reason == FINISH_STOP


# --- a thinking model's reasoning (sie.worker.generation.reasoning) ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("", ""),
        ("<th", ""),  # may still open a block
        ("<think>\nplan", ""),  # inside the block
        ("<think>\nplan\n</think>\n\nThe answer.", "The answer."),
        ("\n<think></think>Yes", "Yes"),
        ("No reasoning here", "No reasoning here"),
        ("<b>bold</b>", "<b>bold</b>"),
        ("An answer that mentions <think> later", "An answer that mentions <think> later"),
    ],
)
def test_the_answer_leaves_out_a_leading_reasoning_block(text: str, answer: str) -> None:
    assert answer_text(text) == answer


def test_gemma4s_thought_channel_is_found_among_special_tokens_and_left_out() -> None:
    """Gemma 4's markers are special tokens, which decoding drops: they are kept as text where the vocabulary has
    them, so the thought channel leaves the answer (with thinking off, an empty channel before the answer too)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tokenizer_models

    words = ["<|channel>", "<channel|>", "<turn|>", "thought", "plan", "The", "answer"]
    tokenizer = Tokenizer(tokenizer_models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<turn|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(words[:3])
    markers = ReasoningMarkers.of(tokenizer)
    assert markers == attrs.evolve(CHANNEL, special_ids=(0, 1))
    assert ReasoningMarkers.of(Tokenizer(tokenizer_models.WordLevel({"a": 0}, unk_token="a"))) == THINK
    ids = [0, 3, 4, 1, 5, 6, 2]  # <|channel> thought plan <channel|> The answer <turn|>
    text = decoded_with_markers(tokenizer, ids, markers)
    assert text == "<|channel>thought plan<channel|>The answer"
    assert tokenizer.decode(ids, skip_special_tokens=True) == "thought plan The answer"  # why they are kept
    assert [answer_text(decoded_with_markers(tokenizer, ids[:n], markers), markers) for n in (1, 3, 4, 6)] == [
        "", "", "", "The answer",
    ]  # fmt: skip


def test_a_reasoning_block_streams_nothing_and_its_stop_strings_do_not_stop_the_answer() -> None:
    """Token by token through the stop checker, as a thinking model's text arrives: the answer grows as a prefix,
    nothing of the reasoning (where the stop string also appears) is released, and the stop string ends the answer."""
    vocabulary = ByteVocabulary()
    pieces = ["<", "think", ">", "\n", "Plan", ":", " END", " here", "\n", "</", "think", ">", "\n\n", "The",
              " answer", " END", " more"]  # fmt: skip
    ids = vocabulary.text_ids(*pieces)
    decode = vocabulary.decoder()
    checker = StopChecker(SamplingParams(stop=[" END"], max_tokens=50), lambda ids: answer_text(decode(ids)))
    steps = []
    for token_id in ids:
        steps.append(checker.push(token_id))
        if steps[-1].finished:
            break
    assert released(steps) == "The answer"
    assert steps[-1].finish_reason == FINISH_STOP and len(steps) == len(pieces) - 1
    assert not "".join(step.text for step in steps[:12])  # the reasoning: nothing released
