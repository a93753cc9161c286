"""The decoding policy of sie.worker.generation: sampling rules on logits, and stop/length/UTF-8 release rules on
token ids decoded by a real byte-level BPE decoder (`tokenizers`' ByteLevel, as the SmolLM2 tokenizer uses)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sie.worker.generation import FINISH_LENGTH, FINISH_STOP, Sampler, SamplingParams, StopChecker, StopStep

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


# --- SamplingParams -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -1),
        ("top_k", 2.5),
        ("seed", "7"),
        ("max_tokens", 0),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", ["ok", ""]),
        ("stop_token_ids", [-1]),
    ],
)
def test_invalid_params_name_their_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_params_normalise_stop_values() -> None:
    params = SamplingParams(stop="###", stop_token_ids=[2, 2, 5])
    assert params.stop == ("###",)
    assert params.stop_token_ids == frozenset({2, 5})


# --- Sampler --------------------------------------------------------------------------------------------------


def random_logits(seed: int, vocab: int = 500) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3, vocab).astype(np.float32)


def draws(sampler: Sampler, logits: np.ndarray, count: int) -> list[int]:
    return [sampler.next_token(logits) for _ in range(count)]


def test_temperature_zero_is_argmax() -> None:
    logits = random_logits(1)
    assert Sampler(SamplingParams(temperature=0)).next_token(logits) == int(np.argmax(logits))


@pytest.mark.parametrize("seed", range(5))
def test_top_k_one_equals_greedy(seed: int) -> None:
    logits = random_logits(seed)
    sampler = Sampler(SamplingParams(temperature=1.5, top_k=1, seed=seed))
    greedy = Sampler(SamplingParams(temperature=0)).next_token(logits)
    assert set(draws(sampler, logits, 20)) == {greedy}


def test_the_same_seed_repeats_and_other_seeds_differ() -> None:
    logits = np.zeros(1000, dtype=np.float32)  # uniform: every draw is the generator's choice
    first = draws(Sampler(SamplingParams(seed=7)), logits, 30)
    assert draws(Sampler(SamplingParams(seed=7)), logits, 30) == first
    assert draws(Sampler(SamplingParams(seed=8)), logits, 30) != first


def test_unseeded_samplers_are_random() -> None:
    logits = np.zeros(1000, dtype=np.float32)
    assert draws(Sampler(SamplingParams()), logits, 30) != draws(Sampler(SamplingParams()), logits, 30)


@pytest.mark.parametrize(("top_p", "kept"), [(0.45, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_covering_p(top_p: float, kept: set[int]) -> None:
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probabilities).astype(np.float32)
    sampler = Sampler(SamplingParams(top_p=top_p, seed=3))
    nucleus = sampler.probabilities(logits)
    assert set(np.flatnonzero(nucleus)) == kept
    expected = probabilities[sorted(kept)] / probabilities[sorted(kept)].sum()
    np.testing.assert_allclose(nucleus[sorted(kept)], expected, rtol=1e-6)
    assert set(draws(sampler, logits, 200)) == kept


def test_top_k_applies_before_top_p() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1])).astype(np.float32)
    # Top-2 renormalises to 4/7 and 3/7, so a nucleus of 0.5 holds only the first.
    nucleus = Sampler(SamplingParams(top_k=2, top_p=0.5)).probabilities(logits)
    assert set(np.flatnonzero(nucleus)) == {0}


def test_temperature_scales_logits_before_the_softmax() -> None:
    logits = random_logits(4, vocab=50)
    cool = Sampler(SamplingParams(temperature=0.5)).probabilities(logits)
    scaled = np.exp(2.0 * logits.astype(np.float64) - 2.0 * logits.max())
    np.testing.assert_allclose(cool, scaled / scaled.sum(), rtol=1e-9)


def test_the_softmax_is_stable_for_huge_logits() -> None:
    logits = np.array([1e30, 1e30 - 1e24, -1e30], dtype=np.float32)
    probabilities = Sampler(SamplingParams(temperature=1e-3)).probabilities(logits)
    assert np.all(np.isfinite(probabilities))
    assert probabilities.sum() == pytest.approx(1.0, abs=1e-12)


def test_logits_without_a_finite_maximum_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        Sampler(SamplingParams(seed=1)).next_token(np.full(4, -np.inf, dtype=np.float32))


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
