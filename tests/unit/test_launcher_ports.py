"""The launcher's listen ports: below the kernel's ephemeral range (where outgoing connections take their local ports),
one slice per pytest-xdist worker, handed out in turn and free when handed out."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import launcher
from launcher import HOST, free_port


def ephemeral_range() -> range:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return range(low, high + 1)


def test_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert not set(ports) & set(ephemeral_range())
    with socket.socket() as sock:
        sock.bind((HOST, ports[-1]))  # still free


def test_each_xdist_worker_has_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = []
    for worker in ("gw0", "gw1", "gw2"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ports = launcher._ListenPorts()
        slices.append(ports.slice)
        assert all(ports.take() in ports.slice for _ in range(20))
    assert not set(slices[0]) & set(slices[1]) and not set(slices[1]) & set(slices[2])


def test_a_busy_port_is_skipped() -> None:
    ports = launcher._ListenPorts()
    with socket.socket() as busy:
        busy.bind((HOST, ports.next_in_turn))
        busy.listen()
        taken = ports.take()
        assert taken != busy.getsockname()[1] and taken in ports.slice
