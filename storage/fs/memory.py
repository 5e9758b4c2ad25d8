"""fsspec's process-wide memory store as a log filesystem, for fast unit tests (memory:// log dirs).

Like local disk it has append, atomic rename, exclusive create and locks (per process), so logs on it
use Kafka's own protocol; nothing is durable, so it has no fsync.
"""

from __future__ import annotations

import contextlib
import threading

import fsspec

from ..common.time import SYSTEM_TIME
from ..errors import KafkaStorageError, LogLockedError
from .filesystem import Appender, Capabilities, FileInfo, LogFileSystem


class _MemoryAppender(Appender):
    def __init__(self, fs: MemoryFileSystem, path: str, create: bool):
        if not fs.exists(path):
            if not create:
                raise KafkaStorageError(f"cannot open {path} for append: no such file")
            fs._fs.pipe_file(path, b"")
        self._fs = fs
        self._path = path

    def write(self, data) -> None:
        with self._fs._fs.open(self._path, "ab") as f:
            f.write(bytes(data))

    def flush(self, fsync: bool = True) -> None:
        pass

    def truncate(self, size: int) -> None:
        self._fs.truncate(self._path, size)

    def close(self) -> None:
        pass

    @property
    def size(self) -> int:
        return self._fs.size(self._path)


_memory_locks: dict[str, threading.Lock] = {}
_memory_locks_guard = threading.Lock()
_memory_touched: dict[str, int] = {}  # modification marks (fsspec's memory store keeps creation time only)


class MemoryFileSystem(LogFileSystem):
    """fsspec's process-wide memory store, for fast unit tests. Locks are per process.

    Files are looked up in the store's dict first: fsspec's info() (behind its exists, isdir and size)
    scans every stored path before it looks for a file, which made crash-matrix tests quadratic."""

    capabilities = Capabilities(append=True, atomic_rename=True, exclusive_create=True, locks=True, fsync=False)
    protocol = "memory"

    def __init__(self):
        self._fs = fsspec.filesystem("memory")
        self._guard = threading.Lock()
        self._touched = _memory_touched

    def url(self, path):
        return f"memory://{path}"

    def _norm(self, path: str) -> str:
        return self._fs._strip_protocol(path)

    def _file(self, path: str):
        """The stored file at path, None when there is none (a directory, or nothing)."""
        return self._fs.store.get(self._norm(path))

    def exists(self, path):
        return self._file(path) is not None or self._fs.exists(path)

    def isdir(self, path):
        return self._file(path) is None and self._fs.isdir(path)

    def listdir(self, path):
        if not self._fs.isdir(path):
            return []
        out = []
        for entry in self._fs.ls(path, detail=True):
            out.append(
                FileInfo(self.basename(entry["name"]), int(entry.get("size") or 0), entry["type"] == "directory")
            )
        return out

    def size(self, path):
        f = self._file(path)
        return int(f.size) if f is not None else int(self._fs.size(path))

    def read(self, path, start=0, end=None):
        return self._fs.cat_file(path, start=start, end=end)

    def modified_ms(self, path):
        key = self._norm(path)
        if key in self._touched:
            return self._touched[key]
        f = self._file(path)
        created = getattr(f, "created", None) if f is not None else self._fs.info(path).get("created")
        return int(created.timestamp() * 1000) if created is not None else SYSTEM_TIME.milliseconds()

    def touch(self, path):
        self._touched[self._norm(path)] = SYSTEM_TIME.milliseconds()

    def write_atomic(self, path, data, *, durable=True):
        self._fs.pipe_file(path, bytes(data))

    def create_exclusive(self, path, data, *, durable=True):
        with self._guard:
            if self.exists(path):
                return False
            self._fs.pipe_file(path, bytes(data))
            return True

    def open_appender(self, path, *, create=True, bulk=False):
        return _MemoryAppender(self, path, create)

    def write_at(self, path, positions, data, *, durable=True):
        width = len(data) // max(1, len(positions))
        with self._guard:
            buf = bytearray(self._fs.cat_file(path))
            for i, pos in enumerate(positions):
                if int(pos) + width > len(buf):
                    raise KafkaStorageError(f"{self.url(path)}: write_at {int(pos)} is past the end ({len(buf)})")
                buf[int(pos) : int(pos) + width] = data[i * width : (i + 1) * width]
            self._fs.pipe_file(path, bytes(buf))

    def truncate(self, path, size):
        with self._guard:
            data = self._fs.cat_file(path)
            self._fs.pipe_file(path, data[:size] + b"\0" * max(0, size - len(data)))

    def rename(self, src, dst):
        with self._guard:
            data = self._fs.cat_file(src)
            self._fs.pipe_file(dst, data)
            self._fs.rm_file(src)

    def delete(self, path, *, missing_ok=True):
        try:
            self._fs.rm_file(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def delete_dir(self, path):
        # one pass over the store (fsspec's rm checks each path it removes by a scan of the whole store)
        key = self._norm(path).rstrip("/")
        prefix = key + "/"
        store = self._fs.store
        for k in [k for k in store if k.startswith(prefix)]:
            store.pop(k, None)
        self._fs.pseudo_dirs[:] = [d for d in self._fs.pseudo_dirs if d != key and not d.startswith(prefix)]

    def mkdirs(self, path):
        self._fs.makedirs(path, exist_ok=True)

    def sync_dir(self, path):
        pass

    @contextlib.contextmanager
    def lock(self, path, *, timeout=None):
        key = self._norm(path)
        with _memory_locks_guard:
            lk = _memory_locks.setdefault(key, threading.Lock())
        if not lk.acquire(timeout=-1 if timeout is None else timeout):
            raise LogLockedError(f"{self.url(path)} is locked")
        try:
            yield
        finally:
            lk.release()
