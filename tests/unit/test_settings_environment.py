"""A child `sie run` gets this process's settings as variables: what the child then loads equals what this
process loaded, with the overrides applied."""

from __future__ import annotations

import pytest

from sie.settings import SettingsError, child_environment, load_role_settings


def test_a_worker_child_loads_the_parents_settings_with_its_overrides() -> None:
    parent = load_role_settings(
        ["--role", "worker", "--devices", "cpu:2", "--preload", "a,b", "--socket", "/run/w.sock",
         "--worker-memory-budget-bytes", "3GiB"],
        {"SIE_WORKER_ID": "pod-7", "SIE_LOCAL_CACHE": "/models", "SIE_SHUTDOWN_GRACE_S": "2.5", "PATH": "/bin"},
    )  # fmt: skip
    overrides = {"worker.devices": "cpu", "worker.socket_path": "/run/w.sock.1", "process.worker_id": "pod-7-1",
                 "worker.intra_op_threads": 3}  # fmt: skip
    env = child_environment(parent, "worker", overrides, environ={"SIE_LOCAL_CACHE": "/models", "PATH": "/bin"})

    assert env["PATH"] == "/bin" and "SIE_LOCAL_CACHE" not in env  # aliases give way to the variable itself
    assert (env["SIE_WORKER_DEVICES"], env["SIE_IPC_SOCKET_PATH"]) == ("cpu", "/run/w.sock.1")
    assert (env["SIE_WORKER_ID"], env["SIE_ORT_INTRA_OP_THREADS"]) == ("pod-7-1", "3")
    child = load_role_settings(["--role", "worker"], env)
    assert child.worker.preload_models == ("a", "b")
    assert str(child.worker.model_cache) == "/models"
    assert child.worker.memory_budget_bytes == 3 * 2**30
    assert child.process.shutdown_grace_s == 2.5
    assert child.process.worker_id == "pod-7-1"
    assert str(child.worker.socket_path) == "/run/w.sock.1"


def test_an_unset_override_removes_the_variable() -> None:
    parent = load_role_settings(["--role", "worker"], {"SIE_WORKER_MEMORY_BUDGET_BYTES": "1GiB"})
    env = child_environment(parent, "worker", {"worker.memory_budget_bytes": None}, environ={})
    assert "SIE_WORKER_MEMORY_BUDGET_BYTES" not in env
    assert load_role_settings(["--role", "worker"], env).worker.memory_budget_bytes is None


def test_settings_the_child_role_does_not_read_are_left_out_and_refused_as_overrides() -> None:
    parent = load_role_settings(["--role", "all", "--port", "9000"], {})
    env = child_environment(parent, "worker", environ={})
    assert "SIE_PORT" not in env and "SIE_GATEWAY_PORT" not in env
    load_role_settings(["--role", "worker"], env)  # nothing a worker refuses
    with pytest.raises(SettingsError):
        child_environment(parent, "worker", {"gateway.port": 1}, environ={})
    with pytest.raises(SettingsError):
        child_environment(parent, "worker", {"worker.no_such": 1}, environ={})
