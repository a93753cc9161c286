"""`torch.save` zip checkpoints read without torch: every float dtype, views that are not contiguous, storages
shared between tensors, against what torch itself saved; a pickle that asks for anything but tensors is refused
without running it; a `pytorch_model.bin` checkpoint converts to the same graph as its safetensors twin. torch is
imported by the tests, never by the reader."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from sie.worker.convert import ConversionError, convert_encoder
from sie.worker.convert.torch_zip import TorchZipFile
from support.encoder_checkpoints import random_model, write_tokenizer


def test_a_state_dict_reads_back_as_torch_saved_it(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    base = torch.randn(6, 4)
    state = {
        "f32": torch.randn(3, 5),
        "f16": torch.randn(7).half(),
        "bf16": torch.randn(2, 3).bfloat16(),
        "transposed": base.t(),  # a view with strides (1, 4)
        "row": base[2],  # a view at an offset into the same storage
        "scalar": torch.tensor(1.5),
    }
    torch.save(state, tmp_path / "state.pt")
    reader = TorchZipFile(tmp_path / "state.pt")
    assert sorted(reader.entries) == sorted(state)
    for name, tensor in state.items():
        ours = reader.load(name)
        assert ours.dtype == np.float32 and ours.flags.c_contiguous
        assert np.array_equal(ours, tensor.float().numpy()), name


def test_a_module_state_dict_with_parameters_reads(tmp_path: Path) -> None:
    import torch

    layer = torch.nn.Linear(4, 2)
    torch.save(layer.state_dict(), tmp_path / "linear.pt")  # OrderedDict with _metadata, as BGE-M3's heads
    reader = TorchZipFile(tmp_path / "linear.pt")
    assert np.array_equal(reader.load("weight"), layer.weight.detach().numpy())
    assert np.array_equal(reader.load("bias"), layer.bias.detach().numpy())


def test_a_training_checkpoints_nested_state_dicts_read_by_dotted_path(tmp_path: Path) -> None:
    """A training checkpoint (`{"pruning_head": state_dict, "epoch": 3, …}`): its tensors under their path, the
    numbers and strings beside them passed over; a file holding no tensor at all is refused."""
    import torch

    layer = torch.nn.Linear(4, 2)
    torch.save({"pruning_head": layer.state_dict(), "epoch": 3, "best_f1": 0.5, "note": "best"}, tmp_path / "best.pt")
    reader = TorchZipFile(tmp_path / "best.pt")
    assert reader.names() == ["pruning_head.bias", "pruning_head.weight"]
    assert np.array_equal(reader.load("pruning_head.weight"), layer.weight.detach().numpy())
    torch.save({"epoch": 3}, tmp_path / "empty.pt")
    with pytest.raises(ConversionError, match="holds no tensors"):
        TorchZipFile(tmp_path / "empty.pt")


class _RunsACommand:
    def __reduce__(self) -> tuple:
        return (print, ("the checkpoint ran code",))


def test_a_pickle_asking_for_anything_else_is_refused_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"weight": _RunsACommand()}, protocol=2))
    with pytest.raises(ConversionError, match=r"print is not part of a state dict of tensors"):
        TorchZipFile(path)
    assert "ran code" not in capsys.readouterr().out


def test_a_legacy_pickle_checkpoint_is_named_not_read(tmp_path: Path) -> None:
    import torch

    buffer = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buffer, _use_new_zipfile_serialization=False)
    (tmp_path / "old.bin").write_bytes(buffer.getvalue())
    with pytest.raises(ConversionError, match="legacy torch.save pickle is not read"):
        TorchZipFile(tmp_path / "old.bin")


def test_a_pytorch_model_bin_checkpoint_converts_to_the_same_model(tmp_path: Path) -> None:
    import torch

    model = random_model("bert", "none")
    model.save_pretrained(tmp_path / "safetensors")
    (tmp_path / "bin").mkdir()
    model.config.to_json_file(tmp_path / "bin" / "config.json")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")  # transformers 4 without safetensors
    for name in ("safetensors", "bin"):
        write_tokenizer(tmp_path / name, "bert")
        convert_encoder(tmp_path / name, tmp_path / f"{name}.onnx", "none")
    feeds = {"input_ids": np.array([[2, 7, 9, 3]]), "attention_mask": np.ones((1, 4), dtype=np.int64),
             "token_type_ids": np.zeros((1, 4), dtype=np.int64)}  # fmt: skip
    outputs = [
        ort.InferenceSession(str(tmp_path / f"{name}.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        for name in ("safetensors", "bin")
    ]
    assert np.array_equal(outputs[0], outputs[1])
