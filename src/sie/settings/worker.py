"""The worker: its IPC socket, devices, model cache, memory budget and onnxruntime threads
(DESIGN §6-7, contracts A §2.1 and B §5.2).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from sie.settings._parsers import (
    boolean,
    byte_size,
    choice,
    device_spec,
    integer,
    number,
    path,
    seconds,
    string_list,
)
from sie.settings._spec import Env, setting


def _model_cache(environ: Mapping[str, str]) -> Path:
    cache_home = (environ.get("XDG_CACHE_HOME") or "").strip()
    base = Path(cache_home) if cache_home else Path.home() / ".cache"
    return base / "sie" / "models"


@attrs.frozen
class WorkerSettings:
    """One worker process (or N children, one per device) that loads and runs models."""

    socket_path: Path = setting(
        Env(
            "SIE_IPC_SOCKET_PATH",
            path(),
            "Unix socket the worker serves and the sidecar dials; children add `.{index}`.",
            flag="--socket",
        ),
        Path("/tmp/sie-ipc.sock"),
    )
    devices: str = setting(
        Env(
            "SIE_WORKER_DEVICES",
            device_spec(),
            "Worker children: `auto` (one per visible GPU, else one CPU child), a count, or `cuda:0,cuda:1`.",
            flag="--devices",
        ),
        "auto",
    )
    backend: str = setting(
        Env(
            "SIE_WORKER_BACKEND",
            choice("onnx", "null"),
            "`null` answers every batch without running a model (transport benchmarks).",
            flag="--backend",
        ),
        "onnx",
    )
    model_cache: Path = setting(
        Env(
            "SIE_MODEL_CACHE",
            path(),
            "Directory of downloaded and converted model artifacts, keyed by content hash.",
            aliases=("SIE_LOCAL_CACHE",),
            shown_default="`$XDG_CACHE_HOME/sie/models` or `~/.cache/sie/models`",
        ),
        factory=_model_cache,
    )
    hf_fallback: bool = setting(
        Env("SIE_HF_FALLBACK", boolean(), "Use the Hugging Face Hub when no offline source has the model."),
        True,
    )
    preload_models: tuple[str, ...] = setting(
        Env(
            "SIE_PRELOAD_MODELS",
            string_list(),
            "Models loaded at start-up, before readiness; others load on first use.",
            flag="--preload",
        ),
        (),
    )
    memory_budget_bytes: int | None = setting(
        Env(
            "SIE_WORKER_MEMORY_BUDGET_BYTES",
            byte_size(),
            "Memory for loaded models per child; LRU eviction keeps under it. Unset: from device memory.",
        ),
        None,
    )
    memory_pressure_percent: float = setting(
        Env(
            "SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT",
            number(1, 100),
            "Device memory use above which least-recently-used models are evicted before a load.",
        ),
        85.0,
    )
    max_loaded_models: int | None = setting(
        Env("SIE_MAX_LOADED_MODELS", integer(minimum=1), "Most models loaded at once. Unset: no limit."),
        None,
    )
    idle_evict_s: float | None = setting(
        Env(
            "SIE_IDLE_EVICT_S",
            seconds(maximum=86400),
            "Unload a model unused for this long. Unset: never for idleness.",
        ),
        None,
    )
    intra_op_threads: int | None = setting(
        Env(
            "SIE_ORT_INTRA_OP_THREADS",
            integer(minimum=1),
            "onnxruntime intra-op threads per session. Unset: the cores left after tokenization.",
            flag="--intra-op-threads",
        ),
        None,
    )
    inter_op_threads: int | None = setting(
        Env(
            "SIE_ORT_INTER_OP_THREADS",
            integer(minimum=1),
            "onnxruntime inter-op threads per session. Unset: onnxruntime's default.",
            flag="--inter-op-threads",
        ),
        None,
    )
