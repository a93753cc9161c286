"""Loaded into each `sie run` process that scripts/bench/timeline.py starts (this directory leads its PYTHONPATH):
wraps the functions named in BENCH_TRACE (`module:Qualified.name`, space-separated) as their modules are imported,
records each call's entry and exit time (time.perf_counter: CLOCK_MONOTONIC, comparable between processes) and
writes them as JSON to BENCH_TRACE_OUT (`%p` becomes the process id) when the process exits. A benchmark tool only.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import sys
import time
from typing import Any

_CALLS: list[tuple[str, float, float]] = []
_WANTED: dict[str, list[str]] = {}
for _target in os.environ.get("BENCH_TRACE", "").split():
    _module, _, _name = _target.partition(":")
    _WANTED.setdefault(_module, []).append(_name)


def _timed(name: str, function: Any) -> Any:
    if inspect.iscoroutinefunction(function):
        signature = inspect.signature(function)

        @functools.wraps(function)
        async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await function(*args, **kwargs)
            finally:
                _CALLS.append((name, start, time.perf_counter()))

        @functools.wraps(function)
        def checked_call(*args: Any, **kwargs: Any) -> Any:
            # A coroutine function refuses wrong arguments when called, not when awaited; servers rely on it
            # (uvicorn calls the app with none to tell an app from an app factory).
            signature.bind(*args, **kwargs)
            return timed_coroutine(*args, **kwargs)

        checked_call._is_coroutine = asyncio.coroutines._is_coroutine  # type: ignore[attr-defined]
        return checked_call

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _CALLS.append((name, start, time.perf_counter()))

    return timed


def _wrap_all(module: Any, names: list[str]) -> None:
    for name in names:
        owner_path, _, attribute = name.rpartition(".")
        owner = module
        try:
            for part in owner_path.split(".") if owner_path else ():
                owner = getattr(owner, part)
            setattr(owner, attribute, _timed(name, getattr(owner, attribute)))
        except AttributeError:
            print(f"trace_hook: {module.__name__} has no {name}", file=sys.stderr)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, names: list[str]) -> None:
        self._inner = inner
        self._names = names

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _wrap_all(module, self._names)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        names = _WANTED.get(fullname)
        if names is None:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, names)
                return spec
        return None


def _write() -> None:
    with open(os.environ["BENCH_TRACE_OUT"].replace("%p", str(os.getpid())), "w") as file:
        json.dump(_CALLS, file)


if _WANTED and os.environ.get("BENCH_TRACE_OUT"):
    sys.meta_path.insert(0, _Finder())
    atexit.register(_write)
