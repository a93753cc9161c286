"""Validation of model and bundle YAML: every bad field is reported with file, model and field."""

from __future__ import annotations

import pytest

from sie.catalog import CatalogErrors, ConfigError, load_yaml, parse_bundle, parse_model_config, read_catalog
from sie.catalog.ids import validate_model_id

VALID = {
    "sie_id": "org/model",
    "hf_id": "org/model",
    "profiles": {"default": {"adapter_path": "sie.adapters.dense:OnnxDenseAdapter", "max_batch_tokens": 8192}},
}


def _errors(data, source="m.yaml") -> list[ConfigError]:
    with pytest.raises(CatalogErrors) as info:
        parse_model_config(data, source)
    return info.value.errors


def _with_profiles(**profiles):
    return {**VALID, "profiles": profiles}


def test_valid_model_parses_with_defaults() -> None:
    model = parse_model_config(VALID)
    assert model.profiles["default"].adapter_module == "sie.adapters.dense"
    assert model.effective_pool == "default"
    assert model.inputs == {"text": True}


def test_a_generation_task_and_its_output_limit() -> None:
    model = parse_model_config({**VALID, "tasks": {"generate": {"max_output_tokens": 512, "context_length": 4096}}})
    assert model.tasks.generate and model.tasks.max_output_tokens == 512
    assert parse_model_config({**VALID, "tasks": {"generate": None}}).tasks.generate is False
    assert parse_model_config({**VALID, "tasks": {"generate": {}}}).tasks.max_output_tokens is None
    (error,) = _errors({**VALID, "tasks": {"generate": {"max_output_tokens": 0}}})
    assert "tasks.generate.max_output_tokens" in str(error)


def test_unknown_fields_are_kept() -> None:
    model = parse_model_config({**VALID, "hf_tokenizer_dependencies": ["x"]})
    assert model.extra == {"hf_tokenizer_dependencies": ["x"]}


def test_missing_profiles_and_id_are_both_reported() -> None:
    errors = _errors({"hf_id": "x"})
    assert {e.field for e in errors} == {"sie_id", "profiles"}
    assert all(e.source == "m.yaml" for e in errors)


def test_error_names_file_model_and_field() -> None:
    data = _with_profiles(default={"adapter_path": "sie.adapters.dense:X", "max_batch_tokens": "lots"})
    (error,) = _errors(data, "config/models/org__model.yaml")
    assert error.describe() == (
        "config/models/org__model.yaml: model 'org/model': profiles.default.max_batch_tokens: "
        "expected a positive integer, got str 'lots'"
    )


def test_extends_chain_is_rejected() -> None:
    data = _with_profiles(
        default={"adapter_path": "a.b:C", "max_batch_tokens": 1},
        fast={"extends": "default"},
        faster={"extends": "fast"},
    )
    (error,) = _errors(data)
    assert error.field == "profiles.faster.extends"
    assert "only one level" in error.message


def test_extends_cycle_is_rejected() -> None:
    data = _with_profiles(
        default={"adapter_path": "a.b:C", "max_batch_tokens": 1}, a={"extends": "b"}, b={"extends": "a"}
    )
    assert {e.field for e in _errors(data)} == {"profiles.a.extends", "profiles.b.extends"}


def test_extends_unknown_profile() -> None:
    data = _with_profiles(default={"adapter_path": "a.b:C", "max_batch_tokens": 1}, x={"extends": "nope"})
    (error,) = _errors(data)
    assert error.message == "extends unknown profile 'nope'"


def test_profile_without_extends_needs_adapter_and_budget() -> None:
    errors = _errors(_with_profiles(default={"compute_precision": "float16"}))
    assert {e.field for e in errors} == {"profiles.default.adapter_path", "profiles.default.max_batch_tokens"}


