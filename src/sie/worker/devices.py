"""Which devices this host has and how a SIE_WORKER_DEVICES spec maps onto them: one worker child per device,
its share of the cores and the memory its models may hold.

The CUDA driver is asked through ctypes (libcuda), never through torch, so CUDA_VISIBLE_DEVICES is honoured
the way onnxruntime will honour it; a host without the driver has no CUDA device. Starts nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from typing import Any, Final

import attrs

logger = logging.getLogger(__name__)

CPU: Final = "cpu"
CUDA: Final = "cuda"
CUDA_PROVIDER: Final = "CUDAExecutionProvider"
GPU_REMEDY: Final = "pip install 'sie[gpu-cuda]' (onnxruntime-gpu with its CUDA and cuDNN wheels)"
# Weight bytes are only part of a model's footprint: activations, onnxruntime's arena and (on CPU) the
# tokenizers, the event loop and the other roles need the rest.
CUDA_MEMORY_SHARE: Final = 0.6
CPU_MEMORY_SHARE: Final = 0.5


class DeviceError(Exception):
    """The spec asks for devices this host cannot give; `error_class` is DEPENDENCY or NOT_FOUND."""

    def __init__(self, error_class: str, message: str) -> None:
        self.error_class = error_class
        self.message = message
        super().__init__(message)


@attrs.frozen
class Device:
    """One worker child's device: `cpu` or `cuda:N`; `index` is N (the child's number for CPU children);
    `intra_op_threads` is its share of the host's cores."""

    name: str
    index: int
    intra_op_threads: int

    @property
    def kind(self) -> str:
        return CUDA if self.name.startswith(CUDA) else CPU


@attrs.frozen
class Host:
    """What this host offers: cores, visible CUDA devices and whether onnxruntime can use them."""

    cores: int
    cuda_devices: int
    cuda_provider: bool

    @classmethod
    def probe(cls) -> Host:
        return cls(os.cpu_count() or 1, cuda_device_count(), has_cuda_provider())


def _libcuda() -> Any:
    """The initialised CUDA driver library, or None when there is no driver or no device."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return lib if lib.cuInit(0) == 0 else None


def cuda_device_count() -> int:
    """CUDA devices visible to this process (after CUDA_VISIBLE_DEVICES); 0 without a driver."""
    lib = _libcuda()
    count = ctypes.c_int(0)
    if lib is None or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def cuda_free_memory(index: int) -> int | None:
    """Free bytes on CUDA device `index` now, through its primary context (released again); None if unknown."""
    lib = _libcuda()
    device, context = ctypes.c_int(0), ctypes.c_void_p()
    if lib is None or lib.cuDeviceGet(ctypes.byref(device), index) != 0:
        return None
    if lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
        return None
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    try:
        if lib.cuCtxPushCurrent_v2(context) != 0:
            return None
        status = lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(device)
    return free.value if status == 0 else None


def has_cuda_provider() -> bool:
    """Whether the installed onnxruntime build offers the CUDA execution provider."""
    try:
        import onnxruntime  # the worker's runtime; imported here only to list its providers
    except ImportError:
        return False
    return CUDA_PROVIDER in onnxruntime.get_available_providers()


def load_cuda_libraries() -> None:
    """Load CUDA and cuDNN for onnxruntime before its first CUDA session: onnxruntime-gpu installed with its
    nvidia-* wheels (`sie[gpu-cuda]`) finds them only through `preload_dlls` (onnxruntime >= 1.21); with a system
    CUDA on the library path this changes nothing. Call it in the process that opens the sessions."""
    try:
        import onnxruntime  # the worker's runtime; imported here only to load its CUDA libraries
    except ImportError:
        return
    preload = getattr(onnxruntime, "preload_dlls", None)
    if preload is not None:
        preload()


def available_memory() -> int | None:
    """Memory the host can give without swapping: MemAvailable from /proc/meminfo, else free pages; None if
    neither can be read."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def _cuda_ordinals(spec: str, host: Host) -> list[int]:
    asked = f"devices {spec!r} (SIE_WORKER_DEVICES, --devices)"
    if host.cuda_devices == 0:
        raise DeviceError(
            "NOT_FOUND",
            f"{asked} ask for CUDA, but this host has no visible CUDA device (no NVIDIA driver, or "
            "CUDA_VISIBLE_DEVICES hides them); use --devices cpu or auto",
        )
    _, _, listed = spec.partition(":")
    ordinals = [int(index) for index in listed.split(",")] if listed else list(range(host.cuda_devices))
    missing = [ordinal for ordinal in ordinals if ordinal >= host.cuda_devices]
    if missing:
        visible = ", ".join(f"cuda:{index}" for index in range(host.cuda_devices))
        raise DeviceError(
            "NOT_FOUND",
            f"{asked} name cuda:{missing[0]}, but this host has {host.cuda_devices} visible CUDA device(s), {visible}",
        )
    if not host.cuda_provider:
        raise DeviceError(
            "DEPENDENCY",
            f"{asked} run models on {len(ordinals)} CUDA device(s), but the installed onnxruntime has no "
            f"{CUDA_PROVIDER}: {GPU_REMEDY}, or use --devices cpu",
        )
    return ordinals


def _shares(names: list[tuple[str, int]], cores: int) -> list[Device]:
    share = max(1, cores // len(names))
    return [Device(name, index, share) for name, index in names]


def resolve_devices(spec: str, host: Host | None = None) -> list[Device]:
    """The devices a normalised spec (settings' `device_spec`) names on `host` (default: this one), one per
    worker child, in child order; DeviceError when the host cannot give them."""
    host = Host.probe() if host is None else host
    kind, _, detail = spec.partition(":")
    if kind == "auto":
        kind = CUDA if host.cuda_devices and host.cuda_provider else CPU
        if host.cuda_devices and not host.cuda_provider:
            # The default must serve out of the box: the GPUs stay idle, and the log says how to use them.
            logger.warning(
                "%d CUDA device(s) visible, but the installed onnxruntime has no %s: serving on one CPU child "
                "(%s, then restart; --devices cuda makes this an error instead)",
                host.cuda_devices, CUDA_PROVIDER, GPU_REMEDY,
            )  # fmt: skip
    if kind == CPU:
        count = int(detail) if detail else 1
        return _shares([(CPU, index) for index in range(count)], host.cores)
    if kind == CUDA:
        return _shares([(f"cuda:{ordinal}", ordinal) for ordinal in _cuda_ordinals(spec, host)], host.cores)
    raise ValueError(f"unknown device spec {spec!r}; the settings parser admits no such value, this is a bug")


def memory_budget(
    device: Device,
    configured: int | None,
    *,
    cpu_children: int = 1,
    available: int | None = None,
    cuda_free: int | None = None,
) -> int | None:
    """One child's model memory budget: `configured` when set; else CUDA_MEMORY_SHARE of its GPU's free
    memory, or CPU_MEMORY_SHARE of the host's available memory divided among `cpu_children`. None when the
    device cannot be measured. `available` and `cuda_free` replace the measurements (tests)."""
    if configured is not None:
        return configured
    if device.kind == CUDA:
        free = cuda_free_memory(device.index) if cuda_free is None else cuda_free
        return int(free * CUDA_MEMORY_SHARE) if free else None
    host_memory = available_memory() if available is None else available
    if not host_memory:
        return None
    return max(1, int(host_memory * CPU_MEMORY_SHARE) // max(1, cpu_children))
