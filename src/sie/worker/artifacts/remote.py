"""`weights_path` URLs: copy a file or directory from any fsspec filesystem (`s3://`, `gs://`, `file://`,
`memory://`, ...) into a local directory, translating fsspec and backend failures into FetchError.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from sie.worker.artifacts.errors import ErrorClass, FetchError
from sie.worker.artifacts.progress import STAGE_DOWNLOAD, ByteProgress

CHUNK_BYTES = 8 << 20


def copy_url(url: str, destination: Path, on_progress: ByteProgress) -> None:
    """Copy what `url` names into `destination`: a directory keeps its layout, a file keeps its name."""
    import fsspec  # only a model whose weights come from a URL needs it; a worker starts without it

    try:
        filesystem, root = fsspec.core.url_to_fs(url)
        listing = _listing(filesystem, root, url)
        _copy_files(filesystem, listing, destination, on_progress)
    except FetchError:
        raise
    except ImportError as exc:
        detail = f"the fsspec backend for {url.split('://', 1)[0]}:// is not installed: {exc}"
        raise FetchError(ErrorClass.DEPENDENCY, detail) from exc
    except FileNotFoundError as exc:
        raise FetchError(ErrorClass.NOT_FOUND, f"{url} does not exist") from exc
    except PermissionError as exc:
        raise FetchError(ErrorClass.NOT_FOUND, f"{url} is not readable with these credentials: {exc}") from exc
    except ValueError as exc:
        # fsspec raises ValueError for an unknown protocol and for malformed URLs.
        raise FetchError(ErrorClass.NOT_FOUND, f"{url} is not a usable fsspec URL: {exc}") from exc
    except (OSError, TimeoutError) as exc:
        raise FetchError(ErrorClass.NETWORK, f"reading {url} failed: {exc}") from exc
    except Exception as exc:
        # Backends raise their own types (gcsfs HttpError, botocore errors): unclassified, but still chained.
        raise FetchError(ErrorClass.UNKNOWN, f"reading {url} failed: {type(exc).__name__}: {exc}") from exc


def _listing(filesystem: Any, root: str, url: str) -> list[tuple[str, str, int | None]]:
    """(remote path, relative path, size or None) of every file to copy."""
    if filesystem.isdir(root):
        found = filesystem.find(root, detail=True)
        files = [
            (path, posixpath.relpath(path, root), info.get("size"))
            for path, info in sorted(found.items())
            if info.get("type", "file") == "file"
        ]
        if not files:
            raise FetchError(ErrorClass.NOT_FOUND, f"{url} is an empty directory")
        return files
    if filesystem.isfile(root):
        return [(root, posixpath.basename(root.rstrip("/")), filesystem.size(root))]
    raise FileNotFoundError(url)


def _copy_files(
    filesystem: Any,
    listing: list[tuple[str, str, int | None]],
    destination: Path,
    on_progress: ByteProgress,
) -> None:
    sizes = [size for _, _, size in listing if size is not None]
    total = sum(sizes) if len(sizes) == len(listing) else None
    done = 0
    on_progress(STAGE_DOWNLOAD, 0, total)
    for remote_path, relative, _ in listing:
        target = destination.joinpath(*relative.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with filesystem.open(remote_path, "rb") as source, target.open("wb") as sink:
            while chunk := source.read(CHUNK_BYTES):
                sink.write(chunk)
                done += len(chunk)
                on_progress(STAGE_DOWNLOAD, done, total)
