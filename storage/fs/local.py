"""POSIX local disk, the filesystem Kafka's own log lives on.

It has append, atomic rename, exclusive create, locks and fsync, so logs on it use Kafka's own protocol
(appends under a partition lock, renames for swaps); memory.py is the same for tests, object stores are
in storage/objects/.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import shutil
import threading
import time
import uuid

from ..errors import KafkaStorageError, LogLockedError
from .filesystem import Appender, Capabilities, FileInfo, FileReader, FileVersion, LogFileSystem
from .mounts import check_lockable


def _os_errors(fn):
    """Decorates each local-disk method: its OSErrors become KafkaStorageError naming the file (ELOOP, EIO,
    EACCES, a directory where a file should be, ...). FileNotFoundError stays as it is: callers handle a
    file that vanished between a listing and an open as the expected race it is."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except (FileNotFoundError, FileExistsError, KafkaStorageError):
            raise
        except OSError as e:
            own = getattr(self, "path", getattr(self, "_path", None))  # a reader's or appender's file
            path = e.filename or own or (args[0] if args else "?")
            where = f" [{', '.join(str(a) for a in args)}]" if own is not None and args else ""
            raise KafkaStorageError(f"{fn.__name__.strip('_')} {path}{where}: {e.strerror or e}") from e

    return wrapper


class _LocalReader(FileReader):
    @_os_errors
    def __init__(self, fs, path: str):
        super().__init__(fs, path)
        self._fd = os.open(path, os.O_RDONLY)

    @_os_errors
    def size(self) -> int:
        return os.fstat(self._fd).st_size

    @_os_errors
    def read(self, start: int, end: int) -> bytes:
        if self._fd < 0:
            raise ValueError(f"reader of {self.path} is closed")
        data = os.pread(self._fd, max(0, end - start), start)
        while len(data) < end - start:  # short reads are legal; stop at the end of the file
            more = os.pread(self._fd, end - start - len(data), start + len(data))
            if not more:
                break
            data += more
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


DIRECT_BLOCK = 4096  # O_DIRECT alignment of file offsets, lengths and buffers (ext4/xfs on 512 or 4K sectors)
DIRECT_MIN_WRITE = 1 << 20  # a bulk appender writes at least this much at once past the page cache
_DIRECT_CHUNK = 4 << 20  # bytes per O_DIRECT write, through a page-aligned per-thread buffer
_direct_local = threading.local()


def _direct_buffer() -> memoryview:
    """This thread's page-aligned buffer for O_DIRECT writes (an anonymous mmap is page-aligned)."""
    buf = getattr(_direct_local, "buf", None)
    if buf is None:
        import mmap

        buf = _direct_local.buf = memoryview(mmap.mmap(-1, _DIRECT_CHUNK))
    return buf


class _LocalAppender(Appender):
    """O_APPEND writes. A bulk appender (a write-once staging segment) sends writes of DIRECT_MIN_WRITE
    or more around the page cache with O_DIRECT where the filesystem takes it: the whole 4 KiB blocks
    directly, the partial last block buffered. Filling page-cache pages costs more CPU than encoding
    the records did, and the fsync at the end then has little left to write."""

    def __init__(self, path: str, create: bool, bulk: bool = False):
        flags = (os.O_RDWR if bulk else os.O_WRONLY) | os.O_APPEND | (os.O_CREAT if create else 0)
        try:
            self._fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise KafkaStorageError(f"cannot open {path} for append: {e.strerror}") from e
        self._path = path
        self._size = os.fstat(self._fd).st_size
        self._unsynced = False  # bytes written or cut through this descriptor since its last fsync
        self._direct = bulk and bool(getattr(os, "O_DIRECT", 0)) and hasattr(os, "pwritev")
        self._direct_fd = -1

    @_os_errors
    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        if self._direct and view.nbytes >= DIRECT_MIN_WRITE and self._write_direct(view):
            return
        while view.nbytes:
            n = os.write(self._fd, view)
            view = view[n:]
            self._size += n
            self._unsynced = True

    def _write_direct(self, view: memoryview) -> bool:
        """Write view at the end of the file through O_DIRECT; False (nothing written) where the
        filesystem refuses it, and this appender stays buffered from then on."""
        if self._direct_fd < 0:
            try:
                self._direct_fd = os.open(self._path, os.O_WRONLY | os.O_DIRECT)
            except OSError:  # e.g. tmpfs: EINVAL
                self._direct = False
                return False
        start = self._size
        head = start % DIRECT_BLOCK
        first = start - head  # the block holding the end of the file is rewritten whole
        prefix = os.pread(self._fd, head, first) if head else b""
        if len(prefix) != head:
            raise KafkaStorageError(f"{self._path}: expected {start} bytes, found {first + len(prefix)}")
        whole = (head + view.nbytes) // DIRECT_BLOCK * DIRECT_BLOCK  # bytes from `first` in whole blocks
        buf = _direct_buffer()
        buf[:head] = prefix
        filled, taken, at = head, 0, first
        while at < first + whole:
            n = min(len(buf), first + whole - at) - filled
            buf[filled : filled + n] = view[taken : taken + n]
            taken += n
            filled += n
            try:
                written = os.pwritev(self._direct_fd, [buf[:filled]], at)
            except OSError as e:
                if e.errno == errno.EINVAL and at == first:  # alignment refused: nothing was written
                    self._direct = False
                    return False
                raise
            if written != filled:
                raise KafkaStorageError(f"{self._path}: short O_DIRECT write at {at}: {written} of {filled} bytes")
            at += filled
            filled = 0
            self._unsynced = True
        self._size = first + whole
        rest = view[taken:]
        while rest.nbytes:  # the partial last block, through the page cache (O_APPEND: at the new end)
            n = os.write(self._fd, rest)
            rest = rest[n:]
            self._size += n
        return True

    @_os_errors
    def flush(self, fsync: bool = True) -> None:
        if fsync and self._unsynced:  # one fsync per file that changed, however many flushes ask for it
            os.fsync(self._fd)
            self._unsynced = False

    @_os_errors
    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        self._size = size
        self._unsynced = True

    def close(self) -> None:
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    @property
    def size(self) -> int:
        return self._size


