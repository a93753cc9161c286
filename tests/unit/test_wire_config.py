"""The config delta notification (sie.wire.config)."""

import json

import pytest

from sie.wire import DecodeError, from_json, loads_json, to_json
from sie.wire.config import ConfigNotification

PUBLISHED = {
    "router_id": "sie-config-7d9f",
    "bundle_id": "default",
    "epoch": 12,
    "bundle_config_hash": "ab" * 32,
    "model_id": "BAAI/bge-m3",
    "pool": "default",
    "bundle_pool_config_hashes": {"default": {"default": "cd" * 32, "tenant": "ef" * 32}},
    "profiles_added": ["banking"],
    "model_config": "sie_id: BAAI/bge-m3\nprofiles: {}\n",
    "affected_bundles": ["default", "gpu"],
}


def test_seed_fields_round_trip_through_json():
    notification = from_json(json.dumps(PUBLISHED), ConfigNotification)
    assert notification.bundle_pool_config_hashes["default"]["tenant"] == "ef" * 32
    assert loads_json(to_json(notification)) == PUBLISHED | {"bundle_adapters": None}


def test_part_b_eight_field_delta_still_parses():
    old = {key: PUBLISHED[key] for key in PUBLISHED if key not in ("pool", "bundle_pool_config_hashes")}
    notification = from_json(json.dumps(old), ConfigNotification)
    assert notification.pool is None
    assert notification.bundle_pool_config_hashes == {}


def test_producer_id_is_read_as_router_id():
    data = {("producer_id" if key == "router_id" else key): value for key, value in PUBLISHED.items()}
    assert from_json(json.dumps(data), ConfigNotification).router_id == "sie-config-7d9f"


def test_epoch_must_be_an_integer():
    with pytest.raises(DecodeError) as caught:
        from_json(json.dumps(PUBLISHED | {"epoch": "12"}), ConfigNotification)
    assert str(caught.value) == "Expected `int`, got `str` - at `$.epoch`"
