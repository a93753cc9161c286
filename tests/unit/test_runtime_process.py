"""sie.runtime: which event loop a role runs on (SIE_EVENT_LOOP), and freezing the start-up heap: what is alive
when serving starts leaves the collector's generations; garbage made afterwards is still collected."""

from __future__ import annotations

import asyncio
import gc
import sys
import weakref
from collections.abc import Iterator

import pytest
import uvloop

from sie.runtime import event_loop_factory, freeze_startup_heap, run_event_loop
from sie.runtime.process import YOUNG_GC_THRESHOLD
from sie.settings import SettingsError, load_settings


def test_auto_and_uvloop_choose_uvloop_when_it_is_installed() -> None:
    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop_factory("asyncio") is asyncio.new_event_loop


def test_without_uvloop_auto_falls_back_and_uvloop_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now raises ImportError
    assert event_loop_factory("auto") is asyncio.new_event_loop
    with pytest.raises(SystemExit, match="SIE_EVENT_LOOP=uvloop, but uvloop is not installed"):
        event_loop_factory("uvloop")


@pytest.mark.parametrize(("choice", "loop_type"), [("asyncio", asyncio.BaseEventLoop), ("uvloop", uvloop.Loop)])
def test_a_role_runs_on_the_chosen_loop(choice: str, loop_type: type) -> None:
    seen: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        seen.append(asyncio.get_running_loop())

    run_event_loop(main(), load_settings({"SIE_EVENT_LOOP": choice}).process.event_loop)
    assert isinstance(seen[0], loop_type)


def test_a_bad_choice_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="SIE_EVENT_LOOP"):
        load_settings({"SIE_EVENT_LOOP": "trio"})


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector can free it


@pytest.fixture()
def unfrozen() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def tracked(obj: object) -> bool:
    return any(candidate is obj for candidate in gc.get_objects())


def test_startup_objects_are_frozen_and_later_cycles_are_still_collected(unfrozen: None) -> None:
    startup = Node()
    assert tracked(startup)
    freeze_startup_heap()
    assert gc.get_freeze_count() > 0
    assert not tracked(startup)  # in the permanent generation: no collection scans it again
    assert gc.get_threshold()[0] == YOUNG_GC_THRESHOLD

    later = Node()
    alive = weakref.ref(later)
    del later
    gc.collect()
    assert alive() is None
