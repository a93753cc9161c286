"""`scripts/device_generation.py`, the generation step of `scripts/device_check.sh`, run on the CPU so that it keeps
working between GPU loans: a random Llama it writes by hand converts, and its decode steps through the engine's
IO-bound runs give the same logits as `session.run` in float16 (the precision a GPU profile gets) and float32; a
Qwen3.5 and a Gemma 4 too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device_generation.py"


@pytest.mark.parametrize(
    ("family", "precision"), [("llama", "float16"), ("llama", "float32"), ("qwen3_5", "float16"), ("gemma4", "float16")]
)
def test_the_device_generation_check_passes_on_the_cpu(family: str, precision: str) -> None:
    """Qwen3.5's linear-attention states ride in the cache beside the keys and values (its prompts run the rule in
    chunks, 80 tokens: two of them); Gemma 4's caches are of two head sizes, and its shared layers keep none."""
    layers, prompt = {"qwen3_5": ("4", "80"), "gemma4": ("4", "48")}.get(family, ("2", "48"))
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--precision", precision, "--hidden", "128",
               "--layers", layers, "--prompt", prompt, "--steps", "8", "--rounds", "1", "--family", family]  # fmt: skip
    finished = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert finished.returncode == 0, finished.stderr
    assert f"{precision} on CPUExecutionProvider" in finished.stdout
    assert "max difference 0.0e+00" in finished.stdout  # the same graph on the same inputs, cache fed back as is
    assert "decode steps/s" in finished.stdout
