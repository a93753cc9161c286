"""Dense vectors pooled and token heads run where the model ran (`sie.worker.device_pooling`): on a GPU the token
states stay on the device and small graphs run there (pooling, a model's per-token Dense layers), so only their
results come to the host. No GPU in CI: the device is the seam, so the loader here is a GPU loader whose sessions
(the model's and the graphs beside it, on the same provider) run on onnxruntime's CPU provider — every binding call
is the one a GPU run makes. Its vectors and scores equal the host path's (numpy pooling of `session.run`'s token
states) for each pooling mode, a batch that mixes modes, and a batch cut into row slices by the run-memory budget; a
token head's graph equals sentence-transformers' Dense layers as numpy applies them. (The GPU loader's other tests
pool and run heads this way too: BGE-M3's and ColBERT's, tests/integration/test_bge_m3.py and test_colbert.py; in half
precision, tests/integration/test_half_precision.py.)"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest
from onnx import TensorProto

from integration.test_image_text import vectors
from integration.test_sentence_modules import model_yaml, save_stack
from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.adapters import dense
from sie.worker.convert.device_graphs import pooling_graph, token_head_graph
from sie.worker.device_pooling import DeviceGraphs, DevicePooling, DeviceTokenStates, device_pooling_for, head_rows
from sie.worker.loading import DEVICE_GRAPHS, ModelLoader
from sie.worker.outputs import pool
from sie.worker.sentence_modules import DenseStage
from support.worker_items import encode_items

TEXTS = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w12 w13", "w14 w15 w16 w17"]
TOLERANCE = 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_the_pooling_graph_equals_numpy_pooling(dtype: type) -> None:
    import onnxruntime

    states = np.random.default_rng(0).standard_normal((4, 6, 8)).astype(dtype)
    mask = np.ones((4, 6), dtype=np.int64)
    mask[1, 3:] = 0  # right padding
    mask[2, :2] = 0  # leading tokens cleared (NV-Embed's instruction)
    mask[3, :] = 0  # no token: a zero mean, the first row as the last token
    states_type = "tensor(float)" if dtype == np.float32 else "tensor(float16)"
    session = onnxruntime.InferenceSession(pooling_graph(states_type), providers=["CPUExecutionProvider"])
    mean, cls, last = session.run(["mean", "cls", "last"], {"token_states": states, "attention_mask": mask})
    reference = states.astype(np.float32)
    np.testing.assert_allclose(mean, pool(reference, mask, "mean"), atol=TOLERANCE)
    assert np.array_equal(cls, pool(reference, mask, "cls")) and np.array_equal(last, pool(reference, mask, "last"))
    assert mean.dtype == cls.dtype == last.dtype == np.float32


def identity_session(element_type: int):  # noqa: ANN201 - onnxruntime.InferenceSession
    """A model whose token states `out` are its input `states`, on the CPU provider."""
    import onnx
    import onnxruntime
    from onnx import helper

    states = helper.make_tensor_value_info("states", element_type, ["batch", "sequence", "hidden"])
    out = helper.make_tensor_value_info("out", element_type, ["batch", "sequence", "hidden"])
    graph = helper.make_graph([helper.make_node("Identity", ["states"], ["out"])], "g", [states], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_a_token_head_graph_equals_the_dense_stages_numpy_applies(dtype: type) -> None:
    """Each activation a sentence-transformers Dense layer names, with and without a bias, and PyLate's residual."""
    import onnxruntime

    rng = np.random.default_rng(4)
    states = rng.standard_normal((3, 5, 8)).astype(dtype)

    def weights(width_in: int, width_out: int) -> np.ndarray:
        return rng.standard_normal((width_in, width_out)).astype(np.float32)

    stages = [
        DenseStage(weights(8, 6), weights(1, 6)[0], "GELU"),
        DenseStage(weights(6, 6), None, "Tanh", residual=np.eye(6, dtype=np.float32)),
        DenseStage(weights(6, 4), weights(1, 4)[0], "Sigmoid"),
        DenseStage(weights(4, 4), weights(1, 4)[0], "ReLU"),
        DenseStage(weights(4, 3), None, "Identity"),
    ]
    states_type = "tensor(float)" if dtype == np.float32 else "tensor(float16)"
    session = onnxruntime.InferenceSession(token_head_graph(states_type, stages), providers=["CPUExecutionProvider"])
    (ours,) = session.run(["token_vectors"], {"token_states": states})
    expected = states
    for stage in stages:
        expected = stage(expected)
    assert ours.dtype == np.float32 and ours.shape == (3, 5, 3)
    np.testing.assert_allclose(ours, expected, atol=1e-5)
    with pytest.raises(ValueError, match="activation 'Softplus'"):
        token_head_graph(states_type, [DenseStage(weights(8, 2), None, "Softplus")])


