"""The gateway side of the bundle_config_hash (seed 000 §2): the expected hash is captured with the route
from one catalogue snapshot and stamped on every WorkItem, and `X-SIE-Model-Revision` is emitted only when
every item succeeded executing exactly that non-empty hash."""

from __future__ import annotations

import pytest

from sie.catalog import Catalog, load_catalog
from sie.gateway.http.headers import MODEL_REVISION, response_headers
from sie.gateway.metadata import ResponseMetadata, model_revision
from sie.gateway.pools import PoolTarget
from sie.gateway.router import LaneHints, Router, expected_bundle_config_hash
from sie.gateway.workitems import Ticket, encode_work
from sie.settings import LaneSettings
from sie.wire.http import EncodeRequest, Item
from sie.wire.queue import WorkResult

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
HASH = "a" * 64


@pytest.fixture(scope="module")
def catalog(baseline_catalog_dir) -> Catalog:
    return load_catalog(baseline_catalog_dir / "bundles", baseline_catalog_dir / "models")


def result(index: int, executed: str | None = HASH, success: bool = True) -> WorkResult:
    return WorkResult(work_item_id=f"r.{index}", request_id="r", item_index=index, success=success,
                      result_msgpack=b"\x80" if success else None, executed_bundle_config_hash=executed)  # fmt: skip


def test_route_carries_the_pool_scoped_hash_of_its_snapshot(catalog: Catalog) -> None:
    route = Router(lambda: catalog, LaneSettings()).route(MINILM, None, LaneHints())
    assert route.bundle_config_hash == catalog.bundle_config_hash("default", "default")
    assert len(route.bundle_config_hash) == 64


def test_the_hash_follows_the_catalogue_snapshot(catalog: Catalog) -> None:
    current = [catalog]
    router = Router(lambda: current[0], LaneSettings())
    first = router.route(MINILM, None, LaneHints()).bundle_config_hash
    current[0] = Catalog(catalog.bundles.values(), [catalog.get(MINILM).model])
    second = router.route(MINILM, None, LaneHints()).bundle_config_hash
    assert first != second == current[0].bundle_config_hash("default", "default")


def test_a_scope_without_models_or_an_unknown_bundle_has_no_hash(catalog: Catalog) -> None:
    assert expected_bundle_config_hash(catalog, "no-such-bundle", "default") == ""
    assert expected_bundle_config_hash(catalog, "default", "gpu-pool-without-models") == ""
    route = Router(lambda: catalog, LaneSettings()).route(
        MINILM, None, LaneHints(pool="elsewhere"), PoolTarget("elsewhere", "elsewhere")
    )
    assert route.bundle_config_hash == ""


def test_every_work_item_is_stamped_and_legacy_is_absent(catalog: Catalog) -> None:
    router = Router(lambda: catalog, LaneSettings())
    ticket = Ticket("r", "_INBOX.gw.r", "gw", 0.0, 1.0)
    request = EncodeRequest(items=[Item(text="a"), Item(text="b")])
    route = router.route(MINILM, None, LaneHints())
    assert {item.bundle_config_hash for item in encode_work(route, ticket, request, ["dense"])} == {
        route.bundle_config_hash
    }
    legacy = router.route(MINILM, None, LaneHints(pool="elsewhere"), PoolTarget("elsewhere", "elsewhere"))
    assert {item.bundle_config_hash for item in encode_work(legacy, ticket, request, ["dense"])} == {None}


def test_header_only_when_every_item_executed_the_captured_hash() -> None:
    assert model_revision(HASH, [result(0), result(1)]) == HASH
    assert model_revision(HASH, [result(0), result(1, executed="b" * 64)]) is None
    assert model_revision(HASH, [result(0), result(1, executed=None)]) is None
    assert model_revision(HASH, [result(0), result(1, success=False)]) is None
    assert model_revision("", [result(0, executed="")]) is None
    assert model_revision(HASH, []) is None


def test_response_headers_emit_the_revision_only_when_set() -> None:
    assert MODEL_REVISION not in response_headers(ResponseMetadata("r"), 1.0)
    assert response_headers(ResponseMetadata("r", model_revision=HASH), 1.0)[MODEL_REVISION] == HASH
