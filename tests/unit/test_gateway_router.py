"""Gateway routing: spec → entry, profile variant, lane and subject, and the pre-publish checks (seed 000 §2, §16)."""

from __future__ import annotations

import pytest

from sie.catalog import (
    BundleConflictError,
    Catalog,
    ModelNotFoundError,
    load_catalog,
    parse_bundle,
    parse_model_config,
)
from sie.gateway.errors import InvalidRequestError, MachineProfileNotConfiguredError
from sie.gateway.pools import PoolTarget
from sie.gateway.router import (
    LaneHints,
    Router,
    check_extract,
    check_options,
    check_output_dtype,
    check_score,
    encode_outputs,
)
from sie.settings import LaneSettings
from sie.transport.base import Lane
from sie.wire.http import EncodeParams, ExtractParams
from sie.wire.queue import OPERATION_ENCODE, OPERATION_EXTRACT, OPERATION_SCORE

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
NO_HINTS = LaneHints()


@pytest.fixture(scope="module")
def catalog(baseline_catalog_dir) -> Catalog:
    return load_catalog(baseline_catalog_dir / "bundles", baseline_catalog_dir / "models")


@pytest.fixture()
def router(catalog: Catalog) -> Router:
    return Router(lambda: catalog, LaneSettings())


def test_default_route_matches_the_seed_walkthrough(router: Router) -> None:
    route = router.route(MINILM, None, NO_HINTS)
    assert (route.model, route.model_id, route.profile, route.bundle) == (MINILM, MINILM, "default", "default")
    assert route.lane == Lane("default", "default", "default")
    assert route.subject == "sie.work.default.default.default.sentence-transformers__all-MiniLM-L6-v2"


def test_lookup_is_case_insensitive_and_names_the_canonical_id(router: Router) -> None:
    assert router.route(MINILM.upper(), None, NO_HINTS).model == MINILM


def test_options_profile_selects_the_variant(router: Router) -> None:
    route = router.route(MINILM, "int8", NO_HINTS)
    assert (route.model, route.model_id, route.profile) == (MINILM, f"{MINILM}:int8", "int8")
    assert route.subject.endswith("sentence-transformers__all-MiniLM-L6-v2:int8")


def test_profile_default_on_a_variant_path_goes_back_to_the_base(router: Router) -> None:
    route = router.route(f"{MINILM}:int8", "default", NO_HINTS)
    assert (route.model_id, route.profile) == (MINILM, "default")


def test_unknown_profile_lists_the_available_ones(router: Router) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        router.route(MINILM, "nope", NO_HINTS)
    assert caught.value.message == "Profile 'nope' not found. Available: ['default', 'int8', 'multivector']"


def test_non_string_profile_is_refused(router: Router) -> None:
    for profile in (3, ["int8"], {"name": "int8"}):
        with pytest.raises(InvalidRequestError, match="options.profile"):
            router.route(MINILM, profile, NO_HINTS)


def test_unknown_model_and_bundle_conflict(router: Router) -> None:
    with pytest.raises(ModelNotFoundError, match="Model 'acme/missing' not found"):
        router.route("acme/missing", None, NO_HINTS)
    with pytest.raises(BundleConflictError) as caught:
        router.route(f"gpu-only:/{MINILM}", None, NO_HINTS)
    assert caught.value.compatible_bundles == ["default"]


def test_bundle_override_that_fits_is_accepted(router: Router) -> None:
    assert router.route(f"default:/{MINILM}", None, NO_HINTS).bundle == "default"


def test_machine_profile_header_may_carry_the_pool(router: Router) -> None:
    hints = LaneHints(machine_profile="Team-A/L4")
    assert (hints.requested_pool(), hints.requested_machine_profile()) == ("Team-A", "L4")
    route = router.route(MINILM, None, hints, PoolTarget("team-a", "team-a"))
    assert route.lane == Lane("team-a", "l4", "default")
    assert route.subject.startswith("sie.work.team-a.l4.default.")
    assert route.admission_pool == "team-a"


def test_explicit_pool_header_wins_over_the_machine_profile_prefix() -> None:
    hints = LaneHints(pool="pinned", machine_profile="other/l4")
    assert (hints.requested_pool(), hints.requested_machine_profile()) == ("pinned", "l4")
    assert LaneHints().requested_pool() is None


def test_a_logical_pool_publishes_on_its_queue_pool_and_stamps_itself_for_admission(router: Router) -> None:
    route = router.route(MINILM, None, LaneHints(pool="acme"), PoolTarget("acme", "default", ("l4",)))
    assert route.lane == Lane("default", "l4", "default")
    assert route.subject.startswith("sie.work.default.l4.default.")
    assert route.admission_pool == "acme"
    assert route.demand_lanes == (route.lane,)
    unnamed = router.route(MINILM, None, NO_HINTS)
    assert unnamed.admission_pool is None


