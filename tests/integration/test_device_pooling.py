"""Dense vectors pooled where the model ran (`sie.worker.device_pooling`): on a GPU the token states stay on the
device and a small pooling graph runs there, so only the vectors come to the host. No GPU in CI: the device is the
seam, so the loader here is a GPU loader whose sessions (the model's and the pooling graph, on the same provider)
run on onnxruntime's CPU provider — every binding call is the one a GPU run makes. Its vectors and
scores equal the host path's (numpy pooling of `session.run`'s token states) for each pooling mode, a batch that
mixes modes, and a batch cut into row slices by the run-memory budget. (The GPU loader's other tests, in half
precision, pool this way too: tests/integration/test_half_precision.py.)"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest

from integration.test_image_text import vectors
from integration.test_sentence_modules import model_yaml, save_stack
from sie.catalog import parse_model_config
from sie.wire.ipc_batch import ScoreBatchItem
from sie.worker.adapters import dense
from sie.worker.convert.pooling import pooling_graph
from sie.worker.device_pooling import DevicePooling, DeviceTokenStates, device_pooling_for
from sie.worker.loading import ModelLoader
from sie.worker.outputs import pool
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
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    def session_with(element_type: int) -> onnxruntime.InferenceSession:
        states = helper.make_tensor_value_info("states", element_type, ["batch", "sequence", "hidden"])
        out = helper.make_tensor_value_info("out", element_type, ["batch", "sequence", "hidden"])
        graph = helper.make_graph([helper.make_node("Identity", ["states"], ["out"])], "g", [states], [out])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        onnx.checker.check_model(model)
        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    assert device_pooling_for(session_with(TensorProto.FLOAT), "out", None) is None  # a CPU loader gives no graph
    assert isinstance(device_pooling_for(session_with(TensorProto.FLOAT), "out", pooling_graph), DevicePooling)
    with caplog.at_level("WARNING", logger="sie.worker.device_pooling"):
        assert device_pooling_for(session_with(TensorProto.INT64), "out", pooling_graph) is None
        assert device_pooling_for(session_with(TensorProto.FLOAT), "out", lambda states_type: b"no model") is None
    reasons = [record.getMessage() for record in caplog.records]
    assert len(reasons) == 2 and "tensor(int64)" in reasons[0] and "stay pooled on the host" in reasons[1]
