"""How pytest-xdist splits the suite over its workers (`make test` runs three): by test module, so a module's fixtures
start once, except that the modules sharing a session server (the all-in-one server, the shared distributed
cluster of tests/e2e/conftest.py) go to one worker together, so that server starts once rather than on every worker.
The list is checked at collection: a module that uses a shared server and is not listed fails the run.

Work units are handed out in collection order, and the modules holding `slow` tests are collected first: a long
module started last would otherwise run alone at the end while the other workers idle (xdist's own order, by number
of tests, put the one-test memory and install modules last).
"""

from __future__ import annotations

from typing import Final

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

SHARED_SERVER_FIXTURES: Final = frozenset({"all_server", "shared_cluster"})
SHARED_SERVER_MODULES: Final = frozenset(
    {
        "tests/e2e/test_all_role.py",
        "tests/e2e/test_dialects.py",
        "tests/e2e/test_distributed.py",
        "tests/e2e/test_generation.py",
        "tests/e2e/test_hostile_neighbours.py",
        "tests/e2e/test_integrations.py",
        "tests/e2e/test_metrics.py",
        "tests/e2e/test_status_page.py",
    }
)
SHARED_SERVERS_GROUP: Final = "shared-servers"


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class ModuleGroups(LoadFileScheduling):
    """Work units of whole test modules; the modules sharing a session server are one unit."""

    def _split_scope(self, nodeid: str) -> str:
        module = _module(nodeid)
        return SHARED_SERVERS_GROUP if module in SHARED_SERVER_MODULES else module


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> ModuleGroups:
    config.option.loadscopereorder = False  # collection order: the slow modules first (below)
    return ModuleGroups(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow_modules = {_module(item.nodeid) for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: _module(item.nodeid) not in slow_modules)  # stable: module order kept otherwise
    using = {_module(item.nodeid) for item in items if SHARED_SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))}
    unlisted = sorted(using - SHARED_SERVER_MODULES)
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(unlisted)} use a shared session server: list them in SHARED_SERVER_MODULES of "
            "tests/support/scheduling.py, so pytest-xdist runs them beside the other modules that share it"
        )
