"""The log filesystem over an object store (S3, GCS, Azure Blob via fsspec): immutable objects, no append,
no atomic rename, no locks; create-only writes (If-None-Match: *) are the one coordination primitive.

Directories do not exist: a "dir" is a key prefix that some object has. Listings are cached per
instance (see ObjectStoreFileSystem) so a query that lists a partition many times pays one LIST.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import fsspec
import fsspec.asyn
from fsspec.core import url_to_fs

from ..errors import KafkaStorageError
from ..fs.filesystem import Appender, Capabilities, FileInfo
from ..fs.storage_options import redact_text, redact_url, safe_repr
from .object_reader import PinnedObjectReader, VersionedObjectStore, error_code, plain_md5_etag, process_create_lock

# How long a listing may be served from the cache (seconds). None: until this instance writes under it.
DEFAULT_LISTING_TTL = 5.0
_CONFLICT_RETRIES = 6  # S3 answers 409 ConditionalRequestConflict while another conditional write is in flight


@dataclass(frozen=True)
class _Backend:
    """What one fsspec implementation can do beyond plain GET/PUT/LIST/DELETE."""

    atomic_create: bool  # pipe_file(mode="create") is one conditional request the store decides
    touch_existing: str | None  # "copy": server-side copy onto itself; "rewrite": read and write back
    process_local: bool = False  # the store lives in this process (create is made atomic with a lock)
    one_list: bool = False  # list with s3fs's _lsdir: ls() of an empty prefix also LISTs the parent


_BACKENDS = {
    # s3fs >= 2024.12: PutObject / CompleteMultipartUpload with IfNoneMatch="*", 412 -> FileExistsError
    "s3": _Backend(atomic_create=True, touch_existing="copy", one_list=True),
    "s3a": _Backend(atomic_create=True, touch_existing="copy", one_list=True),
    # gcsfs: ifGenerationMatch=0 (upstream calls it experimental); adlfs: upload_blob(overwrite=False)
    "gs": _Backend(atomic_create=True, touch_existing=None),
    "gcs": _Backend(atomic_create=True, touch_existing=None),
    "abfs": _Backend(atomic_create=True, touch_existing=None),
    "abfss": _Backend(atomic_create=True, touch_existing=None),
    "az": _Backend(atomic_create=True, touch_existing=None),
    "memory": _Backend(atomic_create=True, touch_existing="rewrite", process_local=True),
}
_UNKNOWN = _Backend(atomic_create=False, touch_existing=None)


def _protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    p = fs.protocol
    return p[0] if isinstance(p, (tuple, list)) else p


class ObjectStoreFileSystem(VersionedObjectStore):
    """LogFileSystem over any fsspec AbstractFileSystem that behaves like an object store.

    - read(path, start, end) is one ranged GET; no whole-object reads for ranges, no read-ahead.
    - write_atomic is one PUT (a multipart upload is also all-or-nothing on S3).
    - create_exclusive is one conditional PUT (If-None-Match: *); False when the object exists.
    - rename is copy + delete: dst appears atomically, but src and dst coexist until the delete
      (capabilities.atomic_rename is False). No append, truncate, in-place writes or locks.
    - Listing cache: listdir(dir) results (and exists/isdir answered from them) are kept per
      instance for `listing_ttl` seconds (None: until invalidated). This instance's own writes and
      deletes drop the cached listings of every dir above the object; other writers' objects show up
      after the TTL or invalidate_listings(). Reads, sizes and times are never cached.
    """

    protocol = "s3"

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        *,
        storage_options: dict | None = None,
        listing_ttl: float | None = DEFAULT_LISTING_TTL,
        atomic_create: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fsspec_fs = fs
        self.protocol = _protocol_of(fs)
        backend = _BACKENDS.get(self.protocol, _UNKNOWN)
        if atomic_create is not None:
            backend = _Backend(atomic_create, backend.touch_existing, backend.process_local, backend.one_list)
        self._backend = backend
        self.process_local = backend.process_local
        self.capabilities = Capabilities(
            append=False,
            atomic_rename=False,
            exclusive_create=backend.atomic_create,
            locks=False,
            fsync=False,
            cached_listings=True,
            remote_reads=True,
        )
        self._options = dict(storage_options or {})  # only to scrub secrets out of backend messages
        self._ttl = listing_ttl
        self._clock = clock
        self._listings: dict[str, tuple[float, list[FileInfo]]] = {}
        self._versions: dict[str, Any] = {}  # object key -> its version when last listed (see open_reader)
        self._cache_guard = threading.Lock()

    @classmethod
    def from_url(cls, url: str, storage_options: dict | None = None, **kwargs) -> tuple[ObjectStoreFileSystem, str]:
        """(filesystem, path) for an fsspec URL such as s3://bucket/prefix, with fsspec storage options."""
        opts = dict(storage_options or {})
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        if protocol in _BACKENDS and protocol != "memory":
            opts.setdefault("use_listings_cache", False)  # one listing cache, ours, with known invalidation
        shown = redact_text(url, opts)
        try:
            fs, path = url_to_fs(url, **opts)
        except ImportError as e:
            hint = " (pip install 'kafkalog-ds[s3]')" if protocol in ("s3", "s3a") else ""
            raise KafkaStorageError(
                f"log dir {shown}: filesystem {protocol!r} needs a package that is not "
                f"installed: {redact_text(str(e), opts)}{hint}"
            ) from None
        except (ValueError, TypeError, OSError) as e:  # OSError: e.g. hdfs:// without libjvm / libhdfs
            raise KafkaStorageError(
                f"log dir {shown}: cannot open filesystem {protocol!r} with storage options "
                f"{safe_repr(opts)}: {_first_line(redact_text(str(e), opts))}"
            ) from None
        return cls(fs, storage_options=opts, **kwargs), path.rstrip("/")

    def __repr__(self):
        return f"ObjectStoreFileSystem({self.protocol!r}, {self.capabilities})"

    def __reduce__(self):  # ships to Spark executors without the cache or its lock
        return (_restore, (self.fsspec_fs, self._options, self._ttl, self._backend.atomic_create))

    # ------------------------------------------------------------------ names and errors

    def key(self, path: str) -> str:
        """The object key (or key prefix) a path names."""
        return self.fsspec_fs._strip_protocol(path).rstrip("/")

    def url(self, path: str) -> str:
        return redact_text(redact_url(f"{self.protocol}://{self.key(path)}"), self._options)

    @contextlib.contextmanager
    def failures(self, op: str, path: str, *, keep: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        """Backend failures inside become errors naming the object, never a credential: FileNotFoundError
        for a missing object, KafkaStorageError for anything else (a missing bucket too: s3fs raises the same
        FileNotFoundError for it as for a missing key, and only the S3 error code behind it tells them apart).
        KafkaStorageError (which already names its object) and the types in `keep` pass unchanged."""
        try:
            yield
        except KafkaStorageError:
            raise
        except keep:
            raise
        except Exception as e:
            err, cause = self._failure(op, path, e)
            raise err from cause

    def _failure(self, op: str, path: str, exc: BaseException) -> tuple[BaseException, BaseException | None]:
        """The error to raise for a failed backend call, and the cause to chain it to: none when the
        backend's message held a secret, so that message is never shown."""
        raw = str(exc) or type(exc).__name__
        text = redact_text(raw, self._options)
        err: BaseException
        if isinstance(exc, FileNotFoundError) and error_code(exc) == "NoSuchBucket":
            bucket = self.key(path).split("/", 1)[0]
            err = KafkaStorageError(f"bucket {bucket!r} does not exist ({self.url(path)}): create it first")
        elif isinstance(exc, FileNotFoundError):
            err = FileNotFoundError(errno.ENOENT, f"{op}: not found", self.url(path))
        else:
            err = KafkaStorageError(f"{self.url(path)}: {op} failed: {text}")
        return err, (exc if text == raw else None)

    # ------------------------------------------------------------------ listing cache

    def _cached(self, dir_key: str) -> list[FileInfo] | None:
        if self._ttl is not None and self._ttl <= 0:
            return None
        with self._cache_guard:
            hit = self._listings.get(dir_key)
        if hit is None:
            return None
        stamp, entries = hit
        if self._ttl is not None and self._clock() - stamp >= self._ttl:
            return None
        return entries

    def invalidate_listings(self, path: str | None = None) -> None:
        """Forget cached listings: all of them, or those of `path` and the dirs below it. The dirs above keep
        theirs (this instance's own writes drop those, see _wrote): a maintenance pass refreshes every
        partition's listing, and must not list the whole log dir again for each one."""
        with self._cache_guard:
            if path is None:
                self._listings.clear()
                return
            key = self.key(path)
            below = key + "/"
            for k in [k for k in self._listings if k == key or k.startswith(below)]:
                del self._listings[k]

    def _forget_parents(self, key: str) -> None:
        while True:
            parent = self.dirname(key)
            self._listings.pop(parent, None)
            if not parent or parent == key:
                return
            key = parent

    def _wrote(self, path: str) -> None:
        with self._cache_guard:
            self._versions.pop(self.key(path), None)  # our own write: the listed version is not current
            self._forget_parents(self.key(path))

    # ------------------------------------------------------------------ reads

    def listdir(self, path):
        key = self.key(path)
        hit = self._cached(key)
        if hit is not None:
            return list(hit)
        try:
            with self.failures("list", path):
                lsdir = getattr(self.fsspec_fs, "_lsdir", None) if self._backend.one_list else None
                if lsdir is not None:  # one paginated LIST with delimiter '/', whatever the prefix holds
                    entries = fsspec.asyn.sync(self.fsspec_fs.loop, lsdir, key, refresh=True)
                else:
                    entries = self._ls(key)
        except FileNotFoundError:
            entries = []
        out = []
        store = getattr(self.fsspec_fs, "store", None) if self.process_local else None
        versions = {}
        for entry in entries:
            name = self.fsspec_fs._strip_protocol(entry["name"]).rstrip("/")
            if name == key:  # the object itself (a file, or a zero-byte "dir marker")
                continue
            out.append(FileInfo(self.basename(name), int(entry.get("size") or 0), entry.get("type") == "directory"))
            if store is not None:
                obj = store.get(name)
                if obj is not None:
                    versions[name] = ((obj, None), len(obj.getbuffer()))
            elif self.protocol in ("s3", "s3a") and entry.get("ETag"):
                versions[name] = (entry["ETag"], int(entry.get("size") or 0))
        with self._cache_guard:  # the version each listed object had: readers opened from it read that one
            self._versions.update(versions)
        if self._ttl is None or self._ttl > 0:
            with self._cache_guard:
                self._listings[key] = (self._clock(), out)
        return list(out)

    def _ls(self, key: str) -> list[dict]:
        """fsspec ls with details. The process-local memory store walks a dict that other threads change:
        an object deleted mid-walk makes it fail, so it is walked again (a real store's LIST is one request)."""
        for attempt in range(20):
            try:
                return self.fsspec_fs.ls(key, detail=True, refresh=True)
            except (KeyError, RuntimeError):
                if not self.process_local or attempt == 19:
                    raise
        return []  # not reached

    def _from_parent_listing(self, path: str) -> FileInfo | None | Literal[False]:
        """The cached parent listing's entry for path, None if absent there, False if nothing is cached."""
        key = self.key(path)
        parent = self.dirname(key)
        hit = self._cached(parent) if parent and parent != key else None
        if hit is None:
            return False
        name = self.basename(key)
        return next((e for e in hit if e.name == name), None)

    def exists(self, path):
        entry = self._from_parent_listing(path)
        if entry is not False:
            return entry is not None
        with self.failures("exists", path):
            return bool(self.fsspec_fs.exists(self.key(path)))

    def isdir(self, path):
        entry = self._from_parent_listing(path)
        if entry is not False:
            return entry is not None and entry.is_dir
        with self.failures("isdir", path):
            return bool(self.fsspec_fs.isdir(self.key(path)))

    def head(self, path: str, op: str) -> dict:
        """The object's metadata (one HEAD), for operation `op`; FileNotFoundError when there is no
        object (a prefix is none)."""
        with self.failures(op, path):
            info = self.fsspec_fs.info(self.key(path))
        if info.get("type") == "directory":
            err, cause = self._failure(op, path, FileNotFoundError(path))
            raise err from cause
        return info

    def size(self, path):
        return int(self.head(path, "size")["size"])

    def read(self, path, start=0, end=None):
        """Bytes [start, end) of an object with one ranged GET (an empty range makes no request)."""
        start = int(start)
        if start < 0 or (end is not None and int(end) < 0):
            raise KafkaStorageError(f"{self.url(path)}: read range [{start}, {end}) is negative")
        if end is not None and int(end) <= start:
            return b""  # an inverted Range header is ignored by S3, which would send the whole object
        with self.failures(f"read [{start}, {end})", path):
            try:
                data = self.fsspec_fs.cat_file(self.key(path), start=start, end=None if end is None else int(end))
            except Exception as e:
                if error_code(e) != "InvalidRange":
                    raise
                return b""  # 416: start is at or past the end
        if end is not None and len(data) > int(end) - start:  # a store that ignored Range: keep the contract
            data = data[: int(end) - start]
        return bytes(data)

    def modified_ms(self, path):
        info = self.head(path, "modified_ms")
        stamp = info.get("LastModified") or info.get("mtime") or info.get("last_modified")
        if stamp is None:
            with self.failures("modified_ms", path):
                stamp = self.fsspec_fs.modified(self.key(path))
        if hasattr(stamp, "timestamp"):
            return int(stamp.timestamp() * 1000)
        return int(float(stamp) * 1000)

    def open_reader(self, path):
        """A reader pinned to the object version it first sees (see PinnedObjectReader)."""
        if not self.exists(path):
            raise FileNotFoundError(errno.ENOENT, "open: not found", self.url(path))
        with self._cache_guard:
            tag, size = self._versions.get(self.key(path), (None, None))
        return PinnedObjectReader(self, path, tag, size)

    def modified_times(self, path, names=None) -> dict[str, int]:
        """{name: modification time in ms} of the objects directly under `path` (those in `names` when
        given), from one fresh LIST."""
        key = self.key(path)
        try:
            with self.failures("list", path):
                entries = self._ls(key)
        except FileNotFoundError:
            return {}
        out = {}
        for entry in entries:
            if entry.get("type") == "directory":
                continue
            stamp = (
                entry.get("LastModified") or entry.get("mtime") or entry.get("last_modified") or entry.get("created")
            )
            if stamp is None:
                continue
            out[self.basename(self.fsspec_fs._strip_protocol(entry["name"]))] = (
                int(stamp.timestamp() * 1000) if hasattr(stamp, "timestamp") else int(float(stamp) * 1000)
            )
        if names is not None:
            wanted = set(names)
            out = {n: t for n, t in out.items() if n in wanted}
        return out

    def same_object(self, a, b) -> bool:
        """Whether two objects hold the same bytes: sizes, then plain MD5 ETags when both have one
        (two HEADs), else the bytes."""
        try:
            ia, ib = self.fsspec_fs.info(self.key(a)), self.fsspec_fs.info(self.key(b))
            if int(ia.get("size") or 0) != int(ib.get("size") or 0):
                return False
            ta, tb = plain_md5_etag(ia.get("ETag") or ia.get("etag")), plain_md5_etag(ib.get("ETag") or ib.get("etag"))
            if ta is not None and tb is not None:
                return ta == tb
            return self.read(a) == self.read(b)
        except FileNotFoundError:
            return False

    def delete_many(self, paths) -> None:
        """Delete objects (missing ones are fine) with batched requests (S3: DeleteObjects, 1000 a call)."""
        keys = [self.key(p) for p in paths]
        if not keys:
            return
        try:
            with self.failures(f"delete of {len(keys)} objects", paths[0]):
                if len(keys) == 1:
                    self.fsspec_fs.rm_file(keys[0])
                else:
                    self.fsspec_fs.rm(keys)
        except FileNotFoundError:
            for k in keys:  # a backend that refuses a batch with a missing key: one by one
                self.delete(k)
        finally:
            for p in paths:
                self._wrote(p)

    def copy(self, src, dst) -> None:
        """Server-side copy (S3 CopyObject): dst appears whole, with a fresh modification time.
        S3: one CopyObject, no HEAD first (segment objects are < 2 GiB, far below its 5 GB limit)."""
        try:
            with self.failures(f"copy to {self.url(dst)}", src):
                basic = getattr(self.fsspec_fs, "_copy_basic", None) if self.protocol in ("s3", "s3a") else None
                if basic is not None:
                    try:
                        fsspec.asyn.sync(self.fsspec_fs.loop, basic, self.key(src), self.key(dst))
                        return
                    except FileNotFoundError:
                        raise
                    except Exception as e:  # e.g. larger than a single CopyObject takes: the managed copy
                        if error_code(e) in ("NoSuchKey", "404"):
                            raise FileNotFoundError(src) from None
                self.fsspec_fs.cp_file(self.key(src), self.key(dst))
        finally:
            self._wrote(dst)

    # ------------------------------------------------------------------ writes

    def write_atomic(self, path, data, *, durable=True):
        """Replace the object with one PUT: readers see the old or the new bytes, never a mix."""
        try:
            with self.failures("write", path):
                self.fsspec_fs.pipe_file(self.key(path), bytes(data))
        finally:
            self._wrote(path)

    def create_exclusive(self, path, data, *, durable=True):
        """Create the object only if absent (If-None-Match: *): True if this call's bytes are there now.

        False when another writer's object holds the name. An existing object with exactly these bytes
        counts as ours: a PUT retried after a lost response sees 412 for its own first attempt, so
        payloads that must not be confused (lock owners, commits) carry a writer id.
        """
        if not self._backend.atomic_create:
            raise KafkaStorageError(
                f"{self.url(path)}: this filesystem ({self.protocol}) has no atomic "
                f"create-only write (capabilities.exclusive_create is False)"
            )
        data = bytes(data)
        try:
            for attempt in range(_CONFLICT_RETRIES):
                created = self._put_if_absent(path, data, retry=attempt + 1 < _CONFLICT_RETRIES)
                if created is not None:
                    return created or self._holds(path, data)
                time.sleep(0.05 * 2**attempt)
            return False  # not reached: the last attempt returns or raises
        finally:
            self._wrote(path)

    def _put_if_absent(self, path: str, data: bytes, *, retry: bool) -> bool | None:
        """One create-only PUT: True when it made the object, False when the name is taken, None when
        another conditional write was in flight (S3 409 ConditionalRequestConflict) and `retry` allows
        another attempt."""
        key = self.key(path)
        with self.failures("create", path):
            try:
                if self.process_local:  # fsspec's memory store checks then sets: make that one step
                    with process_create_lock:
                        self.fsspec_fs.pipe_file(key, data, mode="create")
                else:
                    self.fsspec_fs.pipe_file(key, data, mode="create")
                return True
            except FileExistsError:
                return False
            except Exception as e:
                code = error_code(e)
                if code == "PreconditionFailed":  # a 412 translated without its Condition
                    return False
                if code == "ConditionalRequestConflict" and retry:
                    return None
                raise

    def _holds(self, path: str, data: bytes) -> bool:
        """Whether the existing object is byte-identical to data (ETag = MD5 for single-part PUTs)."""
        try:
            with self.failures("create (checking the existing object)", path):
                info = self.fsspec_fs.info(self.key(path))
        except FileNotFoundError:
            return False  # deleted again meanwhile: it was another writer's
        if int(info.get("size") or 0) != len(data):
            return False
        etag = plain_md5_etag(info.get("ETag") or info.get("etag"))
        if etag is not None:
            return etag == hashlib.md5(data, usedforsecurity=False).hexdigest()
        return self.read(path, 0, len(data)) == data

    def delete(self, path, *, missing_ok=True):
        try:
            with self.failures("delete", path):
                if not missing_ok and not self.fsspec_fs.exists(self.key(path)):  # S3 "deletes" a missing key
                    raise FileNotFoundError(path)
                self.fsspec_fs.rm_file(self.key(path))
        except FileNotFoundError:
            if not missing_ok:
                raise
        finally:
            self._wrote(path)

    def delete_dir(self, path):
        """Delete every object under the prefix `path/` (batched DeleteObjects); checks none is left."""
        key = self.key(path)
        try:
            with self.failures("delete_dir", path):
                try:
                    keys = self._keys_below(key)
                except FileNotFoundError:
                    keys = []
                if keys:
                    self.fsspec_fs.rm(keys)
                left = self._keys_below(key)
        except FileNotFoundError:
            left = []
        finally:
            self.invalidate_listings(path)
            self._wrote(path)  # the prefix is gone from the listings above it too
        if left:
            raise KafkaStorageError(f"{self.url(path)}: delete_dir left {len(left)} objects, e.g. {self.url(left[0])}")

    def _keys_below(self, key: str) -> list[str]:
        """Every object key under the prefix `key/`."""
        below = key + "/"
        return [
            k for k in self.fsspec_fs.find(key, withdirs=False) if self.fsspec_fs._strip_protocol(k).startswith(below)
        ]

    def rename(self, src, dst):
        """Copy then delete (not atomic: after a crash both names may exist; dst itself appears whole)."""
        try:
            with self.failures(f"rename to {self.url(dst)}", src):
                self.fsspec_fs.cp_file(self.key(src), self.key(dst))
        finally:
            self._wrote(dst)
        self.delete(src)

    def touch(self, path):
        """Make an existing object's modification time now (FileNotFoundError if there is none).

        S3: a server-side copy onto itself (no bytes move). Stores without such a copy refuse: the
        engine keeps times it needs inside the data (e.g. delete horizons in batches), not in mtimes.
        """
        key = self.key(path)
        try:
            with self.failures("touch", path):
                if not self.fsspec_fs.exists(key):
                    raise FileNotFoundError(key)
                if self._backend.touch_existing == "copy":
                    self.fsspec_fs.cp_file(key, key, MetadataDirective="REPLACE")
                elif self._backend.touch_existing == "rewrite":
                    self.fsspec_fs.pipe_file(key, self.fsspec_fs.cat_file(key))
                else:
                    raise KafkaStorageError(
                        f"{self.url(path)}: cannot set the modification time of an existing object on {self.protocol}"
                    )
        finally:
            self._wrote(path)

    def mkdirs(self, path):
        """No-op: a prefix exists once an object is written under it."""

    def sync_dir(self, path):
        """No-op: a completed PUT is durable and visible."""

    def open_appender(self, path, *, create=True, bulk=False) -> Appender:
        raise KafkaStorageError(
            f"{self.url(path)}: cannot append: the object store has no append "
            f"(capabilities.append is False); write a new object instead"
        )

    def truncate(self, path, size):
        raise KafkaStorageError(
            f"{self.url(path)}: cannot truncate to {size} bytes: objects are immutable "
            f"on an object store (capabilities.append is False)"
        )

    def lock(self, path, *, timeout=None) -> contextlib.AbstractContextManager:
        """Object stores have no locks (capabilities.locks is False): this raises.

        A lease object with an expiry gives no mutual exclusion without fencing (a paused holder
        outlives its lease), so writers coordinate with create_exclusive on the names they publish.
        """
        raise KafkaStorageError(
            f"{self.url(path)}: cannot lock: the object store has no locks "
            f"(capabilities.locks is False); coordinate with create-only writes"
        )


def _restore(fs, options, ttl, atomic_create):
    return ObjectStoreFileSystem(fs, storage_options=options, listing_ttl=ttl, atomic_create=atomic_create)


def open_object_store(url: str, storage_options: dict | None = None, **kwargs) -> tuple[ObjectStoreFileSystem, str]:
    """open_filesystem's branch for fsspec URLs other than local paths and memory://."""
    return ObjectStoreFileSystem.from_url(url, storage_options, **kwargs)


def _first_line(text: str) -> str:
    """A backend error's first line, cut short (libhdfs lists every path it tried to load the JVM from)."""
    return (text.splitlines() or [""])[0][:300]