def test_a_pool_of_several_profiles_wakes_each_when_the_request_names_none(router: Router) -> None:
    target = PoolTarget("acme", "default", ("a100", "l4"))
    route = router.route(MINILM, None, LaneHints(pool="acme"), target)
    assert route.lane == Lane("default", "a100", "default")
    assert route.demand_lanes == (Lane("default", "a100", "default"), Lane("default", "l4", "default"))
    named = router.route(MINILM, None, LaneHints(pool="acme", machine_profile="l4"), target)
    assert named.demand_lanes == (Lane("default", "l4", "default"),)


def test_lane_defaults_come_from_settings(catalog: Catalog) -> None:
    router = Router(lambda: catalog, LaneSettings(pool="cpu-pool", machine_profile="cpu"))
    assert router.route(MINILM, None, NO_HINTS).lane == Lane("cpu-pool", "cpu", "default")


def test_only_configured_machine_profiles_may_be_named(catalog: Catalog) -> None:
    router = Router(lambda: catalog, LaneSettings(), configured_machine_profiles=("l4", "a100-80gb"))
    assert router.route(MINILM, None, LaneHints(machine_profile="L4")).lane.machine_profile == "l4"
    assert router.route(MINILM, None, LaneHints(machine_profile="pool-b/a100-80gb")).lane.machine_profile == "a100-80gb"
    assert router.route(MINILM, None, LaneHints()).lane.machine_profile == "default"  # no header: no check
    with pytest.raises(MachineProfileNotConfiguredError) as caught:
        router.route(MINILM, None, LaneHints(machine_profile="h100"))
    assert caught.value.extra == {"gpu": "h100", "configured_gpu_types": ["l4", "a100-80gb"]}


def test_invalid_lane_header_is_a_400(router: Router) -> None:
    with pytest.raises(InvalidRequestError, match="Invalid machine profile 'bad.profile'"):
        router.route(MINILM, None, LaneHints(machine_profile="bad.profile"))


def test_routes_are_cached_per_catalog_snapshot(catalog: Catalog) -> None:
    current = {"catalog": catalog}
    router = Router(lambda: current["catalog"], LaneSettings())
    first = router.route(MINILM, None, NO_HINTS)
    assert router.route(MINILM, None, NO_HINTS) is first
    current["catalog"] = catalog.with_models([])
    assert router.route(MINILM, None, NO_HINTS) is not first


def test_unseeded_catalogue_falls_back_to_the_callers_bundle() -> None:
    router = Router(
        lambda: Catalog([parse_bundle({"name": "default", "priority": 1, "adapters": ["x"]})]), LaneSettings()
    )
    route = router.route("gpu:/org/anything", None, NO_HINTS)
    assert (route.model_id, route.bundle, route.config) == ("org/anything", "gpu", None)
    assert router.route("org/anything", None, NO_HINTS).bundle == "default"
    assert encode_outputs(route, ["sparse"]) == ["sparse"]


def test_encode_outputs_default_and_validation(router: Router) -> None:
    minilm = router.route(MINILM, None, NO_HINTS)
    assert encode_outputs(minilm, None) == ["dense"]
    assert encode_outputs(minilm, ["multivector", "dense"]) == ["multivector", "dense"]
    with pytest.raises(InvalidRequestError) as caught:
        encode_outputs(minilm, ["dense", "sparse"])
    assert caught.value.message == (
        f"Model '{MINILM}' does not support output types: {{'sparse'}}. Supported: {{'dense', 'multivector'}}"
    )


def test_a_multivector_model_gives_dense_when_muvera_is_on(catalog: Catalog) -> None:
    """The public ColBERT YAMLs' `muvera` profile (runtime `muvera: {}`, output_types [dense]) makes `dense` an
    output of the variant; a request's own `muvera` option turns it on or off on any profile."""
    colbert = parse_model_config(
        {"sie_id": "acme/colbert", "hf_id": "acme/colbert", "tasks": {"encode": {"multivector": {"dim": 8}}},
         "profiles": {"default": {"adapter_path": "sie_server.adapters.colbert:ColBERTAdapter", "max_batch_tokens": 64},
                      "muvera": {"extends": "default", "adapter_options": {"runtime": {
                          "muvera": {}, "output_types": ["dense"]}}}}}
    )  # fmt: skip
    router = Router(lambda: catalog.with_models([colbert]), LaneSettings())
    variant = router.route("acme/colbert:muvera", None, NO_HINTS)
    assert variant.muvera and encode_outputs(variant, None) == ["dense"]
    assert encode_outputs(variant, ["dense", "multivector"]) == ["dense", "multivector"]
    default = router.route("acme/colbert", None, NO_HINTS)
    assert encode_outputs(default, None) == ["multivector"]
    assert encode_outputs(default, ["dense"], {"muvera": {}}) == ["dense"]
    for route, options in ((default, None), (variant, {"muvera": None})):
        with pytest.raises(InvalidRequestError, match=r"does not support output types: \{'dense'\}"):
            encode_outputs(route, ["dense"], options)


