"""The export's file writes, each durable once it returns: a new file (created, written, fsynced), a file
replaced in one step (temporary file, fsync, rename, directory fsync: how Kafka writes its checkpoints),
and two directory entries exchanged in one step (Linux renameat2 RENAME_EXCHANGE, where available).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from typing import Any


def fsync_dir(path: str) -> None:
    """Make the directory's entries (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new(path: str, data: bytes | memoryview) -> None:
    """Create a file with these bytes, fsynced (it must not exist)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_replace(path: str, data: bytes) -> None:
    """Replace a file in one step (tmp + fsync + rename + directory fsync), as Kafka writes its checkpoints."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


_RENAME_EXCHANGE = 2
_libc: Any = None  # ctypes.CDLL once loaded, False where renameat2 is missing


def exchange(a: str, b: str) -> bool:
    """Swap two directory entries atomically (Linux renameat2 RENAME_EXCHANGE); False where that is not
    available (another OS, an old libc, a filesystem that does not support it)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.renameat2  # noqa: B018 (glibc 2.28+)
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    at_fdcwd = -100
    if _libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")
