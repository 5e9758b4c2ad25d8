"""The transaction index (`<base offset>.txnindex`): Kafka's TransactionIndex of a segment's aborted transactions.

Read whole (it holds one entry per transaction aborted in its segment), checked, and decoded with numpy;
appends are held in memory and written by flush(), as storage/index.py does for the offset and time indexes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import CorruptIndexError, InvalidOffsetError
from ..fs.filesystem import Appender, LogFileSystem
from ..topic_partition import TXN_INDEX_FILE_SUFFIX, segment_file_name

ABORTED_TXN_VERSION = 0
ABORTED_TXN_DTYPE = np.dtype(
    [
        ("version", ">i2"),
        ("producer_id", ">i8"),
        ("first_offset", ">i8"),
        ("last_offset", ">i8"),
        ("last_stable_offset", ">i8"),
    ]
)
ABORTED_TXN_SIZE = ABORTED_TXN_DTYPE.itemsize  # 34: packed, no padding
# One entry per transaction aborted in a segment: 2 Mi entries, far more aborts than a segment of markers
# usually holds; a file above it is refused before it is read.
MAX_TXN_INDEX_BYTES = 64 << 20


class AbortedTxn(NamedTuple):
    """One entry: a producer's aborted transaction, from its first data offset to its ABORT marker's offset
    (lastOffset), and the partition's last stable offset when the marker was written."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def __str__(self) -> str:  # Kafka's AbortedTxn.toString
        return (
            f"AbortedTxn(producerId={self.producer_id}, firstOffset={self.first_offset}, "
            f"lastOffset={self.last_offset}, lastStableOffset={self.last_stable_offset})"
        )


def entries_to_txns(entries: np.ndarray) -> list[AbortedTxn]:
    """Rows of ABORTED_TXN_DTYPE as AbortedTxn tuples (column-wise, no per-field Python work)."""
    cols = (entries[f].tolist() for f in ("producer_id", "first_offset", "last_offset", "last_stable_offset"))
    return [AbortedTxn(*row) for row in zip(*cols, strict=True)]


class TxnIndexSearchResult(NamedTuple):
    """What collect_aborted found: the matching entries (ABORTED_TXN_DTYPE rows), and whether the search is
    complete, or must go on into the next segment's index (Kafka's TxnIndexSearchResult.isComplete)."""

    entries: np.ndarray
    is_complete: bool

    @property
    def aborted_transactions(self) -> list[AbortedTxn]:
        return entries_to_txns(self.entries)


def decode_aborted_txns(raw, where: str) -> tuple[np.ndarray, CorruptIndexError | None]:
    """The entries of a .txnindex's bytes up to the first bad one, and the error for that one (None if the
    bytes are all good). An entry is bad when its version is not 0, its lastOffset is below its firstOffset,
    or its lastOffset does not exceed the entry before's (the order Kafka's append keeps); a tail shorter than
    an entry is a partial entry. Errors name `where` (the file) and the byte position of the entry."""
    n = len(raw) // ABORTED_TXN_SIZE
    entries = np.frombuffer(raw, ABORTED_TXN_DTYPE, count=n)
    first = entries["first_offset"].astype(np.int64)
    last = entries["last_offset"].astype(np.int64)
    checks = (
        (entries["version"] != ABORTED_TXN_VERSION, "unexpected aborted transaction version {version}, expected 0"),
        (last < first, "lastOffset {last} is below firstOffset {first}"),
        (
            np.concatenate(([False], np.diff(last) <= 0)),
            "lastOffset {last} is not greater than the previous entry's {previous}",
        ),
    )
    bad, message = n, ""
    for mask, text in checks:
        hit = np.flatnonzero(mask)
        if hit.size and int(hit[0]) < bad:
            bad, message = int(hit[0]), text
    if bad < n:
        detail = message.format(
            version=int(entries["version"][bad]),
            first=int(first[bad]),
            last=int(last[bad]),
            previous=int(last[bad - 1]) if bad else None,
        )
        return entries[:bad], CorruptIndexError(
            f"transaction index {where}: entry {bad} at position {bad * ABORTED_TXN_SIZE}: {detail}"
        )
    if len(raw) % ABORTED_TXN_SIZE:
        return entries, CorruptIndexError(
            f"transaction index {where} ends with a partial entry at position {n * ABORTED_TXN_SIZE} "
            f"({len(raw) % ABORTED_TXN_SIZE} of {ABORTED_TXN_SIZE} bytes)"
        )
    return entries, None


