"""How the next token is chosen (sie.worker.generation.sampling): SamplingParams' checks, and the Sampler's rules on
logits (greedy, seeds, temperature, top-k, top-p, a stable softmax, presence and frequency penalties)."""

from __future__ import annotations

import numpy as np
import pytest

from sie.worker.generation.sampling import Sampler, SamplingParams

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
        ("stop", [f"s{index}" for index in range(9)]),  # a request's four and a profile's four at most
        ("stop", ["ok", ""]),
        ("stop_token_ids", [-1]),
        ("presence_penalty", 2.5),
        ("frequency_penalty", float("inf")),
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


def test_penalties_lower_the_logits_of_generated_tokens_by_presence_and_count() -> None:
    """OpenAI's definition: logit − count × frequency_penalty − (count > 0) × presence_penalty, over the tokens the
    sequence generated; greedy decoding moves off a token once its penalty outweighs its lead."""
    logits = np.asarray([5.0, 4.0, 3.5, 0.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0, presence_penalty=0.75, frequency_penalty=0.5))
    assert draws(sampler, logits, 4) == [0, 1, 0, 2]
    # token 0 twice: 5 − 0.75 − 2 × 0.5; token 1 once: 4 − 1.25; token 2 once: 3.5 − 1.25
    assert sampler.penalised(logits).tolist() == [3.25, 2.75, 2.25, 0.0]
    assert Sampler(SamplingParams(temperature=0)).penalised(logits) is logits
    # a negative presence penalty favours what was said: greedy then repeats itself
    assert draws(Sampler(SamplingParams(temperature=0, presence_penalty=-2)), logits, 3) == [0, 0, 0]


def test_min_tokens_keeps_stop_tokens_out_of_the_first_tokens() -> None:
    """vLLM's `min_tokens` (a profile's `min_new_tokens`, Qwen3-VL's YAML sets 1): the stop tokens cannot be chosen
    before that many tokens were generated, and can after."""
    logits = np.asarray([1.0, 9.0, 2.0, 5.0], dtype=np.float32)  # token 1, the stop token, is the most likely
    sampler = Sampler(SamplingParams(temperature=0, stop_token_ids=[1, 99], min_tokens=2))
    assert draws(sampler, logits, 3) == [3, 3, 1]
    assert Sampler(SamplingParams(temperature=0, stop_token_ids=[1])).next_token(logits) == 1
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=-1)
