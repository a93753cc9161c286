"""The one YAML loader (`sie.catalog.load_yaml`): plain JSON-shaped data, and hostile documents refused with a
ConfigError that names the source and the bound (issue 14 §2): alias bombs, deep or recursive nesting, values
JSON cannot carry. Ordinary anchors and merge keys still load."""

from __future__ import annotations

import pytest

from sie.catalog import ConfigError, dump_yaml, load_yaml
from sie.catalog.yamlio import MAX_ALIAS_EXPANSION, MAX_DEPTH


def billion_laughs(levels: int = 9, fan_out: int = 10) -> str:
    """The classic bomb: each level lists the previous one `fan_out` times (10**9 strings from about 1 KB)."""
    lines = ['lol0: &lol0 "lol"']
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*lol{level - 1}"] * fan_out)
        lines.append(f"lol{level}: &lol{level} [{aliases}]")
    return "\n".join(lines) + "\n"


def alias_chain(length: int) -> str:
    """Each anchor wraps the previous one: shallow text, deep once the aliases are followed."""
    return "a0: &a0 [x]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, length))


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_yaml(text, "hostile.yaml")
    assert caught.value.source == "hostile.yaml"
    return caught.value.message


def test_a_billion_laughs_is_refused_before_it_expands() -> None:
    text = billion_laughs()
    assert len(text) < 1300
    message = refusal(text)
    assert message.startswith("Refused YAML: aliases repeat") and str(MAX_ALIAS_EXPANSION) in message


@pytest.mark.parametrize(
    "text",
    [
        "[" * 20_000 + "]" * 20_000,
        "{a: " * 20_000 + "1" + "}" * 20_000,
        "- " * 20_000 + "x\n",
    ],
    ids=["flow-sequences", "flow-mappings", "block-sequences"],
)
def test_nesting_20000_deep_is_refused_without_recursing(text: str) -> None:
    assert refusal(text) == f"Refused YAML: it nests deeper than {MAX_DEPTH} levels"


def nesting(value: object) -> int:
    return 1 + nesting(value[0]) if isinstance(value, list) else 0


def test_depth_is_counted_through_aliases() -> None:
    assert "aliases nest the document deeper than" in refusal(alias_chain(MAX_DEPTH + 5))
    length = MAX_DEPTH - 2  # the root mapping, `length` wrapping lists and the scalar: exactly MAX_DEPTH levels
    assert nesting(load_yaml(alias_chain(length))[f"a{length - 1}"]) == length


@pytest.mark.parametrize("text", ["a: &a [*a]\n", "a: &a {b: [1, *a]}\n"])
def test_recursive_aliases_are_refused(text: str) -> None:
    assert "recursive alias" in refusal(text)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("x: !!binary AAAA\n", "!!binary"),
        ("x: !!set {a, b}\n", "!!set"),
        ("x: !!omap [a: 1]\n", "!!omap"),
        ("x: !!pairs [a: 1]\n", "!!pairs"),
        ("1: one\n", "mapping keys must be strings"),
        ("? [a, b]\n: c\n", "mapping keys must be strings"),
        ("x: " + "9" * 5000 + "\n", "does not fit in 64 bits"),
        ("x: 0x10000000000000000\n", "does not fit in 64 bits"),
        ("x: !!int abc\n", "Invalid YAML value"),
        ("x: !!bool maybe\n", "Invalid YAML value"),
        ("x: !python/object:os.system ls\n", "Invalid YAML"),
        ("a: 1\na: 2\n", "duplicate key"),
    ],
)
def test_values_json_cannot_carry_are_refused(text: str, named: str) -> None:
    assert named in refusal(text)


def test_plain_data_loads_with_anchors_merge_keys_and_dates_as_text() -> None:
    text = (
        "base: &base {adapter_path: 'a.b:C', max_batch_tokens: 8192}\n"
        "profiles:\n  default: *base\n  fast: {<<: *base, max_batch_tokens: 2048}\n"
        "released: 2024-01-31\nbig: 18446744073709551615\nsmall: -9223372036854775808\n"
    )
    data = load_yaml(text)
    assert data["profiles"] == {
        "default": {"adapter_path": "a.b:C", "max_batch_tokens": 8192},
        "fast": {"adapter_path": "a.b:C", "max_batch_tokens": 2048},
    }
    assert data["released"] == "2024-01-31"
    assert (data["big"], data["small"]) == (2**64 - 1, -(2**63))
    assert load_yaml(dump_yaml(data)) == data


def test_aliases_within_the_bound_load() -> None:
    repeated = "x" * 1000
    fan_out = MAX_ALIAS_EXPANSION // 1001 - 1
    text = f"s: &s {repeated}\nall: [{', '.join(['*s'] * fan_out)}]\n"
    assert len(load_yaml(text)["all"]) == fan_out
    over = f"s: &s {repeated}\nall: [{', '.join(['*s'] * (fan_out + 2))}]\n"
    assert "aliases repeat" in refusal(over)
