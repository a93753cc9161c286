"""freeze_startup_heap: what is alive when serving starts leaves the collector's generations; garbage made
afterwards is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sie.roles.common import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector can free it


@pytest.fixture()
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def tracked(obj: object) -> bool:
    return any(candidate is obj for candidate in gc.get_objects())


def test_startup_objects_are_frozen_and_later_cycles_are_still_collected(unfrozen: None) -> None:
    startup = Node()
    assert tracked(startup)
    freeze_startup_heap()
    assert gc.get_freeze_count() > 0
    assert not tracked(startup)  # in the permanent generation: no collection scans it again

    later = Node()
    alive = weakref.ref(later)
    del later
    gc.collect()
    assert alive() is None
