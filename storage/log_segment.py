"""LogSegment: one `.log` file of batches plus its `.index` and `.timeindex`, named by base offset."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .common.constants import INT32_MAX
from .common.time import SYSTEM_TIME
from .errors import CorruptIndexError, CorruptRecordError
from .file_records import (
    FIRST_CHUNK_BYTES,
    BatchChunk,
    check_headers,
    crc_failures,
    find_valid_batch,
    head,
    iter_chunks,
    select_batches,
)
from .fs.filesystem import Appender, FileReader, LogFileSystem
from .index import OffsetIndex, TimeIndex, TimestampOffset
from .index_planner import IndexState, plan_index_entries
from .records.record_batch import RECORD_BATCH_OVERHEAD, BatchScan, RecordBatchHeader, validate_batches
from .topic_partition import (
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    offset_to_file_prefix,
)

log = logging.getLogger(__name__)

# Index entries hold an offset relative to the segment's base offset as an int32, so no batch in a
# segment may reach base offset + this (Kafka's LogSegment.canConvertToRelativeOffset).


def random_segment_jitter(config) -> int:
    """A segment's roll jitter: uniform in [0, min(segment.jitter.ms, segment.ms)), 0 without jitter
    (Kafka's LogConfig.randomSegmentJitter)."""
    if config.segment_jitter_ms <= 0:
        return 0
    return random.randrange(max(1, min(config.segment_jitter_ms, config.segment_ms)))


def segment_settings(config) -> dict:
    """The LogSegment arguments a topic's LogConfig decides (the roll jitter is drawn per call)."""
    return dict(
        index_interval_bytes=config.index_interval_bytes,
        max_index_size=config.segment_index_bytes,
        max_batch_size=config.max_message_bytes,
        roll_jitter_ms=random_segment_jitter(config),
    )


@dataclass
class RecoveryResult:
    valid_bytes: int
    truncated_bytes: int
    error: str | None  # why the tail was cut, with the position; None when the segment was whole


class LogSegment:
    """One segment of a partition's log: the batches with offsets in [base offset, next segment's base
    offset), in three files named by the base offset as 20 digits: `.log` (the batches, back to
    back), `.index` (OffsetIndex: relative offset -> position, every index.interval.bytes) and
    `.timeindex` (TimeIndex: max timestamp so far -> relative offset). A suffix (`.cleaned`, `.swap`,
    `.deleted`) marks the files of a segment being written by the cleaner, swapped in, or deleted.

    Invariants: every batch's offsets fit an int32 relative to the base offset; batches are in offset
    order with no overlap; index entries point at the start of the batch whose last offset they name
    and only ever grow. A segment is appended to only while it is its Log's active segment, by that
    Log's single writer (the partition lock, or a create-only write of the whole segment on object
    stores); once rolled it never changes again, except by a truncation or a swap under the same
    writer. Readers may read a segment while the writer appends: they see a prefix of whole batches,
    up to the size they read. All I/O goes through the filesystem seam.
    """

    def __init__(
        self,
        fs: LogFileSystem,
        dir: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        max_batch_size: int,
        log_size: int | None = None,
        index_size: int | None = None,
        time_index_size: int | None = None,
        file_suffix: str = "",
        created_ms: int | None = None,
        roll_jitter_ms: int = 0,
        track_batches: bool = False,
        bulk_writes: bool = False,
    ):
        """track_batches: record (positions, base offsets) of appended batches in `appended` (a staging
        segment, adopted whole later); bulk_writes: big appends may bypass the OS cache (write-once)."""
        self.fs = fs
        self.dir = dir
        self.base_offset = base_offset
        self.file_suffix = file_suffix
        self.index_interval_bytes = index_interval_bytes
        self.max_batch_size = max_batch_size
        prefix = fs.join(dir, offset_to_file_prefix(base_offset))
        self.log_path = prefix + LOG_FILE_SUFFIX + file_suffix
        # `.txnindex` (storage/transactions/transaction_index.py): only where a transaction aborted here
        self.txn_index_path = prefix + TXN_INDEX_FILE_SUFFIX + file_suffix
        self.offset_index = OffsetIndex(
            fs, prefix + INDEX_FILE_SUFFIX + file_suffix, base_offset, max_index_size, file_size=index_size
        )
        self.time_index = TimeIndex(
            fs, prefix + TIME_INDEX_FILE_SUFFIX + file_suffix, base_offset, max_index_size, file_size=time_index_size
        )
        if log_size is None:
            log_size = fs.size(self.log_path) if fs.exists(self.log_path) else 0
        self._size = log_size
        self._appender: Appender | None = None
        # loaded lazily (it needs a tail scan), but known at once for empty files
        empty = log_size == self.offset_index.file_size == self.time_index.file_size == 0
        self._index_state: IndexState | None = IndexState() if empty else None
        self._rolling_based_timestamp: int | None = None
        self.created_ms = SYSTEM_TIME.milliseconds() if created_ms is None else created_ms
        self.roll_jitter_ms = roll_jitter_ms
        self._needs_rebuild = False  # an index is missing or failed a check: reads scan, a writer rebuilds
        self._rolled = False  # no longer the active segment (mark_rolled)
        self.appended: list | None = [] if track_batches else None  # (positions, base offsets) per append
        self.bulk_writes = bulk_writes
        self._reader: FileReader | None = None  # of the .log, opened with the indexes' on first read

    @classmethod
    def create(cls, fs: LogFileSystem, dir: str, base_offset: int, **kwargs) -> LogSegment:
        seg = cls(fs, dir, base_offset, log_size=0, index_size=0, time_index_size=0, **kwargs)
        for path in (seg.log_path, seg.offset_index.path, seg.time_index.path):
            fs.write_atomic(path, b"", durable=False)
        return seg

    def __repr__(self) -> str:
        return f"LogSegment(baseOffset={self.base_offset}, size={self._size}, path={self.fs.url(self.log_path)})"

    @property
    def size(self) -> int:
        return self._size

    @property
    def rolled(self) -> bool:
        """No longer the active segment: nothing is appended to it again."""
        return self._rolled

    def mark_rolled(self) -> None:
        self._rolled = True

    @property
    def needs_rebuild(self) -> bool:
        """Whether an index is missing or untrusted: reads scan from the start, a writer rebuilds both."""
        return self._needs_rebuild

    def mark_needs_rebuild(self) -> None:
        """Stop trusting the indexes (missing, or failing a check); a rebuild or recovery clears it."""
        self._needs_rebuild = True

    @property
    def source(self) -> str:
        return self.fs.url(self.log_path)

    # ------------------------------------------------------------------ reading
    def _read(self, start: int, end: int) -> bytes:
        if self._reader is None:
            self.open_readers()
        assert self._reader is not None  # open_readers opened it, or raised
        return self._reader.read(start, end)

    def open_readers(self) -> None:
        """Open the .log and both indexes together and keep them until release_readers(): a reader goes
        on with the segment it listed when retention renames it to .deleted or a cleaner swap puts
        a new file under its name (a rolled segment whose size changed is looked for as .deleted)."""
        self.release_readers()
        suffix = ""
        try:
            reader = self.fs.open_reader(self.log_path)
            if self.rolled and not self.file_suffix and reader.size() != self._size:
                reader.close()
                raise FileNotFoundError(self.log_path)
        except FileNotFoundError:
            if self.file_suffix == SWAP_FILE_SUFFIX:  # a reader's mid-swap view: the swap has completed since
                self._reader = self.fs.open_reader(self.log_path[: -len(SWAP_FILE_SUFFIX)])
                return
            if self.file_suffix:
                raise
            try:
                reader = self.fs.open_reader(self.log_path + DELETED_FILE_SUFFIX)
            except FileNotFoundError:
                raise CorruptRecordError(
                    "segment was removed while being read (retention or compaction); read again from a fresh listing",
                    source=self.source,
                ) from None
            suffix = DELETED_FILE_SUFFIX
        self._reader = reader
        self.offset_index.open_reader(suffix)
        self.time_index.open_reader(suffix)

    def release_readers(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.offset_index.release_reader()
        self.time_index.release_reader()

    def iter_chunks(
        self,
        start_position: int = 0,
        end_position: int | None = None,
        *,
        first_chunk: int = FIRST_CHUNK_BYTES,
        tail_ok: bool | None = None,
    ) -> Iterator[BatchChunk]:
        """Complete batches from start_position, read in growing chunks (see file_records.iter_chunks).
        A partial batch at the end stops quietly only in the active segment (tail_ok defaults to that);
        in a rolled one it is corruption. Headers are not checked here: see read_batches."""
        end = self._size if end_position is None else min(end_position, self._size)
        return iter_chunks(
            self._read,
            start_position,
            end,
            max_batch_size=self.max_batch_size,
            source=self.source,
            first_chunk=first_chunk,
            keep_tail=self.fs.capabilities.remote_reads,
            tail_ok=not self.rolled if tail_ok is None else tail_ok,
        )

    def _entry_for(self, offset: int) -> tuple[int, int | None]:
        """(position, entry offset) of the offset index's largest entry <= offset; (0, None) when there
        is none or the index cannot be read. Only a hint: callers check the batch found there."""
        if not self._size:
            return 0, None  # nothing to read (a writer may delete an empty active segment at any time)
        if self._reader is None:
            self.open_readers()  # the index read is then the one that belongs with the .log being read
        try:
            entry = self.offset_index.lookup(offset)
        except CorruptIndexError as e:
            self._distrust_index(str(e))
            return 0, None
        if entry.position == 0 and entry.offset == self.base_offset:
            return 0, None
        if not 0 <= entry.position < self._size or entry.offset < self.base_offset:
            self._distrust_index(
                f"index entry {entry.offset} -> position {entry.position} of "
                f"{self.fs.url(self.offset_index.path)} is outside the segment"
            )
            return 0, None
        return entry.position, entry.offset

    def _distrust_index(self, why: str) -> None:
        """A bad index entry: scan from the segment start instead, and have the next writer rebuild it."""
        if not self.needs_rebuild:
            log.warning(
                "%s; scanning %s from its start (the index is rebuilt when the log is next opened for writing)",
                why,
                self.source,
            )
        self.mark_needs_rebuild()

    def checked_chunks(
        self, start_offset: int, *, upper: int | None = None, first_chunk: int = FIRST_CHUNK_BYTES
    ) -> Iterator[BatchChunk]:
        """Chunks from the batch the offset index gives for start_offset (or the segment start) to the end,
        every header checked (file_records.check_headers against [base offset, upper)). An index entry
        that does not point at the start of a batch whose last offset it names is not obeyed: the scan
        starts over from position 0."""
        position, entry_offset = self._entry_for(start_offset)
        prev_last = None
        first = entry_offset is not None
        try:
            for chunk in self.iter_chunks(position, first_chunk=first_chunk):
                if first:
                    first = False
                    got = int(chunk.scan.last_offsets[0])
                    if chunk.scan.headers["magic"][0] != 2 or got != entry_offset:
                        raise CorruptIndexError(
                            f"index entry {entry_offset} -> position {position} of "
                            f"{self.fs.url(self.offset_index.path)} does not point at that batch"
                        )
                    prev_last = int(chunk.scan.headers["base_offset"][0]) - 1
                prev_last = check_headers(chunk, prev_last=prev_last, base_offset=self.base_offset, upper=upper)
                yield chunk
            if first and position:  # the entry points at or past the end
                raise CorruptIndexError(
                    f"index entry {entry_offset} -> position {position} of "
                    f"{self.fs.url(self.offset_index.path)} points past the data"
                )
        except (CorruptIndexError, CorruptRecordError) as e:
            if not position or not first and not isinstance(e, CorruptIndexError):
                raise
            self._distrust_index(str(e))
            yield from self.checked_chunks_from_start(upper=upper)

    def checked_chunks_from_start(self, *, upper: int | None = None) -> Iterator[BatchChunk]:
        prev_last = None
        for chunk in self.iter_chunks(0):
            prev_last = check_headers(chunk, prev_last=prev_last, base_offset=self.base_offset, upper=upper)
            yield chunk

    def translate_offset(self, offset: int, *, upper: int | None = None) -> tuple[RecordBatchHeader, int] | None:
        """The first batch whose lastOffset >= offset: (header, file position), or None."""
        for chunk in self.checked_chunks(offset, upper=upper):
            i = int(np.searchsorted(chunk.scan.last_offsets, offset, side="left"))
            if i < len(chunk.scan):
                return chunk.scan.header(i, chunk.base_position), chunk.base_position + int(chunk.scan.positions[i])
        return None

    def read_batches(
        self, start_offset: int, max_offset: int | None = None, *, upper: int | None = None
    ) -> Iterator[BatchChunk]:
        """Chunks of whole, header-checked batches from the batch holding start_offset up to the one holding
        max_offset-1, in one pass from the offset index's position (the batches before start_offset are
        dropped). `upper`: the next segment's base offset, which no batch here may reach."""
        started = False
        for chunk in self.checked_chunks(start_offset, upper=upper):
            if not started:
                i = int(np.searchsorted(chunk.scan.last_offsets, start_offset, side="left"))
                if i == len(chunk.scan):
                    continue
                started = True
                if i:
                    chunk = select_batches(chunk, i, len(chunk.scan))
            if max_offset is not None:
                base = chunk.scan.headers["base_offset"].astype(np.int64)
                keep = int(np.searchsorted(base, max_offset, side="left"))
                if keep < len(chunk.scan):
                    if keep:
                        yield head(chunk, keep)
                    return
            yield chunk

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int, decode, *, upper: int | None = None
    ) -> int | None:
        """Earliest offset >= starting_offset whose record timestamp >= timestamp (Kafka ListOffsets).

        `decode(buf, scan)` decodes chunk records to an Arrow batch with offset/timestamp columns. The
        time index entry that lets the scan skip ahead must name a batch with that last offset and max
        timestamp, else the segment is scanned from its start.
        """
        entry = self._time_index_lookup(timestamp)
        verify = entry.timestamp >= 0 and entry.offset > starting_offset  # the entry lets us skip records
        # the answer is usually within an index interval of that position: start small
        first = min(FIRST_CHUNK_BYTES, 2 * max(self.index_interval_bytes, RECORD_BATCH_OVERHEAD))
        hit = None
        for chunk in self.checked_chunks(entry.offset if verify else starting_offset, upper=upper, first_chunk=first):
            if verify:
                last = chunk.scan.last_offsets
                at = np.flatnonzero(last >= entry.offset)
                if at.size:
                    i = int(at[0])
                    if last[i] != entry.offset or int(chunk.scan.headers["max_timestamp"][i]) != entry.timestamp:
                        break
                    verify = False
            if hit is None:
                hit = self._first_at_or_after(chunk, timestamp, starting_offset, decode)
            if hit is not None and not verify:
                return hit
        if not verify:
            return hit
        self._distrust_index(
            f"time index entry {tuple(entry)} of {self.fs.url(self.time_index.path)} does not name "
            f"a batch with that last offset and max timestamp"
        )
        for chunk in self.checked_chunks_from_start(upper=upper):
            found = self._first_at_or_after(chunk, timestamp, starting_offset, decode)
            if found is not None:
                return found
        return None

    @staticmethod
    def _first_at_or_after(chunk: BatchChunk, timestamp: int, starting_offset: int, decode) -> int | None:
        h = chunk.scan.headers
        last = chunk.scan.last_offsets
        cand = np.flatnonzero((h["max_timestamp"].astype(np.int64) >= timestamp) & (last >= starting_offset))
        for i in cand:  # usually the first candidate batch holds the answer
            one = select_batches(chunk, int(i), int(i) + 1)
            batch = decode(one.buf, one.scan)
            offs = batch.column("offset").to_numpy()
            tss = batch.column("timestamp").to_numpy()
            hit = np.flatnonzero((tss >= timestamp) & (offs >= starting_offset))
            if hit.size:
                return int(offs[hit[0]])
        return None

    def _time_index_lookup(self, timestamp: int) -> TimestampOffset:
        if self._reader is None and self._size:
            self.open_readers()
        try:
            entry = self.time_index.lookup(timestamp)
        except CorruptIndexError as e:
            self._distrust_index(str(e))
            return TimestampOffset(-1, self.base_offset)
        if entry.timestamp >= 0 and entry.offset < self.base_offset:
            self._distrust_index(
                f"time index entry {entry} of {self.fs.url(self.time_index.path)} is below the segment's base offset"
            )
            return TimestampOffset(-1, self.base_offset)
        return entry

    def _tail_scan_start(self) -> int:
        """Position of the last offset index entry, once checked to start the batch it names; else 0."""
        if not self.offset_index.entries:
            return 0
        try:
            entry = self.offset_index.entry(self.offset_index.entries - 1)
        except CorruptIndexError as e:
            self._distrust_index(str(e))
            return 0
        if self._starts_batch(entry.position, entry.offset):
            return entry.position
        self._distrust_index(
            f"index entry {entry.offset} -> position {entry.position} of "
            f"{self.fs.url(self.offset_index.path)} does not point at that batch"
        )
        return 0

    def _starts_batch(self, position: int, last_offset: int) -> bool:
        """Whether a whole batch with that last offset starts at `position` (one 61-byte read)."""
        if not 0 <= position <= self._size - RECORD_BATCH_OVERHEAD:
            return False
        raw = self._read(position, position + RECORD_BATCH_OVERHEAD)
        if len(raw) < RECORD_BATCH_OVERHEAD:
            return False
        h = RecordBatchHeader.read(raw)
        return (
            h.magic == 2
            and h.last_offset == last_offset
            and h.batch_length >= RECORD_BATCH_OVERHEAD - 12
            and position + h.size_in_bytes <= self._size
        )

    def _load_index_state(self) -> IndexState:
        """Kafka keeps these in memory; we rebuild them from the index tail and the batches after it."""
        if self._index_state is None:
            self._index_state = self._index_state_at(self._size)
        return self._index_state

    def index_state(self) -> IndexState:
        """A copy of the index planner's state at the segment end (what the next append's entries
        depend on), for a caller that plans entries ahead of appending them."""
        return dataclasses.replace(self._load_index_state())

    def install_indexes(
        self,
        offset_rows: np.ndarray,
        time_rows: np.ndarray,
        state: IndexState | None = None,
        *,
        first_max_timestamp: int | None = None,
    ) -> None:
        """Take index entries built whole in memory (a segment object's, or a rebuilt one's) as both
        indexes, with the planner state they end in (None: worked out when needed) and the first
        batch's max timestamp when known; the indexes are trusted from now on."""
        self.offset_index.load_entries(offset_rows)
        self.time_index.load_entries(time_rows)
        self._index_state = state
        if first_max_timestamp is not None:
            self._rolling_based_timestamp = first_max_timestamp
        self._needs_rebuild = False

    def _index_state_at(self, end_position: int) -> IndexState:
        start = min(self._tail_scan_start(), end_position)
        try:
            last_time = self.time_index.last_entry
        except CorruptIndexError:
            last_time = TimestampOffset(-1, self.base_offset)
        state = IndexState(
            0, last_time.timestamp, last_time.offset if last_time.timestamp >= 0 else -1, last_time.timestamp
        )
        for chunk in self.iter_chunks(start, end_position):
            mts = chunk.scan.headers["max_timestamp"].astype(np.int64)
            if len(mts):
                j = int(np.argmax(mts))
                if mts[j] > state.max_timestamp:
                    state.max_timestamp = int(mts[j])
                    state.offset_of_max_timestamp = int(chunk.scan.last_offsets[j])
        state.bytes_since_last_entry = end_position - start if self.offset_index.entries else end_position
        return state

    @property
    def max_timestamp_so_far(self) -> int:
        return self._load_index_state().max_timestamp

    @property
    def largest_timestamp(self) -> int:
        """Largest record timestamp in the segment (-1 if empty): what retention and ListOffsets use.

        A rolled segment's .timeindex ends with it (Kafka appends it on roll, close and recovery), so
        that is one 12-byte read, as Kafka reads it; the active segment also scans its tail."""
        if self.rolled and self.time_index.entries:
            try:
                return self.time_index.last_entry.timestamp
            except CorruptIndexError:
                pass
        return self.max_timestamp_so_far

    def read_next_offset(self) -> int:
        """Offset after the last whole batch, or the base offset for an empty segment; raises
        CorruptRecordError when the tail holds a batch that fails its checks (see scan_tail)."""
        next_offset, error = self.scan_tail()
        if error is not None:
            raise error
        return next_offset

    def scan_tail(self, *, upper: int | None = None) -> tuple[int, CorruptRecordError | None]:
        """The log end of this segment from checked batches, never from one header alone: the headers
        from the last index entry on (file_records.check_headers) and the last batch's CRC. Returns
        (offset after the last good batch, None), or (offset after the last good batch, the error) when
        a batch fails its checks. A partial batch at the end of the active segment is a tail still
        being written (or a torn one); damage before the last batch is left to the reads that reach it."""
        good_last, tail = None, None  # the last offset known good; the last chunk's last batch
        try:
            start = self.offset_index.last_offset if self.offset_index.entries else self.base_offset
        except CorruptIndexError as e:
            self._distrust_index(str(e))
            start = self.base_offset
        try:
            for chunk in self.checked_chunks(start, upper=upper):
                if tail is not None:
                    good_last = int(tail.scan.last_offsets[-1])
                if len(chunk.scan) > 1:
                    good_last = int(chunk.scan.last_offsets[-2])
                tail = select_batches(chunk, len(chunk.scan) - 1, len(chunk.scan))
        except CorruptIndexError as e:  # an index entry that cannot even be read
            self._distrust_index(str(e))
            return self.base_offset, None
        except CorruptRecordError as e:
            if tail is not None:
                good_last = int(tail.scan.last_offsets[-1])
            return (self.base_offset if good_last is None else good_last + 1), e
        if tail is None:
            return self.base_offset, None
        if crc_failures(tail.buf, tail.scan).size:
            h = tail.scan.header(0, tail.base_position)
            return (
                (self.base_offset if good_last is None else good_last + 1),
                CorruptRecordError(
                    f"CRC mismatch in the last batch, {h.base_offset}..{h.last_offset}",
                    source=self.source,
                    position=h.position,
                ),
            )
        return int(tail.scan.last_offsets[-1]) + 1, None

    @property
    def rolling_based_timestamp(self) -> int | None:
        """maxTimestamp of the first batch: segment.ms counts from it."""
        if self._rolling_based_timestamp is None and self._size >= RECORD_BATCH_OVERHEAD:
            head = self._read(0, RECORD_BATCH_OVERHEAD)
            if len(head) == RECORD_BATCH_OVERHEAD:
                self._rolling_based_timestamp = RecordBatchHeader.read(head).max_timestamp
        return self._rolling_based_timestamp

    def can_convert_to_relative_offset(self, offset: int) -> bool:
        """Whether `offset` fits this segment's int32 relative offsets (Kafka's canConvertToRelativeOffset)."""
        return 0 <= offset - self.base_offset <= INT32_MAX

    def batches_before_roll(
        self, scan: BatchScan, start: int, *, segment_bytes: int, segment_ms: int, now_ms: int
    ) -> int:
        """How many batches of `scan` from `start` on this segment takes before it must roll: Kafka's
        LogSegment.shouldRoll, asked before each batch as if the ones before it were appended. It rolls
        when the batch would take the segment past segment.bytes; when the segment is not empty and
        segment.ms less the segment's jitter has passed since its first batch's max timestamp (or since
        it was created, when that is not set); when either index is full, counting the entries the
        index interval rule gives the batches before it; or when the batch's last offset does not fit
        a relative offset. An empty segment always takes the first batch. The loop runs per batch, not
        per record."""
        sizes = scan.sizes
        last = scan.last_offsets
        max_ts = scan.headers["max_timestamp"].astype(np.int64)
        max_ms = segment_ms - self.roll_jitter_ms
        since = self._load_index_state().bytes_since_last_entry
        pending = planned = 0
        for i in range(start, len(scan)):
            size = self._size + pending
            if self._size:
                first_ts = self.rolling_based_timestamp
            else:
                first_ts = int(max_ts[start]) if pending else None
            waited = int(max_ts[i]) - first_ts if first_ts is not None and first_ts >= 0 else now_ms - self.created_ms
            roll = (
                size > segment_bytes - int(sizes[i])
                or (size > 0 and waited > max_ms)
                or self.offset_index.entries + planned >= self.offset_index.max_entries
                or self.time_index.entries + planned >= self.time_index.max_entries - 1  # kept: the final entry
                or not self.can_convert_to_relative_offset(int(last[i]))
            )
            if roll and size > 0:
                return i - start
            if since > self.index_interval_bytes:
                planned += 1
                since = 0
            since += int(sizes[i])
            pending += int(sizes[i])
        return len(scan) - start

    # ------------------------------------------------------------------ writing
    def append(self, buf, scan: BatchScan, *, index_capacity_check: bool = True) -> None:
        """Append complete batches (already validated and offset-assigned) and their index entries."""
        if not len(scan):
            return
        state = self._load_index_state()
        positions = scan.positions - int(scan.positions[0]) + self._size
        plan = plan_index_entries(
            positions,
            scan.sizes,
            scan.last_offsets,
            scan.headers["max_timestamp"].astype(np.int64),
            self.index_interval_bytes,
            state,
        )
        if self._appender is None:
            self._appender = self.fs.open_appender(self.log_path, bulk=self.bulk_writes)
            if self._appender.size != self._size:
                raise CorruptRecordError(
                    f"segment changed under us: expected {self._size} bytes, found {self._appender.size}",
                    source=self.source,
                )
        first, end = int(scan.positions[0]), int(scan.positions[-1] + scan.sizes[-1])
        self._appender.write(memoryview(buf)[first:end])
        self._size += end - first
        self.offset_index.append_entries(*plan.offset_entries)
        self.time_index.append_entries(*plan.time_entries)
        self._index_state = plan.state
        if self.appended is not None:
            self.appended.append((positions, scan.headers["base_offset"].astype(np.int64)))
        if self._rolling_based_timestamp is None and positions[0] == 0:
            self._rolling_based_timestamp = int(scan.headers["max_timestamp"][0])

    def flush(self, fsync: bool = True) -> None:
        if self._appender is not None:
            self._appender.flush(fsync)
        self.offset_index.flush(fsync)
        self.time_index.flush(fsync)

    def _append_final_time_entry(self) -> None:
        state = self._load_index_state()
        if state.max_timestamp >= 0 and state.offset_of_max_timestamp >= self.time_index.last_entry.offset:
            self.time_index.maybe_append(state.max_timestamp, state.offset_of_max_timestamp, skip_full_check=True)
            state.last_time_entry = max(state.last_time_entry, state.max_timestamp)

    def on_become_inactive(self) -> None:
        """On roll: record the segment's max timestamp in the time index and trim the index files."""
        self._append_final_time_entry()
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        self.flush()

    def close(self, *, final_time_entry: bool = False, fsync: bool = True) -> None:
        """Flush and release handles; Kafka also records the max timestamp on a clean close, and trims the
        active segment's indexes (a broker preallocates them) to their entries."""
        if final_time_entry:
            if self._appender is not None:
                self._append_final_time_entry()
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()
        self.flush(fsync)
        self.release_readers()
        for h in (self._appender, self.offset_index, self.time_index):
            if h is not None:
                h.close()
        self._appender = None

    # ------------------------------------------------------------------ recovery and truncation
    def recover(self, *, tail_ok: bool = True, upper: int | None = None) -> RecoveryResult:
        """Validate every batch, rebuild both indexes, and cut a torn tail (see _recover_range). `upper`:
        the next segment's base offset, which no batch here may reach."""
        return self._recover_range(0, IndexState(), None, tail_ok, upper, prepare=self._reset_indexes)

    def _reset_indexes(self) -> None:
        self.offset_index.reset()
        self.time_index.reset()

    def recover_from(self, offset: int, *, tail_ok: bool = True, upper: int | None = None) -> RecoveryResult:
        """Recover only the batches from `offset` (the recovery point) on; earlier ones were flushed.

        Index entries below the recovery point are kept once the one the scan starts from is checked;
        a recovery point that falls inside a batch, or an index that cannot be trusted, falls back to a
        full recovery.
        """
        if offset <= self.base_offset:
            return self.recover(tail_ok=tail_ok, upper=upper)
        try:
            self.offset_index.sanity_check(self._size)
            self.time_index.sanity_check()
            position = None
            end_of_complete, entry_offset = self._entry_for(offset - 1)
            if entry_offset is not None and not self._starts_batch(end_of_complete, entry_offset):
                self._distrust_index(
                    f"index entry {entry_offset} -> position {end_of_complete} of "
                    f"{self.fs.url(self.offset_index.path)} does not point at that batch"
                )
                return self.recover(tail_ok=tail_ok, upper=upper)
            for chunk in self.iter_chunks(end_of_complete, tail_ok=True):
                bases = chunk.scan.headers["base_offset"].astype(np.int64)
                i = int(np.searchsorted(bases, offset, side="left"))
                if i > 0 and chunk.scan.last_offsets[i - 1] >= offset:
                    return self.recover(tail_ok=tail_ok, upper=upper)  # the recovery point is inside a batch
                if i < len(chunk.scan):
                    position = chunk.base_position + int(chunk.scan.positions[i])
                    break
                end_of_complete = chunk.base_position + chunk.scan.end
            if position is None:
                position = end_of_complete
            self.offset_index.truncate_to(offset)  # entries from the recovery point on are rebuilt
            self.time_index.truncate_to(offset)
            state = self._index_state_at(position)
        except (CorruptIndexError, CorruptRecordError):
            return self.recover(tail_ok=tail_ok, upper=upper)
        return self._recover_range(position, state, offset, tail_ok, upper, prepare=lambda: None)

    def _recover_range(
        self, start: int, state: IndexState, expected_first: int | None, tail_ok: bool, upper: int | None, *, prepare
    ) -> RecoveryResult:
        """Validate batches from `start` (CRC, lengths, offsets), then rebuild the index entries after it.

        Only a torn tail is cut: a bad batch in the active segment (tail_ok) after which no valid batch
        follows, which is what a crash in the middle of an append leaves. Anything else (a bad batch in
        a rolled segment, or one with valid batches after it) is damage to committed data: it raises
        CorruptRecordError naming the file and position, and the .log is left as it is."""
        valid = start
        error = None
        prev_next = expected_first
        entries: list[
            tuple
        ] = []  # (offsets, positions, timestamps, time offsets) to index, applied once all is decided
        try:
            for chunk in self.iter_chunks(start, tail_ok=True):
                try:
                    validate_batches(
                        chunk.buf,
                        chunk.scan,
                        source=self.source,
                        base_position=chunk.base_position,
                        expected_first_offset=prev_next,
                    )
                    self.check_offsets_in_range(chunk, upper)
                    good = len(chunk.scan)
                except CorruptRecordError as e:
                    good = self._valid_prefix(chunk, prev_next, upper)
                    error = e
                if good:
                    state = self._plan_prefix(chunk, good, state, entries)
                    valid = chunk.base_position + int(chunk.scan.positions[good - 1] + chunk.scan.sizes[good - 1])
                    prev_next = int(chunk.scan.last_offsets[good - 1]) + 1
                if error is not None:
                    break
        except CorruptRecordError as e:
            error = e
        if error is None and valid < self._size:
            error = CorruptRecordError("partial batch at the end of the segment", source=self.source, position=valid)
        truncated = self._size - valid
        if truncated:
            if not tail_ok:
                raise CorruptRecordError(
                    f"{error}; this segment is not the active one, so this is not a torn tail "
                    f"and nothing was truncated",
                    source=self.source,
                    position=valid,
                )
            follow = find_valid_batch(
                self._read,
                valid,
                self._size,
                max_batch_size=self.max_batch_size,
                after_offset=None if prev_next is None else prev_next - 1,
            )
            if follow is not None:
                raise CorruptRecordError(
                    f"{error}; a valid batch follows at position {follow}, so this is damage inside committed data, "
                    f"not a torn tail: nothing was truncated (move the segment aside, or cut it at position {valid} "
                    f"to give up the records after it)",
                    source=self.source,
                    position=valid,
                )
        prepare()
        for offs, poss, tss, toffs in entries:
            self.offset_index.append_entries(offs, poss)
            self.time_index.append_entries(tss, toffs)
        if truncated:
            self._truncate_file(valid)
        self._index_state = state
        self._needs_rebuild = False
        # as Kafka's recovery does: a normally closed segment ends with its largest timestamp
        self._append_final_time_entry()
        self.flush()
        return RecoveryResult(valid, truncated, None if error is None else str(error))

    def check_offsets_in_range(self, chunk: BatchChunk, upper: int | None = None) -> None:
        """Raise CorruptRecordError at the first batch whose offsets are below the base offset, do not fit
        a relative offset, or reach `upper` (the next segment's base offset)."""
        base = chunk.scan.headers["base_offset"].astype(np.int64)
        last = chunk.scan.last_offsets
        bad = np.flatnonzero(
            (base < self.base_offset)
            | (last - self.base_offset > INT32_MAX)
            | ((last >= upper) if upper is not None else False)
        )
        if bad.size:
            i = int(bad[0])
            raise CorruptRecordError(
                f"batch offsets {int(base[i])}..{int(chunk.scan.last_offsets[i])} do not fit segment with base "
                f"offset {self.base_offset}" + (f" (the next segment begins at {upper})" if upper is not None else ""),
                source=self.source,
                position=chunk.base_position + int(chunk.scan.positions[i]),
            )

    def _valid_prefix(self, chunk: BatchChunk, expected_first: int | None, upper: int | None = None) -> int:
        """How many leading batches of a chunk pass validation (binary search on the failing one)."""
        lo, hi = 0, len(chunk.scan)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            try:
                part = head(chunk, mid)
                validate_batches(part.buf, part.scan, source=self.source, expected_first_offset=expected_first)
                self.check_offsets_in_range(part, upper)
                lo = mid
            except CorruptRecordError:
                hi = mid - 1
        return lo

    def _plan_prefix(self, chunk: BatchChunk, n: int, state: IndexState, entries: list) -> IndexState:
        s = chunk.scan
        plan = plan_index_entries(
            s.positions[:n] + chunk.base_position,
            s.sizes[:n],
            s.last_offsets[:n],
            s.headers["max_timestamp"][:n].astype(np.int64),
            self.index_interval_bytes,
            state,
        )
        entries.append((*plan.offset_entries, *plan.time_entries))
        return plan.state

    def _truncate_file(self, size: int) -> None:
        if self._appender is not None:
            self._appender.truncate(size)
        else:
            self.fs.truncate(self.log_path, size)
        self._size = size
        if size == 0:
            self._rolling_based_timestamp = None

    def truncate_to(self, offset: int) -> int:
        """Drop batches from the one holding `offset`; returns bytes removed. Truncation is by whole batches."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        header, position = found
        if header.base_offset < offset:
            raise ValueError(
                f"offset {offset} is inside batch {header.base_offset}..{header.last_offset} of "
                f"{self.source}; truncation is by whole batches"
            )
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        removed = self._size - position
        self._truncate_file(position)
        self._index_state = None
        return removed

    # ------------------------------------------------------------------ files
    def files(self) -> list[str]:
        """The segment's files; the last, its `.txnindex`, exists only if a transaction aborted in it."""
        return [self.log_path, self.offset_index.path, self.time_index.path, self.txn_index_path]

    def change_file_suffixes(self, old: str, new: str) -> None:
        """Rename all its files that exist, e.g. '' -> '.deleted' or '.cleaned' -> '.swap'."""
        self.close()
        for attr in ("log_path", "txn_index_path"):
            src = getattr(self, attr)
            dst = src[: len(src) - len(old)] + new if old else src + new
            if self.fs.exists(src):
                self.fs.rename(src, dst)
            setattr(self, attr, dst)
        for index in (self.offset_index, self.time_index):
            src = index.path
            dst = src[: len(src) - len(old)] + new if old else src + new
            if self.fs.exists(src):
                self.fs.rename(src, dst)
            index.path = dst
        self.file_suffix = new

    def delete(self) -> None:
        self.close()
        for path in self.files():
            self.fs.delete(path)
