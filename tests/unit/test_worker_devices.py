"""SIE_WORKER_DEVICES: the grammar the settings accept, how a spec resolves on a host (fake hosts, no GPU
needed), and each child's memory budget."""

from __future__ import annotations

import pytest

from sie.settings import SettingsError, load_role_settings
from sie.worker.devices import (
    CPU_MEMORY_SHARE,
    CUDA_MEMORY_SHARE,
    Device,
    DeviceError,
    Host,
    available_memory,
    cuda_device_count,
    memory_budget,
    resolve_devices,
)

CPU_HOST = Host(cores=8, cuda_devices=0, cuda_provider=False)
GPU_HOST = Host(cores=16, cuda_devices=4, cuda_provider=True)
GPU_HOST_WITHOUT_PROVIDER = Host(cores=16, cuda_devices=2, cuda_provider=False)


def devices_setting(value: str) -> str:
    return load_role_settings(["--role", "worker", "--devices", value], {}).worker.devices


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        ("auto", "auto"),
        ("CPU", "cpu"),
        ("cpu:3", "cpu:3"),
        ("cuda", "cuda"),
        ("cuda:0", "cuda:0"),
        (" cuda:0, 2 ", "cuda:0,2"),
        ("cuda:02", "cuda:2"),
    ],
)
def test_the_setting_accepts_the_device_grammar(given: str, normalised: str) -> None:
    assert devices_setting(given) == normalised


def test_the_default_is_auto_and_the_variable_works_too() -> None:
    assert load_role_settings(["--role", "worker"], {}).worker.devices == "auto"
    assert load_role_settings(["--role", "all"], {"SIE_WORKER_DEVICES": "cpu:2"}).worker.devices == "cpu:2"


@pytest.mark.parametrize("bad", ["gpu", "cpu:0", "cpu:", "cpu:2,3", "cuda:", "cuda:a", "cuda:0,0", "cuda:-1", "2"])
def test_the_setting_refuses_anything_else(bad: str) -> None:
    with pytest.raises(SettingsError) as caught:
        devices_setting(bad)
    (problem,) = caught.value.problems
    assert problem.startswith(f"--devices={bad!r}")
    assert "expected auto, cpu, cpu:N" in problem


def test_auto_is_one_cpu_child_with_every_core_on_a_host_without_gpus() -> None:
    assert resolve_devices("auto", CPU_HOST) == [Device("cpu", 0, 8)]
    assert resolve_devices("cpu", GPU_HOST) == [Device("cpu", 0, 16)]


def test_cpu_children_split_the_cores() -> None:
    assert resolve_devices("cpu:2", CPU_HOST) == [Device("cpu", 0, 4), Device("cpu", 1, 4)]
    assert [device.intra_op_threads for device in resolve_devices("cpu:3", CPU_HOST)] == [2, 2, 2]
    assert [device.intra_op_threads for device in resolve_devices("cpu:16", CPU_HOST)] == [1] * 16


def test_auto_and_cuda_take_every_visible_gpu() -> None:
    expected = [Device(f"cuda:{index}", index, 4) for index in range(4)]
    assert resolve_devices("auto", GPU_HOST) == expected
    assert resolve_devices("cuda", GPU_HOST) == expected
    assert all(device.kind == "cuda" for device in expected)


def test_a_gpu_list_takes_those_gpus_in_order() -> None:
    assert resolve_devices("cuda:2,0", GPU_HOST) == [Device("cuda:2", 2, 8), Device("cuda:0", 0, 8)]


def test_a_gpu_the_host_lacks_is_a_clear_error() -> None:
    with pytest.raises(DeviceError) as caught:
        resolve_devices("cuda:0,7", GPU_HOST)
    assert caught.value.error_class == "NOT_FOUND"
    assert "cuda:7" in caught.value.message and "4 visible CUDA device(s)" in caught.value.message


def test_cuda_on_a_host_without_gpus_is_a_clear_error() -> None:
    with pytest.raises(DeviceError) as caught:
        resolve_devices("cuda", CPU_HOST)
    assert caught.value.error_class == "NOT_FOUND" and "no visible CUDA device" in caught.value.message


def test_auto_with_gpus_but_no_cuda_provider_serves_on_cpu_and_says_how_to_use_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="sie.worker.devices"):
        assert [device.name for device in resolve_devices("auto", GPU_HOST_WITHOUT_PROVIDER)] == ["cpu"]
    assert "pip install 'sie[gpu-cuda]'" in caplog.text and "CUDAExecutionProvider" in caplog.text


@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_gpus_without_the_cuda_provider_are_a_dependency_error_naming_the_remedy(spec: str) -> None:
    with pytest.raises(DeviceError) as caught:
        resolve_devices(spec, GPU_HOST_WITHOUT_PROVIDER)
    assert caught.value.error_class == "DEPENDENCY"
    assert "CUDAExecutionProvider" in caught.value.message
    assert "pip install 'sie[gpu-cuda]'" in caught.value.message


def test_a_configured_budget_is_each_childs() -> None:
    assert memory_budget(Device("cpu", 1, 4), 5_000, cpu_children=2, available=10**9) == 5_000
    assert memory_budget(Device("cuda:0", 0, 4), 5_000, cuda_free=10**9) == 5_000


def test_cpu_children_share_a_part_of_the_available_memory() -> None:
    available = 16 * 2**30
    alone = memory_budget(Device("cpu", 0, 8), None, available=available)
    assert alone == int(available * CPU_MEMORY_SHARE)
    assert memory_budget(Device("cpu", 1, 4), None, cpu_children=2, available=available) == alone // 2


def test_a_gpu_budget_is_a_part_of_its_free_memory() -> None:
    assert memory_budget(Device("cuda:1", 1, 4), None, cuda_free=80 * 2**30) == int(80 * 2**30 * CUDA_MEMORY_SHARE)


def test_this_host_is_measured() -> None:
    measured = available_memory()
    assert measured is not None and measured > 0
    assert [device.name for device in resolve_devices("cpu:2")] == ["cpu", "cpu"]
    if cuda_device_count() == 0:  # the test machines: no NVIDIA driver, so `auto` is one CPU child
        assert [device.name for device in resolve_devices("auto")] == ["cpu"]
        assert memory_budget(Device("cuda:0", 0, 1), None) is None  # an unmeasurable GPU has no budget
