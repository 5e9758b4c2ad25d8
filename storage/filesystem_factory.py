"""Which filesystem holds a log dir URL: the one place that knows every implementation of the seam."""

from __future__ import annotations

import os

from .filesystem import LogFileSystem
from .local_filesystem import LocalFileSystem, MemoryFileSystem
from .objects.object_store import open_object_store


def open_filesystem(url: str, storage_options: dict | None = None) -> tuple[LogFileSystem, str]:
    """Pick the filesystem for a log dir URL; returns (filesystem, path within it)."""
    if "://" not in url:
        return LocalFileSystem(), os.path.abspath(url)
    protocol, rest = url.split("://", 1)
    if protocol == "file":
        return LocalFileSystem(), os.path.abspath("/" + rest.lstrip("/"))
    if protocol == "memory":  # stays a full filesystem (append, rename, locks) for fast tests
        return MemoryFileSystem(), "/" + rest.lstrip("/")
    # s3://, gs://, abfs://, ...: immutable objects
    return open_object_store(url, storage_options)
