"""The units a request was metered in (`X-SIE-Units-*`, what the public SDK reads into a result's `request.usage`):
the workers' per-item counts summed over the request's items, each nonzero sum a header, the input tokens whenever
any worker metered the request, and nothing when none did (a worker that predates metering)."""

from __future__ import annotations

from sie.gateway.http.headers import response_headers
from sie.gateway.metadata import collect_metadata
from sie.wire.http import UNIT_HEADERS
from sie.wire.queue import UnitCounts, WorkResult


def result(index: int, units: UnitCounts | None) -> WorkResult:
    return WorkResult(work_item_id=f"r.{index}", request_id="r", item_index=index, success=True,
                      result_msgpack=b"\x80", units=units)  # fmt: skip


def test_the_items_units_are_summed_and_each_nonzero_sum_is_a_header() -> None:
    results = [result(0, UnitCounts(input_tokens=7, images=1)), result(1, None), result(2, UnitCounts(input_tokens=5))]
    meta = collect_metadata("r", results, 0.1, 0.2)
    assert meta.units == UnitCounts(input_tokens=12, images=1)
    headers = response_headers(meta, 1.0)
    assert {name: value for name, value in headers.items() if name.startswith("x-sie-units-")} == {
        "x-sie-units-input-tokens": "12",
        "x-sie-units-images": "1",
    }


def test_input_tokens_are_sent_even_when_zero_and_nothing_when_no_worker_metered() -> None:
    metered = response_headers(collect_metadata("r", [result(0, UnitCounts())], 0.1, 0.2), 1.0)
    assert metered["x-sie-units-input-tokens"] == "0" and "x-sie-units-images" not in metered
    unmetered = response_headers(collect_metadata("r", [result(0, None)], 0.1, 0.2), 1.0)
    assert not set(UNIT_HEADERS.values()) & set(unmetered)


def test_every_unit_field_has_its_header() -> None:
    every = UnitCounts(input_tokens=1, pages=2, images=3, audio_ms=4, pairs=5, content_input_tokens=6, output_tokens=7)
    headers = response_headers(collect_metadata("r", [result(0, every)], 0.1, 0.2), 1.0)
    assert {header: headers[header] for header in UNIT_HEADERS.values()} == {
        "x-sie-units-input-tokens": "1", "x-sie-units-pages": "2", "x-sie-units-images": "3",
        "x-sie-units-audio-ms": "4", "x-sie-units-pairs": "5", "x-sie-units-content-input-tokens": "6",
        "x-sie-units-output-tokens": "7",
    }  # fmt: skip