def read_txn_index_bytes(fs: LogFileSystem, path: str, max_bytes: int = MAX_TXN_INDEX_BYTES) -> bytes:
    """A .txnindex's bytes, refused (CorruptIndexError) when the file is larger than max_bytes, before reading."""
    size = fs.size(path)
    if size > max_bytes:
        raise CorruptIndexError(
            f"transaction index {fs.url(path)} is {size} bytes, more than the {max_bytes} bytes read at most"
        )
    raw = fs.read(path, 0, size) if size else b""
    if len(raw) != size:
        raise CorruptIndexError(f"transaction index {fs.url(path)} changed size while being read")
    return raw


class TransactionIndex:
    """A segment's `.txnindex`: one 34-byte big-endian entry per transaction aborted in the segment
    (`int16 version (0) | int64 producerId | int64 firstOffset | int64 lastOffset | int64 lastStableOffset`),
    in the order their ABORT markers were written, so lastOffset strictly increases and each entry's
    lastOffset >= firstOffset. There is no header and no preallocation; the file exists once an entry has
    been flushed. A transaction may begin in an earlier segment than the one whose index holds it.
    """

    def __init__(self, fs: LogFileSystem, path: str, start_offset: int, *, max_bytes: int = MAX_TXN_INDEX_BYTES):
        self.fs = fs
        self.path = path
        self.start_offset = start_offset
        self.max_bytes = max_bytes
        self._entries: np.ndarray | None = None  # read on first use
        self._flushed = 0  # entries in the file (valid once loaded)
        self._pending = bytearray()
        self._appender: Appender | None = None

    @classmethod
    def for_segment(cls, fs: LogFileSystem, directory: str, base_offset: int, **options) -> TransactionIndex:
        """The index of the segment at base_offset in a partition directory."""
        return cls(
            fs, fs.join(directory, segment_file_name(base_offset, TXN_INDEX_FILE_SUFFIX)), base_offset, **options
        )

    # ------------------------------------------------------------------ reading
    def _load(self) -> np.ndarray:
        if self._entries is None:
            if self.fs.exists(self.path):
                entries, error = decode_aborted_txns(
                    read_txn_index_bytes(self.fs, self.path, self.max_bytes), self.fs.url(self.path)
                )
                if error is not None:
                    raise error
            else:
                entries = np.empty(0, ABORTED_TXN_DTYPE)
            self._entries, self._flushed = entries, len(entries)
        return self._entries

    def entries(self) -> np.ndarray:
        """Every entry (read-only ABORTED_TXN_DTYPE rows), flushed or not; CorruptIndexError for a bad file."""
        entries = self._load()
        entries.flags.writeable = False
        return entries

    def all_aborted_txns(self) -> list[AbortedTxn]:
        """Every entry, in file order (Kafka's allAbortedTxns)."""
        return entries_to_txns(self._load())

    @property
    def is_empty(self) -> bool:
        return len(self._load()) == 0

    @property
    def last_offset(self) -> int | None:
        """The last entry's lastOffset, None when there is none."""
        entries = self._load()
        return int(entries["last_offset"][-1]) if len(entries) else None

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> TxnIndexSearchResult:
        """The aborted transactions that overlap the fetch range [fetch_offset, upper_bound_offset), as Kafka's
        collectAbortedTxns: entries with lastOffset >= fetch_offset and firstOffset < upper_bound_offset, up to
        and including the first whose lastStableOffset >= upper_bound_offset; the search is complete when there
        is one (no transaction aborted in a later segment can overlap the range), else it continues in the next
        segment's index."""
        entries = self._load()
        reached = np.flatnonzero(entries["last_stable_offset"].astype(np.int64) >= upper_bound_offset)
        scanned = entries[: int(reached[0]) + 1] if reached.size else entries
        keep = (scanned["last_offset"].astype(np.int64) >= fetch_offset) & (
            scanned["first_offset"].astype(np.int64) < upper_bound_offset
        )
        return TxnIndexSearchResult(scanned[keep], bool(reached.size))

    def sanity_check(self) -> None:
        """Kafka's load-time check: no entry's lastOffset lies below the segment's base offset (besides the
        checks every read makes)."""
        entries = self._load()
        if len(entries) and int(entries["last_offset"][0]) < self.start_offset:
            raise CorruptIndexError(
                f"last offset of aborted transaction {entries_to_txns(entries[:1])[0]} in index "
                f"{self.fs.url(self.path)} is less than start offset {self.start_offset}"
            )

    # ------------------------------------------------------------------ writing
    def append(self, txn: AbortedTxn) -> None:
        """Add an entry (written by flush). Its lastOffset must exceed the last entry's, as Kafka's append
        requires, and be at least its firstOffset: else InvalidOffsetError."""
        entries = self._load()
        url = self.fs.url(self.path)
        if txn.last_offset < txn.first_offset:
            raise InvalidOffsetError(
                f"aborted transaction {txn} for index {url} ends before it begins (lastOffset < firstOffset)"
            )
        last = self.last_offset
        if last is not None and txn.last_offset <= last:
            raise InvalidOffsetError(
                f"the last offset of appended transactions must increase sequentially, but {txn.last_offset} is "
                f"not greater than current last offset {last} of index {url}"
            )
        try:
            row = np.array([(ABORTED_TXN_VERSION, *txn)], ABORTED_TXN_DTYPE)
        except OverflowError:
            raise InvalidOffsetError(f"aborted transaction {txn} for index {url}: a field is not an int64") from None
        # dtype kept: numpy 2 would otherwise join big-endian structured rows into a native-order array
        self._entries = np.concatenate([entries, row], dtype=ABORTED_TXN_DTYPE)
        self._pending += row.tobytes()

    def flush(self, fsync: bool = True) -> None:
        """Write the appended entries at the end of the file (created by the first), then flush it."""
        if self._pending:
            if self._appender is None:
                self._appender = self.fs.open_appender(self.path)
                if self._appender.size != self._flushed * ABORTED_TXN_SIZE:
                    self._appender.truncate(self._flushed * ABORTED_TXN_SIZE)
            self._appender.write(bytes(self._pending))
            self._pending = bytearray()
            self._flushed = len(self._load())
        if self._appender is not None:
            self._appender.flush(fsync)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose lastOffset >= offset (the log is truncated to offset), in memory and on disk."""
        entries = self._load()
        keep = int(np.searchsorted(entries["last_offset"].astype(np.int64), offset, side="left"))
        self._keep_entries(keep)

    def reset(self) -> None:
        """Drop every entry and empty the file (before a rebuild)."""
        self._load()
        self._keep_entries(0)

    def _keep_entries(self, keep: int) -> None:
        entries = self._load()
        if keep >= len(entries):
            return
        self._entries = entries[:keep].copy()
        if keep < self._flushed:
            self._flushed = keep
            if self._appender is not None:
                self._appender.truncate(keep * ABORTED_TXN_SIZE)
            elif self.fs.exists(self.path):
                self.fs.truncate(self.path, keep * ABORTED_TXN_SIZE)
        self._pending = bytearray(self._entries[self._flushed :].tobytes())

    def close(self) -> None:
        if self._appender is not None:
            self._appender.close()
            self._appender = None
