"""Start-up state of the config service: bundles and baseline models from the catalogue directories, stored
models replayed from the config store (SIE_CONFIG_RESTORE), and the stored epoch. Blocking file I/O: the
role runs these in a thread. A bundle directory that fails to load leaves the registry unavailable
(seed 000 §11.8) instead of stopping the process; bad model files are logged and left out.

The stored epoch numbers the stored models (seed 000 §3: every exported (epoch, models) pair is a state that
existed), so it is served only with them: restore is on by default, and off only over a store with no models.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sie.catalog import CatalogErrors, ConfigError, bundle_errors, load_yaml, parse_model_config, read_catalog
from sie.control.errors import UnrestoredStoreError
from sie.control.registry import ModelRegistry, RegistryState
from sie.stores.config_store import ConfigStore

logger = logging.getLogger(__name__)


def load_registry(bundles_dir: Path, models_dir: Path) -> ModelRegistry:
    """The filesystem baseline; unavailable (with the reason) when any bundle file failed to load."""
    catalog, errors = read_catalog(Path(bundles_dir), Path(models_dir))
    failed_bundles = bundle_errors(errors, Path(bundles_dir))
    if failed_bundles:
        reason = "; ".join(error.describe() for error in failed_bundles)
        logger.error("bundles failed to load, the config registry is unavailable: %s", reason)
        return ModelRegistry.unavailable(reason)
    for error in errors:
        logger.warning("model config problem (model left out or unroutable): %s", error.describe())
    return ModelRegistry(RegistryState.from_filesystem(catalog))


def restore_models(registry: ModelRegistry, store: ConfigStore) -> int:
    """Replay every stored model into the registry as an API model; returns how many were restored."""
    state = registry.state
    restored = 0
    for model_id, text in sorted(store.list_models().items()):
        try:
            model = parse_model_config(load_yaml(text, model_id), source=f"store:{model_id}")
        except (CatalogErrors, ConfigError) as exc:
            logger.error("stored model %s is invalid and was not restored: %s", model_id, exc)
            continue
        state = state.with_api_model(model, text)
        restored += 1
    registry.swap(state)
    return restored


def require_no_stored_models(store: ConfigStore) -> None:
    """With SIE_CONFIG_RESTORE=false: UnrestoredStoreError when the store holds models, naming the way out."""
    stored = store.list_models()
    if stored:
        raise UnrestoredStoreError(
            f"SIE_CONFIG_RESTORE=false, but the config store {store!r} holds {len(stored)} models written through "
            "the API; serving its epoch without them would tell gateways they are current. Set "
            "SIE_CONFIG_RESTORE=true (the default) to serve them, or remove the store (models and epoch) to start "
            "afresh at epoch 0."
        )
