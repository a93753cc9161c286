"""What starting a worker imports: the worker service, the model loader and the adapters load neither `onnx` (about
1.4 s of ml_dtypes start-up in every worker process) nor `gguf`; the converter brings them in when a model has to be
converted, and `sie.worker.convert`'s public names still reach it."""

from __future__ import annotations

import json
import subprocess
import sys

CONVERTER_ONLY = ("onnx", "gguf")

PROBE = f"""
import json, sys
import sie.worker.adapters, sie.worker.loading, sie.worker.service
started = [name for name in {CONVERTER_ONLY!r} if name in sys.modules]
from sie.worker.convert import convert_encoder, convert_gguf
converting = [name for name in {CONVERTER_ONLY!r} if name in sys.modules]
print(json.dumps({{"started": started, "converting": converting}}))
"""


def test_a_worker_starts_without_onnx_or_gguf_and_loads_onnx_to_convert() -> None:
    # A fresh interpreter: this test process has long imported both.
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    imported = json.loads(probe.stdout)
    assert imported["started"] == []
    assert imported["converting"] == ["onnx"]  # `gguf` loads when a GGUF file is opened
