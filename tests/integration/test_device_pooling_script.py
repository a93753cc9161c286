"""`scripts/device_pooling.py`, the pooling step of `scripts/device_check.sh`, run on the CPU so that it keeps working
between GPU loans: a random Llama's hidden states pooled and projected through `sie.worker.device_pooling` (bound on
the session's device, a pooling graph and a token head beside it) equal numpy's pooling and projection of
`session.run`'s states, in float16 (the precision a GPU profile gets) and float32."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_pooling.py"


@pytest.mark.parametrize("precision", ["float16", "float32"])
def test_the_device_pooling_check_passes_on_the_cpu(precision: str) -> None:
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--precision", precision, "--hidden", "128",
               "--layers", "2", "--tokens", "48", "--rows", "8", "--rounds", "1", "--seconds", "0.2"]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr
    assert f"{precision} on CPUExecutionProvider" in finished.stdout
    pooled, projected = (float(part.split()[0]) for part in finished.stdout.split("max difference ")[1:])
    assert pooled <= 1e-5 and projected <= 1e-5
    assert "device pooling" in finished.stdout and "device projection" in finished.stdout
