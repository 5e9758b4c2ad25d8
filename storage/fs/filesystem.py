"""The filesystem seam: every byte the engine reads or writes goes through LogFileSystem.

Implementations declare what they can do (append, atomic rename, exclusive create, locks) so the
log code chooses a protocol by capability, never by URL scheme. Paths are '/'-separated strings.
The seam knows none of its implementations (local.py and memory.py here, storage/objects/); the
factory above them all, open_filesystem in storage/log_dirs.py, picks one for a URL.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import KafkaStorageError


@dataclass(frozen=True)
class Capabilities:
    append: bool  # bytes can be added to the end of an existing file
    atomic_rename: bool  # rename replaces the target in one step
    exclusive_create: bool  # create fails if the file exists (O_EXCL / If-None-Match)
    locks: bool  # advisory exclusive locks shared by every process that uses the store
    fsync: bool  # durability needs an explicit flush to stable storage
    cached_listings: bool = False  # listings are cached (see invalidate_listings): list a dir once, look up in it
    remote_reads: bool = False  # each read is a request: fetch each byte once rather than copy less


class FileVersion(NamedTuple):
    """What a file or directory looked like (LogFileSystem.file_version): any change to it changes one field.
    A NamedTuple: a stream trigger makes two per partition, so construction and comparison stay in C."""

    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


@dataclass(frozen=True)
class FileInfo:
    name: str  # base name within the listed directory
    size: int
    is_dir: bool


class Appender(abc.ABC):
    """An open file positioned at its end: write, flush (optionally to stable storage), truncate."""

    @abc.abstractmethod
    def write(self, data) -> None: ...

    @abc.abstractmethod
    def flush(self, fsync: bool = True) -> None: ...

    @abc.abstractmethod
    def truncate(self, size: int) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def size(self) -> int: ...


class FileReader:
    """Reads of one file. The default reads by path; local disk holds the file open, so a reader keeps
    the bytes it started with when a cleaner swap or retention renames the name away (as Kafka's
    open FileChannels do)."""

    def __init__(self, fs: LogFileSystem, path: str):
        self.fs, self.path = fs, path

    def size(self) -> int:
        return self.fs.size(self.path)

    def read(self, start: int, end: int) -> bytes:
        return self.fs.read(self.path, start, end)

    def close(self) -> None:
        pass


class LogFileSystem(abc.ABC):
    """What the log engine needs from storage. Subclasses map it to a concrete store."""

    capabilities: Capabilities
    protocol: str = "file"

    # -- names
    @staticmethod
    def join(*parts: str) -> str:
        if len(parts) == 2:  # the common case, without the generator (several calls per partition per trigger)
            a, b = parts
            if a and b and a[-1] != "/" and b[0] != "/" and b[-1] != "/":
                return a + "/" + b
        return "/".join(p.rstrip("/") if i == 0 else p.strip("/") for i, p in enumerate(parts) if p != "")

    @staticmethod
    def basename(path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    @staticmethod
    def dirname(path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[0] if "/" in path.rstrip("/") else ""

    def url(self, path: str) -> str:
        """How a path is shown to people (error messages, CLI output)."""
        return path

    # -- reads
    @abc.abstractmethod
    def exists(self, path: str) -> bool: ...
    @abc.abstractmethod
    def isdir(self, path: str) -> bool: ...
    @abc.abstractmethod
    def listdir(self, path: str) -> list[FileInfo]: ...
    @abc.abstractmethod
    def size(self, path: str) -> int: ...
    @abc.abstractmethod
    def read(self, path: str, start: int = 0, end: int | None = None) -> bytes: ...
    @abc.abstractmethod
    def modified_ms(self, path: str) -> int: ...

    # -- writes
    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes, *, durable: bool = True) -> None: ...
    @abc.abstractmethod
    def create_exclusive(self, path: str, data: bytes | bytearray | memoryview, *, durable: bool = True) -> bool: ...
    # durable=False: the caller syncs the directory itself (empty files have no data to flush)
    @abc.abstractmethod
    def open_appender(self, path: str, *, create: bool = True, bulk: bool = False) -> Appender: ...
    # bulk: a write-once file written in big pieces (a staging segment); may bypass the OS cache
    @abc.abstractmethod
    def truncate(self, path: str, size: int) -> None: ...
    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None: ...
    @abc.abstractmethod
    def delete(self, path: str, *, missing_ok: bool = True) -> None: ...
    @abc.abstractmethod
    def delete_dir(self, path: str) -> None: ...
    @abc.abstractmethod
    def mkdirs(self, path: str) -> None: ...
    @abc.abstractmethod
    def sync_dir(self, path: str) -> None: ...
    @abc.abstractmethod
    def touch(self, path: str) -> None: ...

    def open_reader(self, path: str) -> FileReader:
        """A reader of the file now at path (FileNotFoundError if there is none)."""
        if not self.exists(path):
            raise FileNotFoundError(path)
        return FileReader(self, path)

    def write_at(self, path: str, positions, data: bytes, *, durable: bool = True) -> None:
        """Overwrite len(data) // len(positions) bytes at each position of an existing file, in place
        (the sink patches baseOffset fields of staged segments). Stores without in-place writes refuse."""
        raise KafkaStorageError(f"{self.url(path)}: this filesystem cannot overwrite bytes in place")

    def file_version(self, path: str) -> FileVersion | None:
        """The file's or directory's version now, where the store has a cheap one (local disk: a stat);
        None when it has not, or the path is gone. Callers compare versions to skip rereading."""
        return None

    def invalidate_listings(self, path: str | None = None) -> None:  # noqa: B027 (a no-op hook, not abstract)
        """Forget cached listings of path (all, when None) on stores that cache them; a no-op here."""

    def copy(self, src: str, dst: str) -> None:
        """Make dst a copy of src, appearing whole (FileNotFoundError when src is gone). Object stores
        copy server-side."""
        self.write_atomic(dst, self.read(src), durable=False)

    def delete_many(self, paths: list[str]) -> None:
        """Delete files (missing ones are fine); object stores batch the requests."""
        for p in paths:
            self.delete(p)

    def modified_times(self, path: str, names=None) -> dict[str, int]:
        """{name: modification time in ms} of the files directly under `path` (those in `names` when
        given; one fresh LIST on object stores). Files removed meanwhile are left out."""
        if names is None:
            names = [f.name for f in self.listdir(path) if not f.is_dir]
        out = {}
        for name in names:
            try:
                out[name] = self.modified_ms(self.join(path, name))
            except FileNotFoundError:
                pass
        return out

    def same_object(self, a: str, b: str) -> bool:
        """Whether two files hold the same bytes (False when either is gone). Object stores compare
        plain MD5 ETags where both have one."""
        try:
            return self.size(a) == self.size(b) and self.read(a) == self.read(b)
        except FileNotFoundError:
            return False

    # -- coordination
    @abc.abstractmethod
    def lock(self, path: str, *, timeout: float | None = None) -> contextlib.AbstractContextManager: ...


def iter_files(fs: LogFileSystem, path: str) -> Iterator[FileInfo]:
    """Files (not directories) directly under `path`."""
    return (f for f in fs.listdir(path) if not f.is_dir)
