"""The built-in artifact byte store: files under a directory (the node's
``<data_dir>/jobs/artifacts``), behind the host contract's ``ArtifactStore``
(``hooks/contract.py``; docs/artifacts.md).

A key is a relative path of ``[A-Za-z0-9._-]`` segments joined by ``/`` (no ``..``, no empty
segment); its uri is ``artifact://<key>``. A key whose path leaves the root through a symbolic
link (a directory or the file itself linked elsewhere) is refused like a malformed key: no path
outside the root is ever read, written or deleted. Writes go to a temporary file renamed into place, so
a reader never sees half a file. ``delete`` of a missing key answers False (counts as pruned).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

__all__ = ["SCHEME", "FileArtifactStore", "key_of", "uri_of"]

#: The uri scheme of a stored artifact's bytes.
SCHEME = "artifact://"
_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _check(key: str) -> str:
    parts = key.split("/") if isinstance(key, str) else []
    if not parts or any(not _SEGMENT.fullmatch(p) or p in (".", "..") for p in parts):
        raise ValueError(f"artifact key must be /-joined [A-Za-z0-9._-] segments; got {key!r}")
    return key


def uri_of(key: str) -> str:
    """``artifact://<key>``."""
    return SCHEME + _check(key)


def key_of(uri: str) -> str | None:
    """The key of an ``artifact://`` uri, or None for any other uri (not ours to delete)."""
    if not isinstance(uri, str) or not uri.startswith(SCHEME):
        return None
    try:
        return _check(uri[len(SCHEME) :])
    except ValueError:
        return None


class FileArtifactStore:
    """Artifact bytes as files under ``root`` (created on first write).

    :param root: the directory.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        path = self.root.joinpath(*_check(key).split("/"))
        root = self.root.resolve()
        if not path.resolve().is_relative_to(root):
            raise ValueError(f"artifact key {key!r} leads outside the store's root")
        return path

    def put(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key`` (atomically replacing any); returns its uri.

        :raises ValueError: a malformed key, or one leading outside the root.
        :raises OSError: the directory cannot be written.
        """
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(data))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return uri_of(key)

    def get(self, key: str) -> bytes | None:
        """The bytes under ``key``, or None when missing.

        :raises ValueError: a malformed key, or one leading outside the root."""
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> bool:
        """Remove ``key``; False when it was already missing (never an error).

        :raises ValueError: a malformed key, or one leading outside the root."""
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        return True
