"""onnxruntime session creation: real graphs, provider verification and translated errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from sie.settings import load_role_settings
from sie.worker.errors import ModelLoadError
from sie.worker.loading import ModelLoader
from sie.worker.session import SessionOptions, create_session, providers_for


@pytest.fixture()
def relu_graph(tmp_path: Path) -> Path:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    return path


def test_cpu_session_runs(relu_graph: Path) -> None:
    session = create_session(relu_graph, SessionOptions(intra_op_threads=1))
    (result,) = session.run(None, {"x": np.array([-1.0, 2.0], dtype=np.float32)})
    assert result.tolist() == [0.0, 2.0]
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_cuda_request_that_lands_on_cpu_fails_loudly(relu_graph: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        create_session(relu_graph, SessionOptions(device="cuda:0"))
    assert info.value.error_class == "DEPENDENCY"
    assert "asked for cuda:0" in info.value.message


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as info:
        create_session(tmp_path / "none.onnx", SessionOptions())
    assert info.value.error_class == "NOT_FOUND" and info.value.permanent


def test_corrupt_graph(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.onnx"
    path.write_bytes(b"\x08\x07not a protobuf at all" * 10)
    with pytest.raises(ModelLoadError) as info:
        create_session(path, SessionOptions())
    assert info.value.error_class == "UNKNOWN"
    assert "corrupt.onnx" in info.value.message


def test_device_parsing() -> None:
    assert providers_for("cpu") == ["CPUExecutionProvider"]
    assert providers_for("cuda:1")[0] == ("CUDAExecutionProvider", {"device_id": 1})
    with pytest.raises(ModelLoadError, match="unknown device"):
        providers_for("tpu:0")


@pytest.mark.parametrize("spinning", [True, False])
def test_intra_op_spinning_lasts_only_while_a_run_is_active(relu_graph: Path, spinning: bool) -> None:
    session = create_session(relu_graph, SessionOptions(intra_op_threads=2, intra_op_spinning=spinning))
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.enable_cpu_mem_arena is False


@pytest.mark.parametrize(("environ", "arguments", "spinning"), [
    ({}, [], True),
    ({"SIE_ORT_INTRA_OP_SPINNING": "false"}, [], False),
    ({}, ["--intra-op-spinning", "no"], False),
])  # fmt: skip
def test_the_loader_sessions_spin_as_the_settings_say(environ: dict, arguments: list[str], spinning: bool) -> None:
    settings = load_role_settings(["--role", "worker", *arguments], environ)
    assert ModelLoader.from_settings(settings.worker).session_options.intra_op_spinning is spinning
