"""Model and bundle catalogue: YAML types, validation, model → bundle resolution, names and hashes.

Pure: no network, no event loop; the only I/O is reading YAML files in `loader`.
"""

from sie.catalog.bundle import Bundle
from sie.catalog.catalog import Catalog, ModelEntry, Resolution
from sie.catalog.errors import (
    BundleConflictError,
    CatalogError,
    CatalogErrors,
    ConfigError,
    InvalidModelIdError,
    ModelNotFoundError,
)
from sie.catalog.hashing import bundle_config_hash, bundle_config_hashes_hash, bundles_hash
from sie.catalog.ids import normalize_model_id, parse_model_spec, validate_model_id
from sie.catalog.loader import bundle_errors, load_catalog, read_catalog
from sie.catalog.model import ModelConfig, Profile
from sie.catalog.parse import parse_bundle, parse_model_config
from sie.catalog.yamlio import dump_yaml, load_yaml

__all__ = [
    "Bundle",
    "BundleConflictError",
    "Catalog",
    "CatalogError",
    "CatalogErrors",
    "ConfigError",
    "InvalidModelIdError",
    "ModelConfig",
    "ModelEntry",
    "ModelNotFoundError",
    "Profile",
    "Resolution",
    "bundle_config_hash",
    "bundle_config_hashes_hash",
    "bundles_hash",
    "dump_yaml",
    "bundle_errors",
    "load_catalog",
    "load_yaml",
    "normalize_model_id",
    "parse_bundle",
    "parse_model_config",
    "parse_model_spec",
    "read_catalog",
    "validate_model_id",
]
