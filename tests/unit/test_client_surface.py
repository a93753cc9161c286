"""The public surface of sie.client: the two clients mirror each other and `__all__` lists the public names."""

from __future__ import annotations

import inspect

import sie.client
from sie.client import SIEAsyncClient, SIEClient

# Names that differ only because one side awaits (httpx: close/aclose, __enter__/__aenter__).
PAIRS = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}


def public_members(cls: type) -> set[str]:
    """Public names, plus the context-manager dunders, which are public API too."""
    dunders = {name for name in (*PAIRS, *PAIRS.values()) if name.startswith("__") and hasattr(cls, name)}
    return {name for name in dir(cls) if not name.startswith("_")} | dunders


def test_the_two_clients_expose_the_same_public_methods():
    sync_names = {PAIRS.get(name, name) for name in public_members(SIEClient)}
    assert sync_names == public_members(SIEAsyncClient)


def test_async_methods_are_coroutines_and_sync_ones_are_not():
    for name in public_members(SIEClient):
        sync_member = inspect.getattr_static(SIEClient, name)
        async_member = inspect.getattr_static(SIEAsyncClient, PAIRS.get(name, name))
        if isinstance(sync_member, property):
            assert isinstance(async_member, property), name
            continue
        assert not inspect.iscoroutinefunction(sync_member), name
        if inspect.isgeneratorfunction(sync_member):  # a stream: an iterator on one side, an async one on the other
            assert inspect.isasyncgenfunction(async_member), name
            continue
        assert inspect.iscoroutinefunction(async_member), name


def test_mirrored_methods_take_the_same_parameters():
    for name in ("encode", "score", "extract", "generate", "stream_generate", "list_models", "get_model"):
        sync_signature = inspect.signature(getattr(SIEClient, name))
        async_signature = inspect.signature(getattr(SIEAsyncClient, name))
        assert list(sync_signature.parameters) == list(async_signature.parameters), name
        for parameter in sync_signature.parameters.values():
            assert parameter.default == async_signature.parameters[parameter.name].default, (name, parameter.name)


def test_constructors_take_the_same_keywords():
    sync_parameters = inspect.signature(SIEClient.__init__).parameters
    async_parameters = inspect.signature(SIEAsyncClient.__init__).parameters
    assert list(sync_parameters) == list(async_parameters)


def test_all_lists_exactly_the_public_names():
    exported = set(sie.client.__all__)
    public = {
        name for name, value in vars(sie.client).items() if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert exported == public
    assert sorted(sie.client.__all__, key=str.lower) == sorted(exported, key=str.lower)
    for name in sie.client.__all__:
        assert getattr(sie.client, name).__module__.startswith("sie.client")


def test_public_methods_have_docstrings():
    for cls in (SIEClient, SIEAsyncClient):
        assert cls.__doc__
        for name in (name for name in public_members(cls) if not name.startswith("_")):
            assert inspect.getdoc(getattr(cls, name)), f"{cls.__name__}.{name}"
