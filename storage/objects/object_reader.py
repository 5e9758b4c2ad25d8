"""Reads of one object version on an object store: what a local file descriptor gives a reader for free.

Below storage/objects/object_store.py, which opens these readers: what a reader needs of its store is
VersionedObjectStore here, and ObjectStoreFileSystem there is the one implementation.

A reader pins the version it listed (or first reads) and reads only that one, so a segment the
maintenance job replaces or removes mid-read is read on from its `.deleted` twin, or fails with an
error naming it, never with other bytes (storage/segment_swap.py keeps the twins).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import threading
from typing import Any

import fsspec
import fsspec.asyn

from ..errors import CorruptRecordError
from ..fs.filesystem import FileReader, LogFileSystem
from ..topic_partition import DELETED_FILE_SUFFIX, SWAP_FILE_SUFFIX

# fsspec's memory store checks then sets on create: object_store makes that one step under this lock,
# and pinned reads take it to see one version of an object
process_create_lock = threading.Lock()


def error_code(exc: BaseException) -> str | None:
    """The S3-style error code behind an fsspec exception (botocore ClientError in the cause chain)."""
    cur: BaseException | None = exc
    seen = 0
    while cur is not None and seen < 5:
        resp = getattr(cur, "response", None)
        if isinstance(resp, dict) and isinstance(resp.get("Error"), dict):
            return resp["Error"].get("Code")
        cur, seen = cur.__cause__ or cur.__context__, seen + 1
    return None


def plain_md5_etag(etag: Any) -> str | None:
    """The ETag as a lowercase hex MD5 when it is one (a single-part upload's), else None."""
    tag = str(etag or "").strip('"').lower()
    return tag if len(tag) == 32 and all(c in "0123456789abcdef" for c in tag) else None


class VersionedObjectStore(LogFileSystem):
    """What a pinned reader needs of its object store beyond LogFileSystem: the fsspec filesystem and the
    object keys in it, and backend failures as errors naming the object. ObjectStoreFileSystem
    (object_store.py) implements it; it opens the readers, so it is declared here, below it."""

    fsspec_fs: fsspec.AbstractFileSystem  # the store the objects are reached through
    process_local: bool  # fsspec's memory store in this process: an object's version is its MemoryFile

    @abc.abstractmethod
    def key(self, path: str) -> str:
        """The object key a path names."""

    @abc.abstractmethod
    def head(self, path: str, op: str) -> dict:
        """The object's metadata (one HEAD) for operation `op`; FileNotFoundError when there is none."""

    @abc.abstractmethod
    def failures(
        self, op: str, path: str, *, keep: tuple[type[BaseException], ...] = ()
    ) -> contextlib.AbstractContextManager[None]:
        """Backend failures inside become errors naming the object; the types in `keep` pass unchanged."""


def _memory_object(fs: VersionedObjectStore, key: str) -> Any:
    """The MemoryFile now under `key` in a process-local store (None if there is none): its version."""
    with process_create_lock:
        return getattr(fs.fsspec_fs, "store", {}).get(key)


def pinned_get(fs: VersionedObjectStore, path: str, start: int, end: int, tag) -> tuple[bytes, Any]:
    """Bytes [start, end) of the object if it is still version `tag` (None: any), and its version.
    Raises _ObjectChanged when the object is another version or gone."""
    key = fs.key(path)
    if end <= start:
        return b"", tag
    if fs.process_local:  # fsspec's memory store: a version is a MemoryFile object
        obj = _memory_object(fs, key)
        if obj is None:
            raise _ObjectChanged(path)
        if tag is not None and obj is not tag[0]:
            raise _ObjectChanged(path)
        return bytes(obj.getbuffer()[start:end]), (obj, None)
    if fs.protocol in ("s3", "s3a"):
        s3 = fs.fsspec_fs
        bucket, obj_key, _ = s3.split_path(key)
        kw = {"IfMatch": tag} if tag is not None else {}

        async def get():
            resp = await s3._call_s3("get_object", Bucket=bucket, Key=obj_key, Range=f"bytes={start}-{end - 1}", **kw)
            try:
                return await resp["Body"].read(), resp.get("ETag")
            finally:
                resp["Body"].close()

        with fs.failures(f"read [{start}, {end})", path, keep=(_ObjectChanged,)):
            try:
                return fsspec.asyn.sync(s3.loop, get)
            except FileNotFoundError as e:
                if error_code(e) == "NoSuchBucket":  # not a replaced object: fs.failures names the bucket
                    raise
                raise _ObjectChanged(path) from None
            except Exception as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "NoSuchKey", "404"):
                    raise _ObjectChanged(path) from None
                if code == "InvalidRange":
                    return b"", tag
                raise
    # other stores: the read, then a HEAD to check the version did not change under it
    data = fs.read(path, start, end)
    try:
        info = fs.fsspec_fs.info(key)
    except FileNotFoundError:
        raise _ObjectChanged(path) from None
    now = (info.get("ETag") or info.get("etag") or info.get("generation"), info.get("size"))
    if tag is not None and now != tag:
        raise _ObjectChanged(path)
    return data, now