def test_sparse_only_model_defaults_to_sparse(router: Router) -> None:
    assert encode_outputs(router.route("rasyosef/splade-tiny", None, NO_HINTS), None) == ["sparse"]


def test_operation_checks_before_publishing(router: Router) -> None:
    rampart = router.route("nationaldesignstudio/rampart", None, NO_HINTS)
    with pytest.raises(InvalidRequestError, match="does not support encoding"):
        encode_outputs(rampart, None)
    with pytest.raises(InvalidRequestError, match="does not support scoring"):
        check_score(rampart)
    check_extract(rampart, None, 10)
    with pytest.raises(InvalidRequestError, match="'output_dtype' does not apply to extraction"):
        check_extract(rampart, ExtractParams(output_dtype="int8"), 10)
    # A fixed-label tagger reads labels as a filter: at most the limit, each a short non-blank string.
    check_extract(rampart, ExtractParams(labels=["person"] * 10), 10)
    with pytest.raises(InvalidRequestError, match="11 labels; at most 10 are accepted"):
        check_extract(rampart, ExtractParams(labels=["person"] * 11), 10)
    for bad in ["", "   ", "x" * 129]:
        with pytest.raises(InvalidRequestError, match="Label 1 must be a non-blank string of at most 128"):
            check_extract(rampart, ExtractParams(labels=["person", bad]), 10)
    minilm = router.route(MINILM, None, NO_HINTS)
    check_score(minilm)
    with pytest.raises(InvalidRequestError, match="does not support extraction"):
        check_extract(minilm, None, 10)


def test_output_dtype_must_be_one_sie_serves(router: Router) -> None:
    check_output_dtype(None)
    check_output_dtype(EncodeParams(output_dtype="binary", options={"output_dtype": "int8"}))
    with pytest.raises(InvalidRequestError, match="Unsupported output_dtype 'float64'"):
        check_output_dtype(EncodeParams(output_dtype="float64"))
    # The SDK's DType lists bfloat16; no numpy vector can carry it, so it is refused before queueing.
    with pytest.raises(InvalidRequestError, match="Unsupported output_dtype 'bfloat16'"):
        check_output_dtype(EncodeParams(output_dtype="bfloat16"))
    minilm = router.route(MINILM, None, NO_HINTS)
    with pytest.raises(InvalidRequestError, match=r"Option 'output_dtype' must be null or one of .*'bfloat16'"):
        check_options(minilm, {"output_dtype": "bfloat16"}, OPERATION_ENCODE, None)


def test_options_are_checked_against_the_models_adapter(router: Router) -> None:
    minilm = router.route(MINILM, None, NO_HINTS)
    splade = router.route("rasyosef/splade-tiny", None, NO_HINTS)
    rampart = router.route("nationaldesignstudio/rampart", None, NO_HINTS)
    assert (minilm.adapter_kind, splade.adapter_kind, rampart.adapter_kind) == (
        "dense", "sparse", "token_classification"
    )  # fmt: skip
    check_options(minilm, {"pooling": "cls", "normalize": False, "is_query": True, "future": 1}, "encode", "q:")
    pooling = r"Option 'pooling' must be null or one of \['mean', 'cls', 'last', 'last_token'\]"
    with pytest.raises(InvalidRequestError, match=pooling):
        check_options(minilm, {"pooling": "max"}, OPERATION_ENCODE, None)
    with pytest.raises(InvalidRequestError, match="Option 'pooling' does not apply to a sparse embedding model"):
        check_options(splade, {"pooling": "cls"}, OPERATION_ENCODE, None)
    with pytest.raises(InvalidRequestError, match="does not apply to a dense embedding model when scoring"):
        check_options(minilm, {"output_dtype": "int8"}, OPERATION_SCORE, None)
    with pytest.raises(InvalidRequestError, match="Option 'threshold' must be a number from 0 to 1"):
        check_options(rampart, {"threshold": 7}, OPERATION_EXTRACT, None)
    with pytest.raises(InvalidRequestError, match="Field 'instruction' has 5000 characters"):
        check_options(minilm, None, OPERATION_ENCODE, "x" * 5000)