@pytest.mark.parametrize(
    ("profile", "field"),
    [
        ({"adapter_path": "not a path", "max_batch_tokens": 1}, "profiles.default.adapter_path"),
        (
            {"adapter_path": "a.b:C", "max_batch_tokens": 1, "compute_precision": "int4"},
            "profiles.default.compute_precision",
        ),
        (
            {"adapter_path": "a.b:C", "max_batch_tokens": 1, "adapter_options": []},
            "profiles.default.adapter_options",
        ),
        (
            {"adapter_path": "a.b:C", "max_batch_tokens": 1, "adapter_options": {"runtime": 3}},
            "profiles.default.adapter_options.runtime",
        ),
    ],
)
def test_profile_field_types(profile, field) -> None:
    (error,) = _errors(_with_profiles(default=profile))
    assert error.field == field


def test_package_backed_excludes_other_sources() -> None:
    (error,) = _errors({**VALID, "package_backed": True})
    assert error.field == "package_backed"


def test_a_source_is_required() -> None:
    data = {key: value for key, value in VALID.items() if key != "hf_id"}
    (error,) = _errors(data)
    assert error.field == "hf_id"


def test_package_source_shape() -> None:
    model = parse_model_config({**VALID, "package": {"distribution": "d", "version": "1", "path": "p"}})
    assert model.package.distribution == "d"
    (error,) = _errors({**VALID, "package": {"distribution": "d", "version": "1"}})
    assert error.field == "package.path"


@pytest.mark.parametrize(
    ("model_id", "message"),
    [
        ("../etc", "Model ID contains invalid characters."),
        ("a\\b", "Model ID contains invalid characters."),
        ("-lead", "Model ID contains invalid characters."),
        (
            "org/model/status",
            "Model ID must not end with '/status' (reserved for the gateway status endpoint).",
        ),
        ("status", "Model ID must not end with '/status' (reserved for the gateway status endpoint)."),
    ],
)
def test_bad_ids(model_id: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_model_id(model_id)
    assert info.value.message == message
    (error,) = _errors({**VALID, "sie_id": model_id})
    assert (error.field, error.message) == ("sie_id", message)


def test_ids_may_carry_colon_and_at() -> None:
    validate_model_id("org/model:variant@v2")


def test_top_level_must_be_a_mapping() -> None:
    (error,) = _errors(["a"])
    assert error.message == "Expected YAML mapping at top level"


def test_malformed_yaml_names_the_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_yaml("a: [1, 2", "models/broken.yaml")
    assert info.value.source == "models/broken.yaml"
    assert info.value.message.startswith("Invalid YAML:")


def test_bundle_defaults_and_unknown_fields() -> None:
    bundle = parse_bundle({"name": "b", "adapters": ["x.y"], "deps": {"torch": ">=2"}})
    assert (bundle.priority, bundle.engine) == (100, "pytorch")
    assert bundle.extra == {"deps": {"torch": ">=2"}}


def test_bundle_errors() -> None:
    with pytest.raises(CatalogErrors) as info:
        parse_bundle({"priority": "high", "adapters": "x"}, "b.yaml")
    assert {e.field for e in info.value.errors} == {"name", "priority", "adapters"}


def test_directory_check_reports_unknown_adapter_module_and_bad_files(tmp_path) -> None:
    (tmp_path / "bundles").mkdir()
    (tmp_path / "models").mkdir()
    (tmp_path / "bundles" / "default.yaml").write_text("name: default\npriority: 10\nadapters: [sie.adapters.dense]\n")
    (tmp_path / "models" / "good.yaml").write_text(
        "sie_id: org/good\nhf_id: org/good\nprofiles:\n"
        "  default: {adapter_path: 'sie.adapters.dense:A', max_batch_tokens: 1}\n"
    )
    (tmp_path / "models" / "alien.yaml").write_text(
        "sie_id: org/alien\nhf_id: org/alien\nprofiles:\n"
        "  default: {adapter_path: 'other.pkg:A', max_batch_tokens: 1}\n"
    )
    (tmp_path / "models" / "broken.yaml").write_text("sie_id: [\n")
    catalog, errors = read_catalog(tmp_path / "bundles", tmp_path / "models")
    assert set(catalog.models) == {"org/good", "org/alien"}
    by_model = {(e.model_id, e.field): e for e in errors}
    alien = by_model[("org/alien", "profiles.default.adapter_path")]
    assert alien.message == "Adapter(s) not in any known bundle: other.pkg"
    assert any(e.source.endswith("broken.yaml") and e.message.startswith("Invalid YAML") for e in errors)
