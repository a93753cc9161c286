"""Parsers that turn one environment or flag string into a typed setting value.

A parser's ValueError text completes the sentence "SIE_X='value' ...": what is wrong, then what is
allowed. Parsers never read the environment and never name the variable; the loader does both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs


def render_value(value: Any) -> str:
    """Show a value the way an operator would type it back into the variable."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, tuple):
        return ",".join(render_value(item) for item in value) if value else "empty"
    return str(value)


@attrs.frozen
class Parser:
    """How one setting is read from text (`convert`), named in the docs (`kind`) and shown (`render`)."""

    kind: str
    convert: Callable[[str], Any]
    render: Callable[[Any], str] = render_value


@attrs.frozen
class _Bounds:
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return f" between {render_value(self.low)} and {render_value(self.high)}"
        if self.low is not None:
            return f" {'>' if self.low_open else '>='} {render_value(self.low)}"
        if self.high is not None:
            return f" <= {render_value(self.high)}"
        return ""

    def contains(self, value: float) -> bool:
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high


def text() -> Parser:
    """Any non-blank string, as given (blank values never reach a parser: they mean unset)."""
    return Parser("string", str)


def boolean() -> Parser:
    """true/false, 1/0, yes/no, any case."""
    table = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

    def convert(raw: str) -> bool:
        try:
            return table[raw.lower()]
        except KeyError:
            raise ValueError("is not a boolean; expected true/false, 1/0 or yes/no") from None

    return Parser("boolean", convert)


def integer(minimum: int | None = None, maximum: int | None = None) -> Parser:
    """A whole number, optionally bounded (inclusive)."""
    bounds = _Bounds(minimum, maximum)
    expected = f"expected a whole number{bounds.describe()}"

    def convert(raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            raise ValueError(f"is not an integer; {expected}") from None
        if not bounds.contains(value):
            raise ValueError(f"is out of range; {expected}")
        return value

    return Parser(f"integer{bounds.describe()}", convert)


def _float_parser(kind: str, bounds: _Bounds, scale: float = 1.0) -> Parser:
    expected = f"expected {'a number' if kind == 'number' else kind}{bounds.describe()}"

    def convert(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"is not a number; {expected}") from None
        if not math.isfinite(value):
            raise ValueError(f"is not a finite number; {expected}")
        if not bounds.contains(value):
            raise ValueError(f"is out of range; {expected}")
        return value / scale

    def render(value: Any) -> str:
        return render_value(None if value is None else round(value * scale, 9))

    return Parser(f"{kind}{bounds.describe()}", convert, render)


def number(*, positive: bool = False, maximum: float | None = None) -> Parser:
    """A finite float >= 0 (or > 0 when `positive`)."""
    return _float_parser("number", _Bounds(0.0, maximum, low_open=positive))


def seconds(*, positive: bool = False, maximum: float | None = None) -> Parser:
    """A duration in float seconds, >= 0 (or > 0 when `positive`)."""
    return _float_parser("seconds", _Bounds(0.0, maximum, low_open=positive))


def milliseconds(*, positive: bool = False) -> Parser:
    """A duration written in milliseconds (a public SIE variable) and held as float seconds."""
    return _float_parser("milliseconds", _Bounds(0.0, None, low_open=positive), scale=1000.0)


def choice(*values: str, aliases: Mapping[str, str] | None = None) -> Parser:
    """One of `values`, any case; `aliases` map other accepted spellings onto a value."""
    accepted = {value: value for value in values} | dict(aliases or {})
    expected = f"expected one of: {', '.join(accepted)}"

    def convert(raw: str) -> str:
        try:
            return accepted[raw.lower()]
        except KeyError:
            raise ValueError(f"is not allowed; {expected}") from None

    return Parser(" | ".join(values), convert)


_TOKEN = re.compile(r"[a-z0-9_-]{1,63}")


def name_token() -> Parser:
    """A pool, machine-profile or bundle name: trimmed, lowercased, 1-63 of [A-Za-z0-9_-] (seed 000 §16.3)."""

    def convert(raw: str) -> str:
        value = raw.lower()
        if not _TOKEN.fullmatch(value):
            raise ValueError("is not a valid name; expected 1-63 characters from A-Z a-z 0-9 _ -")
        return value

    return Parser("name", convert)


def http_url() -> Parser:
    """An absolute http(s) URL; a trailing slash is dropped so paths can be appended."""

    def convert(raw: str) -> str:
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("is not an http(s) URL; expected e.g. http://host:8081")
        return raw.rstrip("/")

    return Parser("URL", convert)


def path() -> Parser:
    """A local filesystem path; `~` is expanded."""
    return Parser("path", lambda raw: Path(raw).expanduser())


def string_list(item: Parser | None = None) -> Parser:
    """Comma-separated values, each trimmed; empty entries are dropped; each checked by `item`."""
    each = item or text()

    def convert(raw: str) -> tuple[Any, ...]:
        values = []
        for part in (piece.strip() for piece in raw.split(",")):
            if not part:
                continue
            try:
                values.append(each.convert(part))
            except ValueError as exc:
                raise ValueError(f"has an item {part!r} that {exc}") from None
        return tuple(values)

    return Parser(f"list of {each.kind}s", convert)


def key_values(keys: tuple[str, ...]) -> Parser:
    """Comma-separated `key=value` entries, each key one of `keys` and named once; the value is kept as written
    (trimmed). The result is a tuple of (key, value) pairs in the order given."""

    def convert(raw: str) -> tuple[tuple[str, str], ...]:
        pairs: dict[str, str] = {}
        for part in (piece.strip() for piece in raw.split(",")):
            if not part:
                continue
            key, equals, value = part.partition("=")
            key, value = key.strip().lower(), value.strip()
            if not equals or not value:
                raise ValueError(f"has an entry {part!r} that is not key=value; expected e.g. {keys[0]}=org/model")
            if key not in keys:
                raise ValueError(f"has an entry {part!r} whose key is not one of: {', '.join(keys)}")
            if key in pairs:
                raise ValueError(f"names {key!r} twice")
            pairs[key] = value
        return tuple(pairs.items())

    def render(value: Any) -> str:
        return ",".join(f"{key}={item}" for key, item in value) if value else "empty"

    return Parser(f"list of key=value ({' | '.join(keys)})", convert, render)


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"([0-9][0-9_]*)\s*([a-z]*)")


