"""GgufFile's tensor reading: quantized blocks dequantize to what the `gguf` package gives row by row, whatever
rows `load` joins before handing them over (JOINED_ROW_BYTES)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from sie.worker.convert.gguf_io import JOINED_ROW_BYTES, GgufFile


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q5_1"])
@pytest.mark.parametrize("rows", [1, 7, 12, 4099, 4104])  # 4099 is prime: joined one row at a time
def test_quantized_rows_load_as_the_gguf_package_dequantizes_each_row(tmp_path: Path, kind: str, rows: int) -> None:
    qtype = gguf.GGMLQuantizationType[kind]
    weights = np.random.default_rng(rows).standard_normal((rows, 96)).astype(np.float32)
    blocks = gguf.quants.quantize(weights, qtype)
    assert rows < 100 or rows * blocks.shape[-1] > JOINED_ROW_BYTES  # the large ones are joined in several parts
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("weight", blocks, raw_shape=blocks.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    loaded = GgufFile(path).load("weight")
    expected = np.stack([gguf.quants.dequantize(row, qtype) for row in blocks])
    assert loaded.shape == (rows, 96) and loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, expected)
    assert np.abs(loaded - weights).max() < 0.5  # and it is the matrix quantized, not some other one
