"""`sie run --role all`, the laptop role, listens on 127.0.0.1 unless told otherwise (issue 14 §3): reachable on
127.0.0.1, refused on 127.0.0.2, which reaches any server bound to every interface. (The container roles' default,
every interface, is in tests/unit/test_settings.py: binding it here would open a port beyond loopback.)"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from launcher import RoleProcess, free_port

OTHER_LOOPBACK = "127.0.0.2"


def other_loopback_usable() -> bool:
    """Whether this host routes 127.0.0.2 to itself (Linux does; macOS only with an alias)."""
    with socket.socket() as probe:
        try:
            probe.bind((OTHER_LOOPBACK, 0))
        except OSError:
            return False
    return True


@pytest.fixture()
def all_role(tmp_path: Path) -> Iterator[int]:
    """The port of a `sie run --role all` given no `--host` (null backend: no model to load)."""
    port = free_port()
    args = ["--port", str(port), "--backend", "null", "--devices", "cpu"]
    server = RoleProcess("all", args, {}, tmp_path / "all.log")
    try:
        server.wait_http_ready(f"http://127.0.0.1:{port}/readyz")
        yield port
    finally:
        code = server.stop()
    assert code == 0, server.log()


@pytest.mark.skipif(not other_loopback_usable(), reason="127.0.0.2 is not routed to this host")
def test_the_all_role_listens_on_127_0_0_1_only(all_role: int) -> None:
    assert httpx.get(f"http://127.0.0.1:{all_role}/healthz", timeout=10).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{OTHER_LOOPBACK}:{all_role}/healthz", timeout=10)


@pytest.mark.skipif(not other_loopback_usable(), reason="127.0.0.2 is not routed to this host")
def test_given_a_host_the_all_role_listens_there(tmp_path: Path) -> None:
    port = free_port()
    args = ["--host", OTHER_LOOPBACK, "--port", str(port), "--backend", "null", "--devices", "cpu"]
    server = RoleProcess("all", args, {}, tmp_path / "all.log")
    try:
        server.wait_http_ready(f"http://{OTHER_LOOPBACK}:{port}/readyz")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
    finally:
        code = server.stop()
    assert code == 0, server.log()