def _render_size(value: Any) -> str:
    if value is None:
        return "unset"
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        factor = _UNITS[unit.lower()]
        if value >= factor and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


def byte_size() -> Parser:
    """A byte count, optionally with a unit: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (of 1024)."""

    def convert(raw: str) -> int:
        match = _SIZE.fullmatch(raw.lower())
        if not match or match.group(2) not in _UNITS or int(match.group(1)) < 1:
            raise ValueError("is not a size; expected whole bytes >= 1, optionally with a unit such as 4GiB")
        return int(match.group(1)) * _UNITS[match.group(2)]

    return Parser("bytes", convert, _render_size)


_DEVICES = re.compile(r"auto|cpu(:[1-9][0-9]*)?|cuda(:[0-9]+(,[0-9]+)*)?")


def device_spec() -> Parser:
    """Which devices a worker runs on: `auto`, `cpu`, `cpu:N` (N CPU children), `cuda` (every visible GPU) or
    `cuda:I[,J…]` (those GPUs, each once). Held as the normalised text; `sie.worker.devices` resolves it."""
    expected = "expected auto, cpu, cpu:N (N >= 1), cuda or cuda:I[,J...] such as cuda:0,2"

    def convert(raw: str) -> str:
        value = re.sub(r"\s+", "", raw.lower())
        if not _DEVICES.fullmatch(value):
            raise ValueError(f"is not a device list; {expected}")
        kind, _, indices = value.partition(":")
        if kind == "cuda" and indices:
            ordinals = [int(index) for index in indices.split(",")]
            if len(set(ordinals)) != len(ordinals):
                raise ValueError(f"names a GPU twice; {expected}")
            return "cuda:" + ",".join(str(ordinal) for ordinal in ordinals)
        return value

    return Parser("devices", convert)