def test_a_head_the_device_does_not_run_is_applied_by_numpy_on_the_host() -> None:
    """`head_rows` reads the device's head where it runs, else the host's states through the stages."""
    states = np.random.default_rng(5).standard_normal((2, 4, 6)).astype(np.float32)
    stages = (DenseStage(np.random.default_rng(6).standard_normal((6, 3)).astype(np.float32), None, "Identity"),)

    session = identity_session(TensorProto.FLOAT)
    with_head = DevicePooling(session, "out", DEVICE_GRAPHS, {"projection": stages})
    without = DevicePooling(session, "out", DEVICE_GRAPHS, {})
    kept = np.array([True, False, True, True])
    expected = states[1][kept] @ stages[0].weight
    for device in (with_head, without):
        on_device = device.token_states([device.run({"states": states})])
        assert on_device.has_head("projection") == (device is with_head)
        np.testing.assert_allclose(head_rows(on_device, "projection", stages, 1, kept), expected, atol=1e-5)
    np.testing.assert_allclose(head_rows(states, "projection", stages, 1, kept), expected, atol=1e-5)


@pytest.fixture
def stack(tmp_path: Path) -> dict:
    save_stack(tmp_path, "bert", "mean", [(16, "Tanh")])
    return model_yaml(tmp_path / "st", 16)


@pytest.mark.parametrize("run_memory_bytes", [256 * 1024 * 1024, 1], ids=["one-run", "row-slices"])
def test_vectors_pooled_on_the_device_equal_the_host_path(  # noqa: PLR0913 - fixtures
    stack: dict,
    gpu_loader: ModelLoader,
    model_loader: ModelLoader,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    run_memory_bytes: int,
) -> None:
    model = parse_model_config(stack)
    device = ModelLoader(gpu_loader.resolver, tmp_path / "gpu", attrs.evolve(gpu_loader.session_options,
                         run_memory_bytes=run_memory_bytes)).load(model, "default", model.sie_id).adapter  # fmt: skip
    host = ModelLoader(model_loader.resolver, tmp_path / "cpu", attrs.evolve(model_loader.session_options,
                       run_memory_bytes=run_memory_bytes)).load(model, "default", model.sie_id).adapter  # fmt: skip
    assert isinstance(device, dense.DenseAdapter) and device._device_pooling is not None
    assert host._device_pooling is None
    pooled: list[tuple[str, ...]] = []
    runs: list[int] = []
    original_pooled, original_run = DevicePooling.pooled, DevicePooling.run
    monkeypatch.setattr(DevicePooling, "pooled", lambda self, states, mask, modes: pooled.append(tuple(modes))
                        or original_pooled(self, states, mask, modes))  # fmt: skip
    monkeypatch.setattr(DevicePooling, "run", lambda self, feeds: runs.append(len(feeds["input_ids"]))
                        or original_run(self, feeds))  # fmt: skip
    for options in (None, {"pooling": "cls"}, {"pooling": "last", "normalize": False}):
        items = encode_items(TEXTS, options=options)
        ours, theirs = vectors(device.encode(items).items), vectors(host.encode(items).items)
        np.testing.assert_allclose(ours, theirs, atol=TOLERANCE)
    assert {"mean", "cls", "last"} <= {mode for modes in pooled for mode in modes}
    assert max(runs) == (1 if run_memory_bytes == 1 else len(TEXTS))  # one row per run when the budget says so
    # one batch, three sets of options: each row pooled by its own
    mixed = encode_items(TEXTS[:3]) + encode_items(TEXTS[3:], options={"pooling": "last", "normalize": False})
    np.testing.assert_allclose(vectors(device.encode(mixed).items), vectors(host.encode(mixed).items), atol=TOLERANCE)
    documents = [{"text": text} for text in TEXTS[1:]]
    item = ScoreBatchItem(work_item_id="s.0", request_id="s", item_index=0, total_items=1, timestamp=0.0,
                          query_item={"text": TEXTS[0]}, score_items=documents)  # fmt: skip
    ((ours,), (theirs,)) = (device.score([item]).items, host.score([item]).items)
    assert ours.ok and theirs.ok
    assert [row["score"] for row in ours.result] == pytest.approx([row["score"] for row in theirs.result], abs=1e-6)