class _ObjectChanged(Exception):
    """The object a pinned read asked for is gone or is another version now."""


class PinnedObjectReader(FileReader):
    """Reads of one object version, as a local file descriptor keeps the file it opened.

    The first read pins the version it gets (S3: the ETag of that ranged GET; later reads send
    If-Match, so a replaced object answers 412 instead of other bytes). When the name has been
    replaced or removed since, reads go on from its `.deleted` twin (the copy the maintenance job
    keeps for file.delete.delay.ms) if that holds the pinned version; otherwise they fail with an
    error naming the object, never with other bytes. No request is added to the reads themselves.
    """

    fs: VersionedObjectStore

    def __init__(self, fs: VersionedObjectStore, path: str, version=None, size: int | None = None):
        super().__init__(fs, path)
        self._at = path  # the name reads go to: the path, or its .deleted twin
        self._tag: Any = version  # the pinned version: the one the last listing showed, else the first one read
        self._size = size if version is not None else None
        self._twin_tag: Any = None  # the version of the twin read from, once reads moved there

    def size(self) -> int:
        """The pinned version's size (no request when the listing gave it)."""
        return self._size if self._size is not None else self._pin_by_info()

    def _pin_by_info(self) -> int:
        """The current version's size (one HEAD); pins that version unless one is pinned already (then a
        different current version reads as missing, so the caller looks for the twin)."""
        fs = self.fs
        pinned = self._tag
        if fs.process_local:
            obj = _memory_object(fs, fs.key(self._at))
            if obj is None or (pinned is not None and obj is not pinned[0]):
                raise FileNotFoundError(errno.ENOENT, "open: not found (or replaced)", fs.url(self._at))
            self._tag, self._size = (obj, None), len(obj.getbuffer())
            return self._size
        info = fs.head(self._at, "size")
        tag = info.get("ETag") or info.get("etag")
        if fs.protocol not in ("s3", "s3a"):
            tag = (tag or info.get("generation"), info.get("size"))
        if pinned is not None and tag != pinned:
            raise FileNotFoundError(errno.ENOENT, "open: replaced since it was listed", fs.url(self._at))
        self._tag, self._size = tag, int(info["size"])
        return self._size

    def read(self, start: int, end: int) -> bytes:
        end = int(end) if self._size is None else min(int(end), self._size)
        try:
            tag_now = self._tag if self._at == self.path else self._twin_tag
            data, tag = pinned_get(self.fs, self._at, int(start), end, tag_now)
            if self._at != self.path:
                return data
        except _ObjectChanged:
            data, tag = self._from_twin(int(start), end)
        if self._tag is None:
            self._tag = tag
        return data

    def _from_twin(self, start: int, end: int) -> tuple[bytes, Any]:
        """Read from the object that now holds the pinned version: a `.swap`'s final name, or the
        `.deleted` twin of a segment object; a clear error when neither does."""
        fs = self.fs
        twin = (
            self.path[: -len(SWAP_FILE_SUFFIX)]
            if self.path.endswith(SWAP_FILE_SUFFIX)
            else self.path + DELETED_FILE_SUFFIX
        )
        gone = CorruptRecordError(
            "object was replaced or removed while being read (retention, compaction or a segment merge), and "
            "no copy of the version being read is left (file.delete.delay.ms passed?); read again from a "
            "fresh listing",
            source=fs.url(self.path),
        )
        if self._at == twin:
            raise gone
        if self._tag is not None and not self._twin_matches(twin):
            raise gone
        self._at = twin
        try:
            data, tag = pinned_get(fs, twin, start, end, self._twin_tag)
        except _ObjectChanged:
            raise gone from None
        if self._twin_tag is None:
            self._twin_tag = tag
        return data, (self._tag if self._tag is not None else tag)

    def _twin_matches(self, twin: str) -> bool:
        """Whether `twin` holds the pinned version: the same bytes (memory store), the same plain MD5
        ETag, or, where an ETag is no content hash (multipart uploads), the same size. Pins it if so."""
        fs = self.fs
        key = fs.key(twin)
        if fs.process_local:
            obj = _memory_object(fs, key)
            if obj is None or obj.getbuffer() != self._tag[0].getbuffer():
                return False
            self._twin_tag = (obj, None)
            return True
        try:
            with fs.failures("open", twin):
                info = fs.fsspec_fs.info(key)
        except FileNotFoundError:
            return False
        size = int(info.get("size") or 0)
        tag = info.get("ETag") or info.get("etag")
        pinned = self._tag if fs.protocol in ("s3", "s3a") else self._tag[0]
        if self._size is not None and size != self._size:
            return False
        a, b = plain_md5_etag(tag), plain_md5_etag(pinned)
        if a is not None and b is not None and a != b:
            return False
        self._twin_tag = tag if fs.protocol in ("s3", "s3a") else (tag or info.get("generation"), info.get("size"))
        return True