class LocalFileSystem(LogFileSystem):
    """POSIX local disk: O_APPEND writes, fsync, rename(2), O_EXCL and flock(2)."""

    capabilities = Capabilities(append=True, atomic_rename=True, exclusive_create=True, locks=True, fsync=True)
    protocol = "file"

    def exists(self, path):
        return os.path.exists(path)

    @_os_errors
    def isdir(self, path):
        return os.path.isdir(path)

    @_os_errors
    def listdir(self, path):
        try:
            with os.scandir(path) as it:
                out = []
                for e in it:
                    try:
                        if e.is_dir():  # from the listing's d_type: no stat for a directory (size 0)
                            out.append(FileInfo(e.name, 0, True))
                            continue
                        st = e.stat()
                    except FileNotFoundError:  # removed between listing and stat
                        continue
                    out.append(FileInfo(e.name, st.st_size, False))
                return out
        except FileNotFoundError:
            return []

    @_os_errors
    def size(self, path):
        return os.path.getsize(path)

    def file_version(self, path):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        return FileVersion(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @_os_errors
    def modified_times(self, path, names=None):
        wanted = None if names is None else set(names)
        out = {}
        try:
            with os.scandir(path) as it:
                for e in it:
                    if wanted is not None and e.name not in wanted:
                        continue
                    try:
                        if not e.is_dir():
                            out[e.name] = int(e.stat().st_mtime * 1000)
                    except FileNotFoundError:  # removed between listing and stat
                        pass
        except FileNotFoundError:
            pass
        return out

    @_os_errors
    def read(self, path, start=0, end=None):
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(-1 if end is None else max(0, end - start))

    @_os_errors
    def modified_ms(self, path):
        return int(os.stat(path).st_mtime * 1000)

    @_os_errors
    def open_reader(self, path):
        return _LocalReader(self, path)

    @_os_errors
    def touch(self, path):
        os.utime(path)

    @staticmethod
    def _temp_copy(path, data, durable: bool) -> str:
        """`data` in a new temp file beside `path` (fsynced if durable); returns its path."""
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        return tmp

    @_os_errors
    def write_atomic(self, path, data, *, durable=True):
        os.replace(self._temp_copy(path, data, durable), path)
        if durable:
            self.sync_dir(os.path.dirname(path) or ".")

    @_os_errors
    def create_exclusive(self, path, data, *, durable=True):
        """O_EXCL for an empty file; otherwise the bytes go to a temp file first and link(2) publishes it,
        which fails if the name exists: a reader never sees the file before all of its bytes."""
        if not len(data):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            except FileExistsError:
                return False
            return True
        tmp = self._temp_copy(path, data, durable)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def open_appender(self, path, *, create=True, bulk=False):
        return _LocalAppender(path, create, bulk)

    @_os_errors
    def write_at(self, path, positions, data, *, durable=True):
        width = len(data) // max(1, len(positions))
        fd = os.open(path, os.O_WRONLY)
        try:
            size = os.fstat(fd).st_size
            if len(positions) and int(max(positions)) + width > size:
                raise KafkaStorageError(f"{path}: write_at {int(max(positions))} is past the end ({size})")
            view = memoryview(data)
            for i, pos in enumerate(positions):  # one pwrite per batch header, not per record
                os.pwrite(fd, view[i * width : (i + 1) * width], int(pos))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    @_os_errors
    def truncate(self, path, size):
        os.truncate(path, size)

    @_os_errors
    def rename(self, src, dst):
        os.replace(src, dst)

    @_os_errors
    def delete(self, path, *, missing_ok=True):
        try:
            os.remove(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    @_os_errors
    def delete_dir(self, path):
        if os.path.isdir(path):
            shutil.rmtree(path)

    @_os_errors
    def mkdirs(self, path):
        os.makedirs(path, exist_ok=True)

    @_os_errors
    def sync_dir(self, path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def lock(self, path, *, timeout=None):
        check_lockable(path)  # a lock only some machines see would let two writers in
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if deadline is not None and time.monotonic() >= deadline:
                        raise LogLockedError(f"{path} is locked by another process") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)  # closing releases the flock
