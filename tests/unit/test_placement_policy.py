"""The placement policy: runtime knob changes (coerced, validated, mode and startup-only knobs refused),
per-model overrides, the `scheduling:` YAML block, and the startup policy from settings plus file."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sie.placement.policy import (
    MAX_FILL_FACTOR,
    MAX_MODEL_ID_CHARS,
    MAX_MODEL_OVERRIDES,
    MAX_REPLICAS,
    ModelOverride,
    PlacementPolicy,
    PolicyError,
    parse_scheduling_yaml,
    policy_from_settings,
)
from sie.settings.placement import PlacementSettings

SEED_BLOCK = """\
scheduling:
  mode: lpt_packing
  work_basis: items
  rebalance_compute_seconds: 300
  first_rebalance_compute_seconds: 60
  ema_halflife_compute_seconds: 0
  hysteresis: 0.0
  default_replicas: 1
  routing_fill_factor: 1.0
  routing_policy: fill_least
  routing_fill_mode: run
  forbid_memory_oversubscription: true
  models:
    big-model:
      replicas: 2
      fill_mode: spread
      fill_factor: 0.5
"""


def test_knobs_arriving_as_strings_are_coerced() -> None:
    policy = PlacementPolicy(mode="lpt_packing").with_knobs(
        {
            "hysteresis": "0.15",
            "forbid_memory_oversubscription": "false",
            "default_replicas": "all",
            "routing_fill_factor": "2",
            "routing_policy": "fill_rr",
            "work_basis": "items",
        }
    )
    assert policy.hysteresis == pytest.approx(0.15)
    assert policy.forbid_memory_oversubscription is False
    assert policy.default_replicas == "all"
    assert policy.routing_fill_factor == pytest.approx(2.0)
    assert policy.routing_policy == "fill_rr"
    assert policy.work_basis == "items"


def test_knobs_arriving_as_json_types_are_kept() -> None:
    policy = PlacementPolicy().with_knobs({"default_replicas": 3, "rebalance_compute_seconds": 10, "hysteresis": 0})
    assert policy.default_replicas == 3
    assert policy.rebalance_compute_seconds == pytest.approx(10.0)
    assert policy.hysteresis == 0.0


def test_the_mode_is_fixed_at_startup() -> None:
    with pytest.raises(PolicyError, match="mode is fixed at startup"):
        PlacementPolicy().with_knobs({"mode": "lpt_packing"})


def test_work_basis_is_fixed_at_startup_under_least_outstanding_only() -> None:
    with pytest.raises(PolicyError, match="work_basis is fixed at startup"):
        PlacementPolicy(mode="least_outstanding").with_knobs({"work_basis": "items"})
    assert PlacementPolicy(mode="lpt_packing").with_knobs({"work_basis": "items"}).work_basis == "items"


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("routing_fill_factor", 0),
        ("routing_fill_factor", "-1"),
        ("rebalance_compute_seconds", "0"),
        ("hysteresis", "abc"),
        ("hysteresis", True),
        ("hysteresis", "nan"),
        ("first_rebalance_compute_seconds", -1),
        ("default_replicas", 0),
        ("default_replicas", "1.5"),
        ("default_replicas", True),
        ("routing_policy", "fill_most"),
        ("routing_fill_mode", "burst"),
        ("work_basis", "tokens"),
        ("forbid_memory_oversubscription", "maybe"),
        ("compaction_mode", "lazy"),
        ("compaction_interval", "-1"),
        ("compaction_interval", 1.5),
    ],
)
def test_bad_values_are_refused_naming_the_knob(knob: str, value: object) -> None:
    with pytest.raises(PolicyError, match=knob):
        PlacementPolicy(mode="lpt_packing").with_knobs({knob: value})


def test_unknown_knobs_and_models_are_refused() -> None:
    with pytest.raises(PolicyError, match="unknown scheduling knob 'compaction_intervals'"):
        PlacementPolicy().with_knobs({"compaction_intervals": 4})
    with pytest.raises(PolicyError, match="models are changed one at a time"):
        PlacementPolicy().with_knobs({"models": {}})


def test_compaction_knobs_change_at_run_time_and_read_from_the_file() -> None:
    policy = PlacementPolicy().with_knobs({"compaction_mode": "scheduled", "compaction_interval": "4"})
    assert (policy.compaction_mode, policy.compaction_interval) == ("scheduled", 4)
    assert policy.as_dict()["compaction_interval"] == 4
    knobs, _ = parse_scheduling_yaml("scheduling:\n  compaction_mode: off\n  compaction_interval: 0\n")
    assert knobs == {"compaction_mode": "off", "compaction_interval": 0}


def test_a_refused_change_leaves_the_policy_unchanged() -> None:
    policy = PlacementPolicy()
    with pytest.raises(PolicyError):
        policy.with_knobs({"hysteresis": "0.5", "routing_fill_factor": "0"})
    assert policy.hysteresis == 0.0


def test_model_overrides_fall_back_to_the_fleet_defaults() -> None:
    policy = PlacementPolicy(default_replicas=2, routing_fill_mode="run", routing_fill_factor=1.0)
    policy = policy.with_model("hot", replicas="all").with_model("hot", fill_mode="spread")
    assert policy.models["hot"] == ModelOverride(replicas="all", fill_mode="spread", fill_factor=None)
    assert policy.replicas_for("hot") == "all"
    assert policy.fill_mode_for("hot") == "spread"
    assert policy.fill_factor_for("hot") == 1.0
    assert policy.replicas_for("other") == 2
    assert policy.fill_mode_for("other") == "run"


@pytest.mark.parametrize("change", [{"replicas": 0}, {"fill_mode": "burst"}, {"fill_factor": "0"}, {"replicas": "two"}])
def test_bad_model_overrides_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(PolicyError):
        PlacementPolicy().with_model("m", **change)


# Found by tests/fuzz: each was accepted and then broke `GET /v1/placement` (a 500 on every later call) because
# the count could not be rendered as JSON, the fill quantum overflowed, or int() refused what isdigit() passed.
@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("default_replicas", 10**30),
        ("default_replicas", "9" * 30),
        ("default_replicas", 1e30),
        ("default_replicas", MAX_REPLICAS + 1),
        ("default_replicas", "\u00b2"),
        ("routing_fill_factor", 1e308),
        ("routing_fill_factor", MAX_FILL_FACTOR * 2),
        ("hysteresis", 10**400),
    ],
)
def test_values_past_what_the_policy_can_report_are_refused(knob: str, value: object) -> None:
    with pytest.raises(PolicyError, match=knob):
        PlacementPolicy().with_knobs({knob: value})


@pytest.mark.parametrize("change", [{"replicas": 10**30}, {"replicas": "\u00b2"}, {"fill_factor": 1e308}])
def test_model_overrides_past_what_the_policy_can_report_are_refused(change: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match=next(iter(change))):
        PlacementPolicy().with_model("m", **change)


def test_the_largest_values_accepted_stay_json_ready() -> None:
    policy = PlacementPolicy().with_knobs({"default_replicas": MAX_REPLICAS, "routing_fill_factor": MAX_FILL_FACTOR})
    policy = policy.with_model("m", replicas=str(MAX_REPLICAS), fill_factor=MAX_FILL_FACTOR)
    assert orjson.loads(orjson.dumps(policy.as_dict()))["models"]["m"]["replicas"] == MAX_REPLICAS


def test_as_dict_is_json_ready_with_models() -> None:
    document = PlacementPolicy(mode="lpt_packing").with_model("m", replicas=2).as_dict()
    assert document["mode"] == "lpt_packing"
    assert document["routing_fill_factor"] == 1.0
    assert document["models"] == {"m": {"replicas": 2}}


def test_the_seed_block_parses() -> None:
    knobs, models = parse_scheduling_yaml(SEED_BLOCK)
    assert knobs["mode"] == "lpt_packing"
    assert knobs["work_basis"] == "items"
    assert knobs["rebalance_compute_seconds"] == 300.0
    assert knobs["forbid_memory_oversubscription"] is True
    assert models == {"big-model": ModelOverride(replicas=2, fill_mode="spread", fill_factor=0.5)}


def test_the_file_may_hold_just_the_blocks_content() -> None:
    knobs, models = parse_scheduling_yaml("mode: lpt_packing\ndefault_replicas: all\n")
    assert knobs == {"mode": "lpt_packing", "default_replicas": "all"}
    assert models == {}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("scheduling:\n  compaction_mode: lazy\n", "compaction_mode"),
        ("scheduling:\n  models:\n    m:\n      replica: 2\n", "'replica'"),
        ("scheduling:\n  mode: lpt_packing\nlogging:\n  level: debug\n", "'logging'"),
        ("scheduling:\n  routing_fill_factor: 0\n", "routing_fill_factor"),
        ("scheduling: [\n", "invalid YAML"),
    ],
)
def test_unknown_keys_and_bad_values_in_the_file_are_refused(text: str, named: str) -> None:
    with pytest.raises(PolicyError, match=named) as caught:
        parse_scheduling_yaml(text, source="placement.yaml")
    assert "placement.yaml" in str(caught.value)


def test_settings_map_onto_the_scheduling_names() -> None:
    policy = policy_from_settings(
        PlacementSettings(mode="lpt_packing", fill_factor=0.5, fill_mode="spread", routing_policy="fill_rr")
    )
    assert policy.mode == "lpt_packing"
    assert policy.routing_fill_factor == 0.5
    assert policy.routing_fill_mode == "spread"
    assert policy.routing_policy == "fill_rr"
    assert policy.models == {}


def test_the_file_wins_over_defaults_and_a_given_setting_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "placement.yaml"
    path.write_text(SEED_BLOCK.replace("hysteresis: 0.0", "hysteresis: 0.2"), encoding="utf-8")
    policy = policy_from_settings(PlacementSettings(file=path, work_basis="requests"))
    assert policy.mode == "lpt_packing"  # the setting was left at its default: the file's value
    assert policy.hysteresis == pytest.approx(0.2)
    assert policy.work_basis == "requests"  # given a non-default value: the setting wins
    assert policy.replicas_for("big-model") == 2


def test_an_unreadable_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="SIE_PLACEMENT_FILE=.*missing.yaml: cannot be read"):
        policy_from_settings(PlacementSettings(file=tmp_path / "missing.yaml"))


def test_per_model_overrides_are_bounded_in_number_and_id_length() -> None:
    policy = PlacementPolicy()
    for index in range(MAX_MODEL_OVERRIDES):
        policy = policy.with_model(f"m{index}", replicas=1)
    with pytest.raises(PolicyError, match="per-model overrides"):
        policy.with_model("one-more", replicas=1)
    assert policy.with_model("m7", replicas=2).replicas_for("m7") == 2  # an existing override still changes
    with pytest.raises(PolicyError, match="at most"):
        PlacementPolicy().with_model("x" * (MAX_MODEL_ID_CHARS + 1), replicas=1)
