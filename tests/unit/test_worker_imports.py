"""What starting a worker imports: the worker role (its service, model loader and adapters) loads neither `onnx`
(about 1.4 s of ml_dtypes start-up in every worker process) nor `gguf`; the converter brings them in when a model has
to be converted, and `sie.worker.convert`'s public names still reach it. Nor does it load what only some models or
connections use (test_role_imports.py): Jinja (chat templates), fsspec (weights URLs), hypercorn (h2c), NATS."""

from __future__ import annotations

import json
import subprocess
import sys

CONVERTER_ONLY = ("onnx", "gguf")
LOADED_WHERE_USED = ("jinja2", "fsspec", "hypercorn", "nats")

PROBE = f"""
import json, sys
import sie.roles.worker
started = [name for name in {CONVERTER_ONLY + LOADED_WHERE_USED!r} if name in sys.modules]
from sie.worker.convert import convert_encoder, convert_gguf
converting = [name for name in {CONVERTER_ONLY!r} if name in sys.modules]
print(json.dumps({{"started": started, "converting": converting}}))
"""


def test_a_worker_starts_without_onnx_gguf_or_what_only_some_models_use_and_loads_onnx_to_convert() -> None:
    # A fresh interpreter: this test process has long imported both.
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    imported = json.loads(probe.stdout)
    assert imported["started"] == []
    assert imported["converting"] == ["onnx"]  # `gguf` loads when a GGUF file is opened
