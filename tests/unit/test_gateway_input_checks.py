"""The gateway's input checks before anything is queued: images per item, compressed bytes and header pixels per
image (SIE_GATEWAY_MAX_IMAGES_PER_ITEM, _MAX_IMAGE_BYTES, _MAX_IMAGE_PIXELS), a format it does not read, a file cut
short, each a 400 naming the item and the image; images refused for a model whose YAML reads none; and a relation
extractor's entities."""

from __future__ import annotations

import io

import attrs
import pytest
from PIL import Image

from sie.catalog import parse_model_config
from sie.gateway.errors import InvalidRequestError
from sie.gateway.limits import RequestLimits
from sie.gateway.router import Route, check_inputs
from sie.transport.base import Lane
from sie.wire.http import ImageInput, Item


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def item(*images: bytes, text: str | None = None) -> Item:
    return Item(text=text, images=[ImageInput(data=data, format="png") for data in images])


LIMITS = RequestLimits(max_images_per_item=2, max_image_bytes=4096, max_image_pixels=100 * 100)


def test_images_within_the_limits_pass() -> None:
    LIMITS.check_images([item(png(100, 100), png(10, 50)), Item(text="no images")], item(png(5, 5)))


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([Item(text="a"), item(png(8, 8), png(8, 8), png(8, 8))], "Item 1 has 3 images; at most 2"),
        ([item(png(8, 8), png(101, 100))], "Image 1 of item 0:"),
        ([item(png(8, 8) + b"\0" * 5000)], "Image 0 of item 0:"),
        ([item(b"GIF89a\x01\x00")], "Image 0 of item 0:"),
        ([item(png(60, 60)[:60])], "Image 0 of item 0:"),
        ([item(b"%PDF-1.4 not an image")], "Image 0 of item 0:"),
    ],
)
def test_an_image_over_a_limit_or_unreadable_is_refused_naming_it(items: list[Item], message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        LIMITS.check_images(items)


def test_the_query_is_named_too() -> None:
    with pytest.raises(InvalidRequestError, match="Image 0 of the query"):
        LIMITS.check_images([Item(text="a")], item(png(200, 200)))


def route_of(inputs: dict[str, bool]) -> Route:
    config = parse_model_config({
        "sie_id": "acme/m", "hf_id": "acme/m", "inputs": inputs,
        "tasks": {"encode": {"dense": {"dim": 4}}, "extract": {}},
        "profiles": {"default": {"adapter_path": "sie.adapters.dense:D", "max_batch_tokens": 64}},
    })  # fmt: skip
    lane = Lane("default", "default", "default")
    return Route("acme/m", "acme/m", "default", "default", lane, "subject", config)


def test_images_reach_only_a_model_that_reads_them() -> None:
    check_inputs(route_of({"text": True, "image": True}), [item(png(4, 4))])
    check_inputs(route_of({"text": True}), [Item(text="only text")])
    with pytest.raises(InvalidRequestError, match="Item 1 carries images, but model 'acme/m' reads no images"):
        check_inputs(route_of({"text": True}), [Item(text="a"), item(png(4, 4), text="b")])


def test_a_relation_extractors_entities_are_checked_before_queueing() -> None:
    """GLiREL reads the entities each item names: none, offsets outside the text or over spaces are a 400 naming
    the item, before anything is queued (the worker refuses the same per item)."""
    from sie.catalog.adapters import GLIREL
    from sie.gateway.router import check_extract
    from sie.wire.http import ExtractParams

    route = attrs.evolve(route_of({"text": True}), adapter_kind=GLIREL)
    params = ExtractParams(labels=["founded by"])
    good = Item(text="Apple was founded by Steve Jobs.", metadata={"entities": [{"start": 0, "end": 5}]})
    check_extract(route, params, 100, [good])
    for item, message in [
        (Item(text="no entities"), "Item 1: Relations are read between the entities each item names"),
        (Item(text="short", metadata={"entities": [{"start": 0, "end": 50}]}), "Item 1: metadata.entities\\[0\\]"),
        (Item(text="a  b", metadata={"entities": [{"start": 1, "end": 3}]}), "covers no word"),
    ]:
        with pytest.raises(InvalidRequestError, match=message):
            check_extract(route, params, 100, [good, item])


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "tone": {"type": "string", "enum": ["good", "bad"]},
    },
}
THREE_FIELDS = {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(3)}}


def one_field(definition: dict, name: str = "f") -> dict:
    return {"type": "object", "properties": {name: definition}}


@pytest.mark.parametrize(
    ("kind", "changes", "limit", "message"),
    [
        ("gliner2", {"output_schema": {"type": "array"}}, 100, "must be a JSON Schema of type 'object'"),
        ("gliner2", {"output_schema": {"type": "object", "properties": {}}}, 100, "non-empty 'properties'"),
        ("gliner2", {"output_schema": {**SCHEMA, "$defs": {}}}, 100, "keywords structured extraction does not read"),
        ("gliner2", {"output_schema": {**SCHEMA, "required": ["nope"]}}, 100, "'required' must list distinct"),
        ("gliner2", {"output_schema": one_field({"type": "integer"})}, 100, "a string enum or an array of strings"),
        ("gliner2", {"output_schema": one_field({"type": "string"}, "a::b")}, 100, "property name"),
        ("gliner2", {"output_schema": one_field({"type": "string", "enum": ["x|y"]})}, 100, "each enum value"),
        ("gliner2", {"output_schema": SCHEMA, "labels": ["p"]}, 100, "'labels' does not apply with 'output_schema'"),
        ("gliner2", {"output_schema": SCHEMA, "options": {"classification_task": "t"}}, 100, "classification_task"),
        ("gliner2", {"output_schema": THREE_FIELDS}, 2, "at most 2 are accepted"),
        ("gliner", {"output_schema": SCHEMA}, 100, "read by GLiNER2 models only"),
    ],
)
def test_an_output_schema_is_checked_before_queueing(kind: str, changes: dict, limit: int, message: str) -> None:
    """Structured extraction's schema (`sie.catalog.output_schema`) is a 400 naming what cannot be read, before
    anything is queued; its fields and enum values count against the label limit."""
    from sie.gateway.router import check_extract
    from sie.wire.http import ExtractParams

    route = attrs.evolve(route_of({"text": True}), adapter_kind=kind)
    check_extract(attrs.evolve(route, adapter_kind="gliner2"), ExtractParams(output_schema=SCHEMA), 100)
    with pytest.raises(InvalidRequestError, match=message):
        check_extract(route, ExtractParams(**changes), limit)
