"""The worker: its IPC socket, backend, model cache, memory limits and onnxruntime threads
(DESIGN §6-7, contracts A §2.1 and B §5.2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from sie.settings._parsers import boolean, byte_size, choice, device_spec, integer, milliseconds, path, string_list
from sie.settings._spec import Env, setting

_MODEL_ROLES = ("worker", "all")


def _model_cache(environ: Mapping[str, str]) -> Path:
    cache_home = (environ.get("XDG_CACHE_HOME") or "").strip()
    base = Path(cache_home) if cache_home else Path.home() / ".cache"
    return base / "sie" / "models"


def _private_socket_path(environ: Mapping[str, str]) -> Path:
    # A directory of this user's only, never a name any user of the machine could take first in /tmp: the
    # per-user runtime directory (XDG: owned by the user, mode 0700), else a `sie-{uid}` directory in the temp dir
    # that the worker creates 0700 and checks is its own.
    runtime = (environ.get("XDG_RUNTIME_DIR") or "").strip()
    if runtime:
        return Path(runtime) / "sie" / "worker.sock"
    temp = (environ.get("TMPDIR") or "").strip() or "/tmp"
    return Path(temp) / f"sie-{os.getuid()}" / "worker.sock"


@attrs.frozen
class WorkerSettings:
    """One worker process that loads and runs models, and the socket its sidecar dials."""

    socket_path: Path = setting(
        Env(
            "SIE_IPC_SOCKET_PATH",
            path(),
            "Unix socket the worker serves and the sidecar dials. The worker creates its directory (mode 0700) "
            "when missing and refuses one owned by another user (root aside), a live socket at the path (another "
            "worker's) or anything else that is no socket; a stale socket is replaced. Containers of one pod set "
            "it to a path on a volume they share.",
            flag="--socket",
            shown_default="`$XDG_RUNTIME_DIR/sie/worker.sock`, else `${TMPDIR:-/tmp}/sie-{uid}/worker.sock`",
            roles=("sidecar", "worker"),
            read_by=("sie.roles.sidecar", "sie.roles.worker"),
        ),
        factory=_private_socket_path,
    )
    backend: str = setting(
        Env(
            "SIE_WORKER_BACKEND",
            choice("onnx", "null"),
            "`null` answers every batch without running a model (transport benchmarks).",
            flag="--backend",
            roles=_MODEL_ROLES,
            read_by=("sie.roles.local_workers",),
        ),
        "onnx",
    )
    null_item_time_s: float = setting(
        Env(
            "SIE_NULL_ITEM_TIME_MS",
            milliseconds(),
            "With `--backend null`: how long each batch takes per item, waited (not computed), standing in for a "
            "device's run time so a benchmark can scale sidecars past the CPUs it has (`scripts/bench/scale.py`).",
            flag="--null-item-time-ms",
            roles=_MODEL_ROLES,
            read_by=("sie.roles.local_workers",),
        ),
        0.0,
    )
    devices: str = setting(
        Env(
            "SIE_WORKER_DEVICES",
            device_spec(),
            "Devices to run models on, one worker child each: `auto` (every visible CUDA device when onnxruntime "
            "has its CUDA provider, else one CPU child and a warning), `cpu`, `cpu:N` (N CPU children sharing the "
            "cores), `cuda` (every visible GPU) or `cuda:0,2`. Asking for CUDA needs onnxruntime's CUDA provider "
            "(`pip install 'sie[gpu-cuda]'`).",
            flag="--devices",
            roles=_MODEL_ROLES,
            read_by=("sie.roles.local_workers", "sie.roles.worker"),
        ),
        "auto",
    )
    model_cache: Path = setting(
        Env(
            "SIE_MODEL_CACHE",
            path(),
            "Directory of downloaded and converted model artifacts, keyed by content hash (`sie models pull` "
            "fills it too).",
            aliases=("SIE_LOCAL_CACHE",),
            shown_default="`$XDG_CACHE_HOME/sie/models` or `~/.cache/sie/models`",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        factory=_model_cache,
    )
    hf_fallback: bool = setting(
        Env(
            "SIE_HF_FALLBACK",
            boolean(),
            "Use the Hugging Face Hub when no offline source has the model.",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        True,
    )
    preload_models: tuple[str, ...] = setting(
        Env(
            "SIE_PRELOAD_MODELS",
            string_list(),
            "Models loaded at start-up, before readiness, and never evicted; others load on first use.",
            flag="--preload",
            roles=_MODEL_ROLES,
            read_by=("sie.roles.local_workers",),
        ),
        (),
    )
    memory_budget_bytes: int | None = setting(
        Env(
            "SIE_WORKER_MEMORY_BUDGET_BYTES",
            byte_size(),
            "Memory for each worker child's loaded models (their weight files' size); least-recently-used "
            "models are unloaded to stay under it. Unset: from the device, 60% of a GPU's free memory at start, "
            "or 50% of the host's available memory shared among the CPU children.",
            roles=_MODEL_ROLES,
            read_by=("sie.roles.local_workers", "sie.roles.worker"),
        ),
        None,
    )
    run_memory_bytes: int = setting(
        Env(
            "SIE_WORKER_RUN_MEMORY_BYTES",
            byte_size(),
            "Most activation memory one onnxruntime run may take, estimated from the batch's shape and the "
            "model's config.json (attention heads, hidden and feed-forward sizes). A bigger batch runs in row "
            "slices, with the same results; memory a large run freed is handed back to the OS once the worker has "
            "been idle for a second.",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        256 * 1024 * 1024,
    )
    max_loaded_models: int | None = setting(
        Env(
            "SIE_MAX_LOADED_MODELS",
            integer(minimum=1),
            "Most models loaded at once. Unset: no limit.",
            roles=_MODEL_ROLES,
            read_by=("sie.roles.local_workers",),
        ),
        None,
    )
    intra_op_threads: int | None = setting(
        Env(
            "SIE_ORT_INTRA_OP_THREADS",
            integer(minimum=1),
            "onnxruntime intra-op threads per session. Unset: the cores shared evenly among the worker children.",
            flag="--intra-op-threads",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading", "sie.roles.local_workers", "sie.roles.worker"),
        ),
        None,
    )
    inter_op_threads: int | None = setting(
        Env(
            "SIE_ORT_INTER_OP_THREADS",
            integer(minimum=1),
            "onnxruntime inter-op threads per session. Unset: onnxruntime's default.",
            flag="--inter-op-threads",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        None,
    )
    intra_op_spinning: bool = setting(
        Env(
            "SIE_ORT_INTRA_OP_SPINNING",
            boolean(),
            "Whether onnxruntime's intra-op threads spin between the parallel parts of a run instead of sleeping; "
            "they sleep between runs either way. Spinning takes the kernel's wake-ups out of a run (measured on "
            "all-MiniLM-L6-v2, 2 cores: a single sentence 0.3-1 ms sooner, throughput within the noise) for the "
            "CPU the threads burn while they wait within a run.",
            flag="--intra-op-spinning",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        True,
    )
    generation_max_sequences: int = setting(
        Env(
            "SIE_GENERATION_MAX_SEQUENCES",
            integer(minimum=1),
            "Sequences a generation model decodes together in one step (continuous batching, one decode thread per "
            "loaded model); further generations wait for a row to free up. More rows raise throughput and each "
            "step's latency, and the key/value cache grows with them.",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        16,
    )
    generation_cache_bytes: int = setting(
        Env(
            "SIE_GENERATION_CACHE_BYTES",
            integer(minimum=1),
            "Key/value cache one generation model's decoding batch may hold, in bytes. A generation joins the batch "
            "only while rows × the longest row's prompt plus max_tokens × the cache bytes of one token stays within "
            "it (SmolLM2 in float32: 46,080 bytes per token); otherwise it waits for rows to leave. A generation "
            "alone always runs. Each decode step briefly holds the cache twice (the past and the present).",
            roles=_MODEL_ROLES,
            read_by=("sie.worker.loading",),
        ),
        2 * 1024**3,
    )
