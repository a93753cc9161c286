"""onnxruntime sessions: the execution provider chosen by device, verified after creation.

onnxruntime-gpu silently falls back to CPU when CUDA libraries are missing (DESIGN.md §6), so a
session asked for `cuda:N` that came up on CPU is a load failure. onnxruntime errors are
translated into ModelLoadError here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from sie.worker.errors import ModelLoadError
from sie.worker.run_memory import DEFAULT_RUN_MEMORY_BYTES

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


@attrs.frozen
class SessionOptions:
    """Per-session knobs from settings: the device, onnxruntime thread pools (None = onnxruntime's default), the
    activation memory one run may take (SIE_WORKER_RUN_MEMORY_BYTES) and whether intra-op threads spin within a
    run (SIE_ORT_INTRA_OP_SPINNING)."""

    device: str = "cpu"
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    run_memory_bytes: int = DEFAULT_RUN_MEMORY_BYTES
    intra_op_spinning: bool = True


def _import_onnxruntime():  # noqa: ANN202 - returns the module
    try:
        import onnxruntime
    except ImportError as exc:
        raise ModelLoadError(
            "DEPENDENCY", "onnxruntime is not installed: pip install 'sie[cpu]' (or 'sie[gpu]')"
        ) from exc
    return onnxruntime


def providers_for(device: str) -> list:
    """`cpu` → CPU only; `cuda` / `cuda:N` → CUDA on device N, then CPU."""
    if device == "cpu":
        return [CPU_PROVIDER]
    kind, _, index = device.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ModelLoadError("DEPENDENCY", f"unknown device {device!r}; expected 'cpu' or 'cuda:N'")
    return [(CUDA_PROVIDER, {"device_id": int(index or 0)}), CPU_PROVIDER]


def _classify(exc: Exception, path: Path) -> ModelLoadError:
    text = str(exc)
    if "allocate" in text.lower() or "out of memory" in text.lower():
        return ModelLoadError("OOM", f"out of memory loading {path.name}: {text}")
    if "NO_SUCHFILE" in text or "No such file" in text:
        return ModelLoadError("NOT_FOUND", f"ONNX file not found: {path}")
    return ModelLoadError("UNKNOWN", f"cannot load ONNX graph {path.name} (corrupt or unsupported): {text}")


def create_session(path: Path, options: SessionOptions):  # noqa: ANN201 - onnxruntime.InferenceSession
    """Build an InferenceSession with full graph optimisation on the requested device, or raise."""
    ort = _import_onnxruntime()
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError("NOT_FOUND", f"ONNX file not found: {path}")
    providers = providers_for(options.device)
    if options.device != "cpu" and CUDA_PROVIDER not in ort.get_available_providers():
        raise ModelLoadError(
            "DEPENDENCY",
            f"asked for {options.device} but this onnxruntime build has no CUDA provider "
            f"({ort.get_available_providers()}): install 'sie[gpu]' or 'sie[gpu-cuda]'",
        )
    session_options = ort.SessionOptions()
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning (when on) lasts while a run is active: between runs the threads sleep and leave the cores to the
    # event loop and the tokenizer.
    spinning = "1" if options.intra_op_spinning else "0"
    session_options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    session_options.add_session_config_entry("session.force_spinning_stop", "1")
    # No CPU arena: it keeps the largest batch's memory for good. Measured on `--role all` after a 20 MB encode,
    # extract and score: RSS back to 565 MiB (arena: 4 GiB held), peak 1.6 GiB (arena: 4 GiB), throughput the
    # same within noise (scripts/bench/serve.py --compare-src, 335 vs 332 items/s at 32 clients).
    session_options.enable_cpu_mem_arena = False
    session_options.log_severity_level = 3  # provider fall-back warnings are handled below, not logged twice
    if options.intra_op_threads:
        session_options.intra_op_num_threads = options.intra_op_threads
    if options.inter_op_threads:
        session_options.inter_op_num_threads = options.inter_op_threads
    try:
        session = ort.InferenceSession(str(path), sess_options=session_options, providers=providers)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own untyped pybind exceptions
        raise _classify(exc, path) from exc
    if options.device != "cpu" and session.get_providers()[0] != CUDA_PROVIDER:
        raise ModelLoadError(
            "DEPENDENCY",
            f"asked for {options.device} but onnxruntime runs {session.get_providers()}: the CUDA provider did "
            "not load (install 'sie[gpu-cuda]', or CUDA 13 + cuDNN 9 for 'sie[gpu]')",
        )
    return session
