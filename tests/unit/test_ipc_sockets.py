"""The socket layout of a pod's worker children: `{base}.{i}` found in index order, `base` alone for one
worker, and leftovers that nobody serves removed while live sockets stay."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from sie.ipc.sockets import child_socket_path, child_socket_paths, remove_stale_sockets
from sie.sidecar.pod.children import socket_children


@pytest.fixture()
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("s", numbered=True)) / "w.sock"  # short: AF_UNIX paths are limited


def bound(path: Path, *, listening: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listening:
        sock.listen()
    return sock


@pytest.fixture()
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_children_are_found_in_index_order_and_other_files_are_ignored(base: Path, sockets: list) -> None:
    for index in (10, 2, 0):
        sockets.append(bound(child_socket_path(base, index), listening=True))
    (base.parent / "w.sock.tmp").write_text("")
    (base.parent / "w.socket.1").write_text("")
    assert list(child_socket_paths(base)) == [0, 2, 10]
    assert socket_children(base) == {
        "worker-0": child_socket_path(base, 0),
        "worker-2": child_socket_path(base, 2),
        "worker-10": child_socket_path(base, 10),
    }


def test_one_worker_is_its_own_socket_and_children_win_over_it(base: Path, sockets: list) -> None:
    assert socket_children(base) == {}
    sockets.append(bound(base, listening=True))
    assert socket_children(base) == {"worker-0": base}
    sockets.append(bound(child_socket_path(base, 0), listening=True))
    assert socket_children(base) == {"worker-0": child_socket_path(base, 0)}


def test_only_sockets_nobody_serves_are_removed(base: Path, sockets: list) -> None:
    live, stale = child_socket_path(base, 0), child_socket_path(base, 1)
    sockets.append(bound(live, listening=True))
    bound(stale, listening=False).close()  # a worker killed before its clean exit leaves the file behind
    plain = base.parent / "notes.txt"
    plain.write_text("not a socket")
    assert remove_stale_sockets([live, stale, plain, base]) == [stale]
    assert live.exists() and not stale.exists() and plain.exists()