def test_token_states_in_row_slices_pool_each_slice_under_its_rows_of_the_mask() -> None:
    import onnxruntime

    class Part:
        def __init__(self, array: np.ndarray) -> None:
            self.value = onnxruntime.OrtValue.ortvalue_from_numpy(array)

        def shape(self) -> list[int]:
            return self.value.shape()

    class HostPooling:  # DevicePooling's pooling, without a model session in front of it
        def __init__(self) -> None:
            self.session = onnxruntime.InferenceSession(pooling_graph("tensor(float)"),
                                                        providers=["CPUExecutionProvider"])  # fmt: skip

        def pooled(self, part: Part, mask: np.ndarray, modes: list[str]) -> dict[str, np.ndarray]:
            outputs = self.session.run(modes, {"token_states": part.value.numpy(), "attention_mask": mask})
            return dict(zip(modes, outputs, strict=True))

    states = np.random.default_rng(1).standard_normal((5, 4, 3)).astype(np.float32)
    mask = np.ones((5, 4), dtype=np.int64)
    mask[0, 2:] = mask[3, 1:] = 0
    token_states = DeviceTokenStates([Part(states[:2]), Part(states[2:])], HostPooling())  # type: ignore[arg-type]
    for mode in ("mean", "last"):
        np.testing.assert_allclose(token_states.pooled(mask, mode), pool(states, mask, mode), atol=TOLERANCE)
    assert token_states.pooled(mask, "mean") is token_states.pooled(mask, "mean")  # pooled once per mask and mode


def test_states_the_pooling_graph_cannot_read_or_a_pooling_session_that_fails_leave_pooling_on_the_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model loads either way: token states of another type (here int64), or a provider that will not open the
    pooling graph (here bytes that are no model), keep numpy's pooling, with the reason logged."""
    broken = DeviceGraphs(lambda states_type: b"no model", token_head_graph)
    assert device_pooling_for(identity_session(TensorProto.FLOAT), "out", None) is None  # a CPU loader gives no graph
    assert isinstance(device_pooling_for(identity_session(TensorProto.FLOAT), "out", DEVICE_GRAPHS), DevicePooling)
    with caplog.at_level("WARNING", logger="sie.worker.device_pooling"):
        assert device_pooling_for(identity_session(TensorProto.INT64), "out", DEVICE_GRAPHS) is None
        assert device_pooling_for(identity_session(TensorProto.FLOAT), "out", broken) is None
    reasons = [record.getMessage() for record in caplog.records]
    assert len(reasons) == 2 and "tensor(int64)" in reasons[0] and "stay pooled on the host" in reasons[1]
