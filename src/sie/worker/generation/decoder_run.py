"""One run of a decoder graph (a prefill or a decode step): the logits come back to the host, the key/value cache
stays where onnxruntime computed it.

`session.run` copies every output into a new numpy array: the whole cache, at every decode step (on a GPU from the
device to the host, and back again as the next step's input). DecoderRun binds inputs and outputs instead
(onnxruntime's IOBinding): the `present.*` outputs stay OrtValues on the session's device and are fed back as the
next step's `past_key_values.*` as they are; only the logits are copied to the host, for sampling. The cache comes
to the host only when rows join or leave the batch (`kv_cache.BatchCache` pads and slices it there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from sie.worker.convert.names import LOGITS, PAST_PREFIX, PRESENT_PREFIX

CUDA_PROVIDER = "CUDAExecutionProvider"


class DecoderRun:
    """Runs `session` with its cache outputs left on its device (the CPU's memory or a GPU's)."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._output_names = [output.name for output in session.get_outputs()]
        self._logits_index = self._output_names.index(LOGITS)
        self._device = device_of(session)

    def __call__(self, feeds: Mapping[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
        """The last positions' logits (numpy) and the `present.*` caches named as the next run's
        `past_key_values.*` feeds (OrtValues). A feed may be a numpy array or an OrtValue a run returned."""
        binding = self._session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
            else:
                binding.bind_ortvalue_input(name, value)
        device_type, device_id = self._device
        for name in self._output_names:
            if name == LOGITS:
                binding.bind_output(name, "cpu")
            else:
                binding.bind_output(name, device_type, device_id)
        self._session.run_with_iobinding(binding)
        values = binding.get_outputs()
        logits = values[self._logits_index].numpy()
        cache = {
            PAST_PREFIX + name.removeprefix(PRESENT_PREFIX): value
            for name, value in zip(self._output_names, values, strict=True)
            if name.startswith(PRESENT_PREFIX)
        }
        return logits, cache


def device_of(session: Any) -> tuple[str, int]:
    """Where `session` computes: ("cuda", its device id) on the CUDA provider, else ("cpu", 0)."""
    if session.get_providers()[0] != CUDA_PROVIDER:
        return "cpu", 0
    options = session.get_provider_options().get(CUDA_PROVIDER, {})
    return "cuda", int(options.get("device_id", 0))
