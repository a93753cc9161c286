"""The gated delta rule of sie.worker.convert.gated_delta as ONNX nodes, against the rule written token by token in
float64 (a second opinion; tests/integration/test_decoder_families.py holds the whole layer to transformers): the
chunked form a prompt runs, across chunk boundaries and from a state already written, and the single step a decode
runs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from sie.worker.convert.gated_delta import CHUNK, GatedDelta, chunked_rule, single_step_rule
from sie.worker.convert.graph_builder import GraphBuilder

HEADS, KEY_DIM, VALUE_DIM = 3, 16, 5
SPEC = GatedDelta(layers=(0,), num_key_heads=HEADS, num_value_heads=HEADS, key_head_dim=KEY_DIM,
                  value_head_dim=VALUE_DIM, conv_kernel=4)  # fmt: skip
INPUTS = ("q", "k", "v", "g", "beta")


def rule_in_float64(q, k, v, g, beta, state):  # noqa: ANN001, ANN201 - numpy arrays
    """S ← S·exp(g); S ← S + k ⊗ β(v − Sᵀk); o = Sᵀq, token by token."""
    state = state.astype(np.float64).copy()
    outputs = np.zeros(v.shape)
    for t in range(q.shape[1]):
        state *= np.exp(g[:, t])[..., None, None]
        delta = (v[:, t] - np.einsum("bhk,bhkv->bhv", k[:, t], state)) * beta[:, t][..., None]
        state += np.einsum("bhk,bhv->bhkv", k[:, t], delta)
        outputs[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t], state)
    return state, outputs


def session(build) -> ort.InferenceSession:  # noqa: ANN001 - chunked_rule or single_step_rule
    b = GraphBuilder()
    state, out = build(b, "initial", list(INPUTS))
    b.op("Identity", [state], "final")
    b.op("Identity", [out], "out")
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])] + [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in (*INPUTS, "initial")
    ]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("final", "out")]
    return ort.InferenceSession(b.model("rule", inputs, outputs).SerializeToString(),
                                providers=["CPUExecutionProvider"])  # fmt: skip


def random_run(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    q, k = (rng.normal(size=(2, length, HEADS, KEY_DIM)) for _ in range(2))
    q = q / np.linalg.norm(q, axis=-1, keepdims=True) * KEY_DIM**-0.5
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
    return {"q": q, "k": k, "v": rng.normal(size=(2, length, HEADS, VALUE_DIM)),
            "g": -np.abs(rng.normal(size=(2, length, HEADS))) * 0.3,
            "beta": 1 / (1 + np.exp(-rng.normal(size=(2, length, HEADS)))),
            "initial": rng.normal(size=(2, HEADS, KEY_DIM, VALUE_DIM)) * 0.1}  # fmt: skip


@pytest.mark.parametrize("length", [2, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5])
def test_the_chunked_rule_equals_the_rule_token_by_token(length: int) -> None:
    run = random_run(length, seed=length)
    feeds = {name: value.astype(np.float32) for name, value in run.items()}
    final, out = session(lambda b, i, x: chunked_rule(b, i, x, SPEC, "rule")).run(
        None, {**feeds, "input_ids": np.zeros((2, length), np.int64)}
    )
    expected_state, expected = rule_in_float64(*(run[name] for name in INPUTS), run["initial"])
    assert out.shape == expected.shape
    assert float(np.abs(out - expected).max()) <= 1e-5 and float(np.abs(final - expected_state).max()) <= 1e-5


def test_a_single_step_equals_one_token_of_the_rule() -> None:
    run = random_run(1, seed=9)
    feeds = {name: value.astype(np.float32) for name, value in run.items()}
    final, out = session(lambda b, i, x: single_step_rule(b, i, x, "rule")).run(
        None, {**feeds, "input_ids": np.zeros((2, 1), np.int64)}
    )
    expected_state, expected = rule_in_float64(*(run[name] for name in INPUTS), run["initial"])
    assert float(np.abs(out - expected).max()) <= 1e-6 and float(np.abs(final - expected_state).max()) <= 1e-6
