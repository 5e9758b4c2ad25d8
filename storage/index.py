"""Sparse segment indexes: OffsetIndex (.index) and TimeIndex (.timeindex), as Kafka lays them out.

Entries are appended in memory and written by flush(). Lookups read the "warm" tail (the last
8 KiB of entries) first, as Kafka's AbstractIndex does, since readers mostly want the tail; the
rest of the file is read only when the target lies before it. That keeps a lookup on an object
store to one or two small range reads.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .errors import CorruptIndexError, InvalidOffsetError
from .fs.filesystem import Appender, FileReader, LogFileSystem
from .records.record_batch import NO_TIMESTAMP
from .topic_partition import DELETED_FILE_SUFFIX

WARM_SECTION_BYTES = 8192


class OffsetPosition(NamedTuple):
    offset: int
    position: int


class TimestampOffset(NamedTuple):
    timestamp: int
    offset: int


def _holds_file(reader: FileReader) -> bool:
    """Whether the reader keeps the file it opened (a local file descriptor, sized with fstat).

    Only then does comparing its size with the listed one at open tell which file later reads get. A
    reader by path (object stores) resolves the name on every ranged GET, so the check would cost a
    HEAD per index object and pin nothing: the listing's size stands, and a read that comes back short
    is reported (see _load)."""
    return type(reader).size is not FileReader.size


class AbstractIndex:
    """Shared mechanics: entry count, lazy loading, warm-tail search, append, truncate, trim."""

    entry_dtype: np.dtype
    key_field: str  # the field a lookup searches

    def __init__(
        self, fs: LogFileSystem, path: str, base_offset: int, max_index_size: int, *, file_size: int | None = None
    ):
        self.fs = fs
        self.path = path
        self.base_offset = base_offset
        self.entry_size = self.entry_dtype.itemsize
        self.max_entries = max(1, max_index_size // self.entry_size)
        if file_size is None:
            file_size = fs.size(path) if fs.exists(path) else 0
        self.file_size = file_size
        self._flushed = file_size // self.entry_size
        self._n = self._flushed
        self._settled = self._n == 0  # see _settle: the file may end in Kafka's preallocated zeros
        self._loaded_from = self._n  # entries [_loaded_from, _entries) are in _cache
        self._cache = np.empty(0, self.entry_dtype)
        self._pending = bytearray()
        self._appender: Appender | None = None
        self._reader: FileReader | None = None  # opened by the segment with its log (or on first load)

    # ------------------------------------------------------------------ reading
    @property
    def _entries(self) -> int:
        if not self._settled:
            self._settle()
        return self._n

    @_entries.setter
    def _entries(self, n: int) -> None:
        self._n = n

    @property
    def is_full(self) -> bool:
        """No slot left for another entry (Kafka's AbstractIndex.isFull)."""
        return self._entries >= self.max_entries

    @property
    def entries(self) -> int:
        return self._entries

    def load_entries(self, rows: np.ndarray) -> None:
        """Hold exactly `rows`, as if read from a file of those bytes, with no I/O: the indexes of a
        segment object, built whole in memory (storage/objects/immutable_segment.py)."""
        self._cache = rows
        self._loaded_from = 0
        self._n = self._flushed = len(rows)
        self._settled = True
        self.file_size = rows.nbytes
        self._pending = bytearray()

    def _read_slots(self, start: int, end: int) -> np.ndarray:
        """Entries [start, end) straight from the file (one range read)."""
        reader = self._reader
        if reader is None:
            try:
                reader = self._reader = self.fs.open_reader(self.path)
            except FileNotFoundError:  # removed or renamed since it was listed: an index is only a hint
                raise CorruptIndexError(f"index file {self.fs.url(self.path)} is gone") from None
        raw = reader.read(start * self.entry_size, end * self.entry_size)
        if len(raw) != (end - start) * self.entry_size:
            raise CorruptIndexError(f"index file {self.fs.url(self.path)} shrank while being read")
        return np.frombuffer(raw, self.entry_dtype)

    def _settle(self, first_slot: int | None = None) -> None:
        """Find where the file's entries end, reading its tail from first_slot (default: the last entry).

        A Kafka broker preallocates its active segment's indexes (segment.index.bytes of zeros, memory
        mapped) and trims them only on roll and clean shutdown, so a live broker's log dir, or one left by
        a crash, holds index files that end in zeros. No entry after the first is all zeros (keys strictly
        grow from the first), so when the last slot is zero the entries end at the first slot of that zero
        tail, found by bisection. The tail read stays cached, so the lookup that asked costs no more reads.
        """
        self._settled = True
        n = self._n
        if n == 0:
            return
        start = n - 1 if first_slot is None else max(0, min(first_slot, n - 1))
        try:
            tail = self._read_slots(start, n)
            zero = tail.view(np.uint8).reshape(len(tail), self.entry_size).any(axis=1) == 0
            if not zero[-1]:
                self._check_sorted(tail, start)
                self._cache, self._loaded_from = tail.copy(), start
                return
            lo, hi = 0, n - 1  # slot hi is zero; the first zero slot of the tail lies in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if mid >= start:
                    is_zero = bool(zero[mid - start])
                else:
                    is_zero = not self._read_slots(mid, mid + 1).tobytes().strip(b"\0")
                if is_zero:
                    hi = mid
                else:
                    lo = mid + 1
        except CorruptIndexError:
            return  # leave it: the read that needs these entries reports the damage where it is handled
        self._n = self._flushed = self._loaded_from = lo
        if lo > start:
            self._cache, self._loaded_from = tail[: lo - start].copy(), start

    def _load(self, start_slot: int) -> None:
        """Make entries [start_slot, entries) available in memory with one range read."""
        if not self._settled:
            self._settle(start_slot)
        if start_slot >= self._loaded_from:
            return
        head = self._read_slots(start_slot, self._loaded_from)
        self._cache = np.concatenate([head, self._cache], dtype=self.entry_dtype) if len(self._cache) else head.copy()
        self._loaded_from = start_slot
        self._check_sorted(head, start_slot)

    def _check_sorted(self, arr: np.ndarray, first_slot: int) -> None:
        rel = arr["relative_offset"].astype(np.int64)
        bad = np.flatnonzero(rel < 0)
        if bad.size:
            raise CorruptIndexError(
                f"index file {self.fs.url(self.path)}: entry {first_slot + int(bad[0])} has negative relative offset"
            )

    def entry_array(self, start_slot: int = 0) -> np.ndarray:
        """Entries from start_slot to the end, loading them if needed."""
        self._load(start_slot)
        return self._cache[start_slot - self._loaded_from :]

    def _key_at(self, slot: int) -> int:
        self._load(slot)
        return int(self._cache[slot - self._loaded_from][self.key_field])

    def _largest_lower_bound_slot(self, target: int) -> int:
        """Slot of the largest entry whose key <= target, or -1. Searches the warm tail first."""
        warm = WARM_SECTION_BYTES // self.entry_size
        if not self._settled:
            self._settle(self._n - 1 - warm)  # the warm tail, read once for both
        n = self._entries
        if n == 0:
            return -1
        first_hot = max(0, n - 1 - warm)
        if self._key_at(first_hot) <= target:
            lo = first_hot
        else:
            if self._key_at(0) > target:
                return -1
            lo = 0
        keys = self.entry_array(lo)[self.key_field][: (n - lo)]
        return lo + int(np.searchsorted(keys.astype(np.int64), target, side="right")) - 1

    # ------------------------------------------------------------------ writing
    def _append_entry(self, *values) -> None:
        self._append_rows(np.array([values], dtype=self.entry_dtype))

    def _append_rows(self, rows: np.ndarray) -> None:
        if not len(rows):
            return
        # dtype kept: numpy 2 joins big-endian structured arrays into a native-order one, whose bytes (the
        # pending entries after a truncation) would then be written little-endian
        self._cache = np.concatenate([self._cache, rows], dtype=self.entry_dtype) if len(self._cache) else rows.copy()
        self._pending += rows.tobytes()
        self._entries += len(rows)

    def flush(self, fsync: bool = True) -> None:
        if self._pending:
            if self._appender is None:
                self._appender = self.fs.open_appender(self.path)
                if self._appender.size != self._flushed * self.entry_size:
                    self._appender.truncate(self._flushed * self.entry_size)
            self._appender.write(self._pending)
            self._pending = bytearray()
            self._flushed = self._entries
            self.file_size = self._flushed * self.entry_size
        if self._appender is not None:
            self._appender.flush(fsync)

    def open_reader(self, suffix: str = "") -> None:
        """Hold the index file the segment's log reader belongs with: the one at path + suffix, or its
        .deleted twin when a cleaner swap replaced the name with a file of another size."""
        self.release_reader()
        try:
            reader = self.fs.open_reader(self.path + suffix)
        except FileNotFoundError:
            return  # a missing index fails on first use, as before
        if not suffix and self._appender is None and _holds_file(reader) and reader.size() != self.file_size:
            try:
                old = self.fs.open_reader(self.path + DELETED_FILE_SUFFIX)
            except FileNotFoundError:
                old = None
            if old is not None and old.size() == self.file_size:
                reader.close()
                reader = old
            elif old is not None:
                old.close()
        self._reader = reader

    def release_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close(self) -> None:
        self.release_reader()
        if self._appender is not None:
            self._appender.close()
            self._appender = None

    def truncate_to_entries(self, n: int) -> None:
        """Keep the first n entries, in memory and on disk."""
        n = max(0, min(n, self._entries))
        if n <= self._loaded_from:
            self._cache = np.empty(0, self.entry_dtype)
            self._loaded_from = n
        else:
            self._cache = self._cache[: n - self._loaded_from]
        self._entries = n
        if n < self._flushed:
            self._flushed = n
            self.file_size = n * self.entry_size
            if self._appender is not None:
                self._appender.truncate(self.file_size)
            elif self.fs.exists(self.path):
                self.fs.truncate(self.path, self.file_size)
        # invariant: _loaded_from <= _flushed, so pending entries are all in the cache
        self._pending = bytearray(self._cache[self._flushed - self._loaded_from :].tobytes())

    def trim_to_valid_size(self) -> None:
        """Cut the file to its entries (Kafka preallocates; a file from Kafka may carry zeros)."""
        self.flush(fsync=False)
        if self.file_size != self._entries * self.entry_size and self.fs.exists(self.path):
            self.fs.truncate(self.path, self._entries * self.entry_size)
            self.file_size = self._entries * self.entry_size

    def reset(self) -> None:
        """Drop every entry and empty the file (before a rebuild)."""
        self.truncate_to_entries(0)
        if self._appender is not None:
            self._appender.truncate(0)
        else:
            self.fs.write_atomic(self.path, b"", durable=False)
        self.file_size = 0

    def sanity_check(self, log_size: int | None = None) -> None:
        """Kafka's cheap load-time checks; raises CorruptIndexError so the loader rebuilds."""
        url = self.fs.url(self.path)
        if self.file_size % self.entry_size:
            raise CorruptIndexError(
                f"index file {url} has size {self.file_size}, not a multiple of entry size {self.entry_size}"
            )
        if self._entries:
            self._check_last_entry(log_size)

    def _check_last_entry(self, log_size: int | None) -> None:
        """Subclasses check their last entry against the base offset (and the log size)."""


class OffsetIndex(AbstractIndex):
    """Maps a batch's last offset (relative to the segment base) to the batch's byte position."""

    entry_dtype = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
    key_field = "relative_offset"

    @property
    def last_offset(self) -> int:
        if not self._entries:
            return self.base_offset
        return self.base_offset + self._key_at(self._entries - 1)

    def entry(self, slot: int) -> OffsetPosition:
        self._load(slot)
        row = self._cache[slot - self._loaded_from]
        return OffsetPosition(self.base_offset + int(row["relative_offset"]), int(row["position"]))

    def lookup(self, target_offset: int) -> OffsetPosition:
        """Largest entry with offset <= target, or (base_offset, 0)."""
        slot = self._largest_lower_bound_slot(target_offset - self.base_offset)
        if slot < 0:
            return OffsetPosition(self.base_offset, 0)
        return self.entry(slot)

    def append(self, offset: int, position: int) -> None:
        if self.is_full:
            raise ValueError(f"attempt to append to a full index {self.fs.url(self.path)}")
        if self._entries and offset <= self.last_offset:
            raise InvalidOffsetError(
                f"attempt to append offset {offset} to {self.fs.url(self.path)}, "
                f"no larger than the last offset {self.last_offset}"
            )
        self._append_entry(offset - self.base_offset, position)

    def append_entries(self, offsets: np.ndarray, positions: np.ndarray) -> None:
        """Bulk append (from the index planner); offsets must keep increasing."""
        if not len(offsets):
            return
        if self._entries + len(offsets) > self.max_entries:
            raise ValueError(f"attempt to append to a full index {self.fs.url(self.path)}")
        if self._entries and int(offsets[0]) <= self.last_offset:
            raise InvalidOffsetError(
                f"attempt to append offset {int(offsets[0])} to {self.fs.url(self.path)}, "
                f"no larger than the last offset {self.last_offset}"
            )
        rows = np.empty(len(offsets), self.entry_dtype)
        rows["relative_offset"] = np.asarray(offsets, np.int64) - self.base_offset
        rows["position"] = positions
        self._append_rows(rows)

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= the given offset."""
        slot = self._largest_lower_bound_slot(offset - self.base_offset)
        if slot < 0:
            self.truncate_to_entries(0)
        elif self.entry(slot).offset == offset:
            self.truncate_to_entries(slot)
        else:
            self.truncate_to_entries(slot + 1)

    def _check_sorted(self, arr, first_slot):
        super()._check_sorted(arr, first_slot)
        rel = arr["relative_offset"].astype(np.int64)
        pos = arr["position"].astype(np.int64)
        if len(arr) > 1 and (np.any(np.diff(rel) <= 0) or np.any(np.diff(pos) <= 0)):
            raise CorruptIndexError(f"index file {self.fs.url(self.path)}: entries are not increasing")

    def _check_last_entry(self, log_size):
        last = self.entry(self._entries - 1)
        if last.offset < self.base_offset:
            raise CorruptIndexError(
                f"corrupt index found, index file ({self.fs.url(self.path)}) has non-zero size but the last "
                f"offset is {last.offset} which is less than the base offset {self.base_offset}"
            )
        if log_size is not None and last.position >= max(log_size, 1):
            raise CorruptIndexError(
                f"index file {self.fs.url(self.path)}: last entry points at position {last.position}, "
                f"beyond the log's {log_size} bytes"
            )


class TimeIndex(AbstractIndex):
    """Maps the largest timestamp seen so far to the offset where it was seen (entries only grow)."""

    entry_dtype = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
    key_field = "timestamp"

    def entry(self, slot: int) -> TimestampOffset:
        self._load(slot)
        row = self._cache[slot - self._loaded_from]
        return TimestampOffset(int(row["timestamp"]), self.base_offset + int(row["relative_offset"]))

    @property
    def last_entry(self) -> TimestampOffset:
        if not self._entries:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry(self._entries - 1)

    @property
    def is_full(self) -> bool:
        # Kafka keeps one slot free so the final entry on roll always fits.
        return self._entries >= self.max_entries - 1

    def lookup(self, target_timestamp: int) -> TimestampOffset:
        """Largest entry with timestamp <= target, or (-1, base_offset)."""
        slot = self._largest_lower_bound_slot(target_timestamp)
        if slot < 0:
            return TimestampOffset(NO_TIMESTAMP, self.base_offset)
        return self.entry(slot)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append only when the timestamp grew, as Kafka does."""
        if not skip_full_check and self.is_full:
            raise ValueError(f"attempt to append to a full time index {self.fs.url(self.path)}")
        last = self.last_entry
        if self._entries and offset < last.offset:
            raise InvalidOffsetError(
                f"attempt to append offset {offset} to {self.fs.url(self.path)}, smaller than {last.offset}"
            )
        if timestamp > last.timestamp:
            self._append_entry(timestamp, offset - self.base_offset)

    def append_entries(self, timestamps: np.ndarray, offsets: np.ndarray) -> None:
        """Bulk append (from the index planner); timestamps must keep growing."""
        if not len(timestamps):
            return
        if self._entries + len(timestamps) > self.max_entries:
            raise ValueError(f"attempt to append to a full time index {self.fs.url(self.path)}")
        rows = np.empty(len(timestamps), self.entry_dtype)
        rows["timestamp"] = timestamps
        rows["relative_offset"] = np.asarray(offsets, np.int64) - self.base_offset
        self._append_rows(rows)

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= the given offset."""
        arr = self.entry_array(0)
        offs = self.base_offset + arr["relative_offset"].astype(np.int64)
        self.truncate_to_entries(int(np.searchsorted(offs, offset, side="left")))

    def _check_sorted(self, arr, first_slot):
        super()._check_sorted(arr, first_slot)
        ts = arr["timestamp"].astype(np.int64)
        rel = arr["relative_offset"].astype(np.int64)
        if len(arr) > 1 and (np.any(np.diff(ts) <= 0) or np.any(np.diff(rel) < 0)):
            raise CorruptIndexError(f"time index file {self.fs.url(self.path)}: entries are not increasing")

    def _check_last_entry(self, log_size):
        last = self.last_entry
        if last.offset < self.base_offset:
            raise CorruptIndexError(
                f"corrupt time index found, time index file ({self.fs.url(self.path)}) has non-zero size but "
                f"the last offset is {last.offset} which is less than the base offset {self.base_offset}"
            )
