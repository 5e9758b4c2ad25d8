"""Kafka's `log.dirs`: which log dirs a ROOT names, and which filesystem holds them.

ROOT is one log dir (a path or URL, commas and all), a list of them, or Kafka's setting spelled out,
`log.dirs=/disk1/logs,/disk2/logs`. Invariants: every log dir is on the same kind of filesystem, none is
empty or listed twice, and a bare path is never split. open_filesystem is the one place that knows every
implementation of the seam (storage/fs/, storage/objects/), so this module sits above both packages.
"""

from __future__ import annotations

import os

from .errors import InvalidConfigError
from .fs.filesystem import LogFileSystem
from .fs.local import LocalFileSystem

LOG_DIRS_PREFIX = "log.dirs="  # ROOT naming several log dirs: log.dirs=/disk1/logs,/disk2/logs


def open_filesystem(url: str, storage_options: dict | None = None) -> tuple[LogFileSystem, str]:
    """Pick the filesystem for a log dir URL; returns (filesystem, path within it)."""
    if "://" not in url:
        return LocalFileSystem(), os.path.abspath(url)
    protocol, rest = url.split("://", 1)
    if protocol == "file":
        return LocalFileSystem(), os.path.abspath("/" + rest.lstrip("/"))
    # The others are imported here: they load fsspec (~0.1 s), which a log on local disk never needs.
    if protocol == "memory":  # stays a full filesystem (append, rename, locks) for fast tests
        from .fs.memory import MemoryFileSystem

        return MemoryFileSystem(), "/" + rest.lstrip("/")
    # s3://, gs://, abfs://, ...: immutable objects
    from .objects.object_store import open_object_store

    return open_object_store(url, storage_options)


def log_dir_list(root) -> list[str]:
    """The log dirs a ROOT names: a path or URL is one log dir, commas and all; several are a list, or
    Kafka's `log.dirs=` setting spelled out (`log.dirs=/disk1/logs,/disk2/logs`), never a bare comma."""
    if isinstance(root, (list, tuple)):
        parts = [str(p) for p in root]
    elif str(root).startswith(LOG_DIRS_PREFIX):
        parts = [p.strip() for p in str(root)[len(LOG_DIRS_PREFIX) :].split(",")]
    else:
        parts = [str(root)]
    if not parts or any(not p.strip() for p in parts):
        raise InvalidConfigError(f"log dirs {root!r}: an empty log dir")
    return parts


def open_log_dirs(root, storage_options: dict | None, fs: LogFileSystem | None):
    """(filesystem, [log dir paths]) for one log dir or several (log_dir_list)."""
    parts = log_dir_list(root)
    given = fs is not None
    dirs: list[str] = []
    for p in parts:
        if given:
            path = p
        else:
            f, path = open_filesystem(p, storage_options)
            if fs is None:
                fs = f
            elif type(f) is not type(fs) or f.protocol != fs.protocol:
                raise InvalidConfigError(
                    f"log dirs {root!r}: {p!r} is not on the same kind of filesystem as "
                    f"{parts[0]!r}; every log dir must be"
                )
        path = path.rstrip("/") or "/"
        if path in dirs:
            raise InvalidConfigError(f"log dirs {root!r}: {p!r} is listed twice")
        dirs.append(path)
    return fs, dirs
