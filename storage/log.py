"""Log: one partition's ordered segments. Append with offset assignment and rolling, read by offset,
find offsets by timestamp, truncate, and move logStartOffset (Kafka's UnifiedLog + LocalLog)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # Arrow is loaded by the reads that decode, not by a process that only appends
    import pyarrow

    from .transactions.producer_table import ProducerTable

from .common.time import SYSTEM_TIME
from .errors import CorruptIndexError, KafkaLogError, KafkaStorageError, OffsetOutOfRangeError
from .fs.filesystem import LogFileSystem
from .log_appender import InPlaceAppender, LogAppender, LogSegments
from .log_config import LogConfig
from .log_segment import BatchChunk, LogSegment, segment_settings
from .log_validator import (
    assign_offsets,
    check_built,
    check_timestamps,
    maybe_recompress,
    stamp_log_append_time,
    validate_input,
)
from .objects.immutable_segment import immutable_segments
from .objects.object_appender import ObjectAppender
from .objects.segment_metadata import largest_timestamp
from .records.record_batch import BatchScan
from .topic_partition import DELETED_FILE_SUFFIX, TopicPartition
from .transactions.isolation import READ_COMMITTED, parse_isolation_level
from .transactions.transaction_index import TransactionIndex
from .transactions.transaction_view import TransactionView

log = logging.getLogger(__name__)
# a writer's close snapshots only when this many offsets came after the latest snapshot (or there is none):
# a sink closes its writer at every commit, Kafka its log only at shutdown (Log._close_snapshot_due)
CLOSE_SNAPSHOT_MIN_OFFSETS = 50_000


@dataclass(frozen=True)
class StagedSegment:
    """A finished segment of a staging Log (see Log.adopt_segments): where it is and its batches."""

    dir: str
    base_offset: int  # offsets in the staging log start at 0
    next_offset: int
    size: int
    positions: np.ndarray  # byte position of every batch
    base_offsets: np.ndarray  # baseOffset of every batch, as staged
    max_timestamp: int


@dataclass
class LogAppendInfo:
    """What an append wrote: offsets, timestamps, counts and bytes."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    num_batches: int
    num_records: int
    valid_bytes: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime


@dataclass(frozen=True)
class RecordCounts:
    """What offsets [start, end) of a partition hold: data records (what a consumer is handed), control records
    (transaction markers, one offset each, never handed out) and offsets neither uses (compaction's gaps, aborted
    data at read_committed, the part of a batch outside the range)."""

    start: int
    end: int
    records: int
    markers: int

    @property
    def offsets(self) -> int:
        return self.end - self.start


class Log:
    """A partition's log: its segments in base offset order, the offsets around them (logStartOffset,
    recovery point, log end offset), appends with offset assignment and rolling, reads by offset and
    by timestamp, truncation.

    Invariants: there is always at least one segment; base offsets strictly increase; the last
    segment is the active one, the only one appended to, and every other one is rolled; the log end
    offset is the offset after the last batch of the active segment (or its base offset, empty);
    logStartOffset <= recovery point <= log end offset for a writer.

    One writer per partition: only a writable Log appends, truncates or deletes segments, and it is
    made so by the LogLoader, which holds the partition's lock file for it (on an object store with
    no locks, the create-only write of every segment object keeps writers apart instead; see
    ObjectAppender). How segments grow is that protocol's LogAppender, chosen here once: in place
    (storage/log_appender.py) or one object per append (storage/objects/object_appender.py).

    Thread safety: a Log is not thread-safe (its segments keep open readers); each thread or process
    uses its own. Any number of reader Logs in other threads and processes may read the same
    partition while its writer appends: they see whole batches up to the log end offset they
    loaded, and a segment retention or a swap removes under them is read from its `.deleted` or
    `.swap` files (LogSegment.open_readers).
    """

    def __init__(
        self,
        fs: LogFileSystem,
        dir: str,
        tp: TopicPartition,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        next_offset: int,
        writable: bool,
        lock: contextlib.ExitStack | None = None,
        on_close=None,
        tail_error: Exception | None = None,
        dir_changed: bool = True,
        track_batches: bool = False,
        bulk_writes: bool = False,
    ):
        """tail_error: a reader's, when the last segment ends in a damaged batch (LogSegment.scan_tail);
        dir_changed: directory entries changed since it was last fsynced (the next flush syncs it);
        track_batches, bulk_writes: a staging log's writer modes (InPlaceAppender)."""
        self.fs = fs
        self.dir = dir
        self.tp = tp
        self.config = config
        self._segments = LogSegments(segments)
        self._appender: LogAppender
        if immutable_segments(fs):  # no append or no locks: every append is one new segment object
            self._appender = ObjectAppender(fs, dir, tp, config, self._segments)
        else:
            self._appender = InPlaceAppender(
                fs,
                dir,
                tp,
                config,
                self._segments,
                dir_changed=dir_changed,
                track_batches=track_batches,
                bulk_writes=bulk_writes,
            )
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._next_offset = next_offset
        self.writable = writable
        self._lock = lock
        self._on_close = on_close  # LogManager records the checkpoints when a writer closes
        self._producer_state = None  # a writer's ProducerStateManager (attach_producer_state)
        self._tail_error = tail_error
        self._opened_log_start = log_start_offset
        self._unflushed_messages = 0
        self._last_flush_ms = SYSTEM_TIME.milliseconds()
        self.closed = False
        self._transactions = TransactionView(self, self._segments)  # the read_committed side, loaded on first use
        self._producers: ProducerTable | None = None  # a writer's producer table, loaded by the first snapshot
        self._producers_seen = False  # an append of this writer carried a producer id
        self._snapshots_listed = False  # the directory was listed for snapshots (logs with no producer id)

    def attach_producer_state(self, producer_state) -> None:
        """Give a writer its ProducerStateManager (made by the loader from this Log)."""
        self._producer_state = producer_state

    def call_on_close(self, callback) -> None:
        """Have `callback(log)` run when this writer closes (LogManager records the checkpoints)."""
        self._on_close = callback

    def record_checkpoints(self) -> None:
        """Run the close callback now, if there is one (object-store retention checkpoints the new log
        start offset before deleting anything)."""
        if self._on_close is not None:
            self._on_close(self)

    # ------------------------------------------------------------------ state
    @property
    def segments(self) -> list[LogSegment]:
        return self._segments.to_list()

    @property
    def active_segment(self) -> LogSegment:
        return self._segments.last

    @property
    def immutable(self) -> bool:
        """Whether segments are whole objects made by one create-only write each (ObjectAppender)."""
        return self._appender.immutable

    @property
    def producer_state(self):
        return self._producer_state

    @property
    def tail_error(self) -> Exception | None:
        """A reader's: the last segment ends in a damaged batch (LogSegment.scan_tail); None otherwise."""
        return self._tail_error

    @property
    def log_end_offset(self) -> int:
        """The offset after the last valid batch. A reader whose last segment ends in a damaged batch
        raises that error instead: the true log end is unknown."""
        if self._tail_error is not None:
            raise self._tail_error
        return self._next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    def segment_for(self, offset: int) -> LogSegment | None:
        """The segment with the largest base offset <= offset (Kafka's floorEntry)."""
        return self._segments.floor(offset)

    def segment_kwargs(self) -> dict:
        return segment_settings(self.config)

    @property
    def max_batch_size(self) -> int:
        return self.config.max_message_bytes

    def __repr__(self) -> str:
        return (
            f"Log({self.tp.topic}-{self.tp.partition}, logStartOffset={self.log_start_offset}, "
            f"logEndOffset={self._next_offset}, segments={len(self._segments)})"
        )

    # ------------------------------------------------------------------ appending
    def _require_writable(self) -> None:
        if not self.writable or self.closed:
            raise KafkaStorageError(f"{self.tp.topic}-{self.tp.partition} is not open for writing")
        if self._appender.lost_race:
            raise KafkaStorageError(
                f"{self.tp.topic}-{self.tp.partition}: another writer appended since this log "
                f"was opened (ConcurrentAppendError); reopen it to append"
            )

    def append(self, records, *, now: int | None = None, built: BatchScan | None = None) -> LogAppendInfo:
        """Append encoded batches (offsets in them are ignored): validate, assign offsets, roll, index.

        Batches are re-encoded only when the topic's compression.type differs from theirs, and stamped
        with the append time when message.timestamp.type is LogAppendTime. A bytearray or uint8 array
        is taken over and patched in place (offsets are assigned in it); anything else is copied first.
        `built` is the scan encode_records returned with these very bytes: framing and CRCs, which
        that encoder just wrote, are then not checked again (only the batch size limit is).
        """
        self._require_writable()
        now = SYSTEM_TIME.milliseconds() if now is None else now
        where = f"append to {self.tp.topic}-{self.tp.partition}"
        if isinstance(records, bytearray) or (
            isinstance(records, np.ndarray)
            and records.dtype == np.uint8
            and records.flags.writeable
            and records.flags.c_contiguous
        ):
            buf = records
        else:
            buf = bytearray(records)
        if built is None:
            scan = validate_input(buf, self.max_batch_size, where)
        else:
            scan = check_built(built, len(buf), self.max_batch_size, where)
        if not len(scan):
            return LogAppendInfo(self._next_offset, self._next_offset - 1, -1, -1, 0, 0, 0, -1)
        buf, scan = maybe_recompress(buf, scan, self.config, where)
        check_timestamps(buf, scan, self.config, now, where)
        base_offsets = assign_offsets(buf, scan, self._next_offset)
        append_time = -1
        if self.config.message_timestamp_type == "LogAppendTime":
            append_time = now
            scan = stamp_log_append_time(buf, scan, now, self.max_batch_size)
        active_base = self._segments.last.base_offset
        self._appender.append(buf, scan, next_offset=self._next_offset, now=now, producer_state=self._producer_state)
        last_offsets = scan.last_offsets
        if not self._producers_seen:
            self._producers_seen = bool((scan.headers["producer_id"] >= 0).any())
        max_ts = scan.headers["max_timestamp"].astype(np.int64)
        j = int(np.argmax(max_ts))
        self._next_offset = int(last_offsets[-1]) + 1
        n_records = int(scan.headers["record_count"].astype(np.int64).sum())
        if self._segments.last.base_offset != active_base:  # rolled: a snapshot at each new segment's base
            for seg in self._segments.in_range(active_base + 1, self._next_offset):
                if seg.base_offset > active_base:
                    self._take_producer_snapshot(seg.base_offset)
        self._unflushed_messages += n_records
        self._maybe_flush(now)
        return LogAppendInfo(
            int(base_offsets[0]),
            int(last_offsets[-1]),
            int(max_ts[j]),
            int(last_offsets[j]),
            len(scan),
            n_records,
            scan.end,
            append_time,
        )

    def roll(self, new_base_offset: int | None = None) -> LogSegment:
        """Close the active segment to appends and start a new one at the next offset (on an object
        store the new segment is empty and exists only in memory until an append creates it)."""
        self._require_writable()
        seg = self._appender.roll(self._next_offset if new_base_offset is None else new_base_offset)
        self._take_producer_snapshot(seg.base_offset)
        return seg

    def _drop_superseded_snapshot(self, previous: int | None, offset: int) -> None:
        """A writer opened per commit closes once per commit: its close snapshot inside the active segment
        replaces the previous one there (not a segment base's), so one segment keeps at most two snapshots
        (its base's and the latest) however many writers closed in it."""
        if previous is not None and self.active_segment.base_offset < previous < offset:
            from .transactions.producer_snapshot import snapshot_file_name

            self.fs.delete_many([self.fs.join(self.dir, snapshot_file_name(previous))])

    def _snapshot_adopted(self, first: int, staged: list[StagedSegment]) -> None:
        """Each adopted segment is a roll: a producer snapshot at its base offset. Whether they hold producer
        batches is read from each one's first batch header (a commit stamps all of its batches alike). The
        producer table advances over an adopted segment by its batch headers alone (one read per batch at the
        staged positions), not by reading its records back."""
        from .file_records import read_batch_headers
        from .objects.immutable_segment import read_first_header

        adopted = [seg for seg in self._segments if seg.base_offset >= first]
        if not self._producers_seen:
            for seg in adopted:
                header = read_first_header(self.fs, seg.log_path)
                if header is not None and header.producer_id >= 0:
                    self._producers_seen = True
                    break
        positions = {first + s.base_offset: s.positions for s in staged}
        for seg in adopted:
            self._take_producer_snapshot(seg.base_offset)
            table = self._producers
            if table is not None and table.as_of == seg.base_offset and seg.base_offset in positions:
                headers = read_batch_headers(self.fs, seg.log_path, positions[seg.base_offset])
                table.feed_headers(headers, self.fs.url(seg.log_path))

    def _close_snapshot_due(self) -> bool:
        """Kafka snapshots at a clean shutdown, which is rare; a sink's writer closes at every commit. So a close
        writes one only when the partition has none yet, or CLOSE_SNAPSHOT_MIN_OFFSETS or more offsets came
        after the latest: a reader then scans at most that many offsets of headers past a snapshot (rolls
        snapshot as Kafka does, always)."""
        if self._producers is not None and self._producers.snapshot_offset is not None:
            latest = self._producers.snapshot_offset
        else:
            from .transactions.producer_snapshot import list_snapshots

            snapshots = list_snapshots(self.fs, self.dir)
            if not snapshots:
                return self._producers_seen  # the first snapshot of a partition with producer batches
            latest = snapshots[-1].offset
        return self._next_offset - latest >= CLOSE_SNAPSHOT_MIN_OFFSETS

    def _take_producer_snapshot(self, offset: int) -> None:
        """Write `<offset>.snapshot` as Kafka does at a roll (the new segment's base offset) and a clean close
        (the log end), when this partition holds producer batches: one this writer appended, or a snapshot
        already there. A log that never saw a producer id costs one directory listing per writer. A snapshot is
        only a loader's shortcut: when the table cannot be built (TooManyProducersError, a damaged batch) the
        error is logged and the roll, append or close goes on."""
        if self.immutable or offset > self._next_offset:
            return
        if self._producers is None:
            from .transactions.producer_snapshot import list_snapshots
            from .transactions.producer_table import ProducerTable

            if not self._producers_seen:
                if self._snapshots_listed:
                    return
                self._snapshots_listed = True
                snapshots = list_snapshots(self.fs, self.dir)
                if not snapshots or snapshots[-1].offset == offset:
                    return  # no producer batch known, or that snapshot is already written
            try:
                self._producers = ProducerTable.load(self, offset)
            except KafkaLogError as e:  # too many producers, a damaged batch or index: no snapshot
                log.error("no producer snapshot at offset %d: %s", offset, e)
                return
        try:
            previous = self._producers.snapshot_offset
            if self._producers.take_snapshot(self, offset, self._index_aborted) is not None:
                self._drop_superseded_snapshot(previous, offset)
        except KafkaLogError as e:
            log.error("no producer snapshot at offset %d: %s", offset, e)
            self._producers = None

    def adopt_segments(self, staged: list[StagedSegment]) -> LogAppendInfo:
        """Append whole segments a staging Log wrote (offsets from 0, indexes built): roll, patch each
        batch's baseOffset in place, rename the files in. Nothing is copied, so a big commit costs a
        few renames; index entries are relative to the segment base, so they move unchanged.
        The caller made the staged bytes durable; the patched headers and the directory are synced here."""
        self._require_writable()
        first = self._next_offset
        self._appender.adopt_segments(staged, first)
        if not staged:
            return LogAppendInfo(self._next_offset, self._next_offset - 1, -1, -1, 0, 0, 0, -1)
        self._next_offset = first + staged[-1].next_offset
        self.flush()
        self._snapshot_adopted(first, staged)
        max_ts = [s.max_timestamp for s in staged]
        j = int(np.argmax(max_ts))
        return LogAppendInfo(
            first,
            self._next_offset - 1,
            max_ts[j],
            -1,
            sum(len(s.positions) for s in staged),
            -1,
            sum(s.size for s in staged),
            -1,
        )

    def _maybe_flush(self, now: int) -> None:
        """Flush every append unless the topic sets flush.messages / flush.ms (no replicas to lean on)."""
        if self.config.flush_overridden:
            due = (
                self._unflushed_messages >= self.config.flush_messages
                or now - self._last_flush_ms >= self.config.flush_ms
            )
            if not due:
                return
        self.flush()

    def flush(self) -> None:
        """fsync the log and index bytes of every segment with unflushed data, then the directory."""
        if not self.writable:
            return
        self._appender.flush()
        self.recovery_point = self._next_offset
        self._unflushed_messages = 0
        self._last_flush_ms = SYSTEM_TIME.milliseconds()

    def close(self) -> None:
        """Flush, snapshot (when due) and checkpoint a writer's work, close the files; the lock goes in every
        case, as it would with the process (a failed close leaves what a crash there leaves)."""
        if self.closed:
            return
        try:
            if self.writable:
                self._appender.close()
                self.flush()
                if not self._appender.lost_race and self._close_snapshot_due():
                    self._take_producer_snapshot(self._next_offset)  # Kafka's snapshot at a clean close
            for seg in self._segments:
                seg.close()
            self.closed = True
            # without recovery the recovery point is not worth a checkpoint write; the log start offset
            # still is, when it moved
            record = self._appender.needs_recovery_point or self.log_start_offset != self._opened_log_start
            if self.writable and record and not self._appender.lost_race:
                self.record_checkpoints()
        finally:
            self._release_lock()

    def release(self, *, fsync: bool) -> None:
        """Close every segment's files and the Log, without close()'s final time index entry, flush
        and checkpoints: a staging log handed over as it is (adopted, copied or dropped)."""
        for seg in self._segments:
            seg.close(fsync=fsync)
        self.closed = True
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def _check_fetch_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self._next_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.tp.topic}-{self.tp.partition}: "
                f"log start offset {self.log_start_offset}, log end offset {self._next_offset}"
            )

    def read(self, start_offset: int, max_offset: int | None = None) -> Iterator[BatchChunk]:
        """Chunks of whole batches holding offsets [start_offset, max_offset) (end: the log end)."""
        self._check_fetch_offset(start_offset)
        end = self._next_offset if max_offset is None else min(max_offset, self._next_offset)
        if start_offset >= end:
            return
        i = max(0, self._segments.floor_index(start_offset))
        offset = start_offset
        for k in range(i, len(self._segments)):
            seg = self._segments[k]
            if seg.base_offset >= end:
                break
            upper = self._segments[k + 1].base_offset if k + 1 < len(self._segments) else None
            try:
                yield from seg.read_batches(max(offset, seg.base_offset), end, upper=upper)
            finally:
                if seg is not self._segments.last:
                    seg.release_readers()  # one segment's files open at a time
        if self._tail_error is not None and (max_offset is None or max_offset > self._next_offset):
            raise self._tail_error  # everything before the damage was served; the damage is not skipped

    def read_records(
        self,
        start_offset: int,
        max_offset: int | None = None,
        *,
        skip_control: bool = True,
        isolation_level: str = "read_uncommitted",
    ) -> Iterator[pyarrow.RecordBatch]:
        """Decoded records in [start_offset, max_offset) as Arrow batches (decoder.RECORD_SCHEMA), with
        memory bounded by decoder.DECODE_BUDGET_BYTES plus one batch, whatever the batches hold.

        read_committed (Kafka's consumer at that isolation level): stops at the last stable offset and drops
        the transactional batches of aborted transactions, each batch's fate read from its producer's next
        marker in the log (transaction_fates.TransactionFates), not from the `.txnindex` hints."""
        from .records.decoder import iter_decoded

        committed = parse_isolation_level(isolation_level, "isolation_level") == READ_COMMITTED
        fates = None
        if committed:
            self._check_fetch_offset(start_offset)
            lso = self.last_stable_offset
            max_offset = lso if max_offset is None else min(max_offset, lso)
            if start_offset >= max_offset:
                return
            fates = self._transactions.fates(self._next_offset)
        served_below = 0  # everything yielded lies below it
        for chunk in self.read(start_offset, max_offset):
            keep = None
            checked = False  # the chunk's CRCs already checked (by the fates)
            if fates is not None and max_offset is not None:
                drop, open_at, checked = fates.feed(chunk)
                if open_at is not None and open_at < max_offset:  # the state missed an open transaction
                    found = self._transactions.open_transaction_found(open_at, served_below, self._next_offset)
                    max_offset = min(max_offset, found)
                keep = ~drop
            for batch in iter_decoded(
                chunk.buf,
                scan=chunk.scan,
                source=chunk.source,
                base_position=chunk.base_position,
                max_message_bytes=self.max_batch_size,
                verify_crc=not checked,
                min_offset=start_offset,
                max_offset=max_offset,
                skip_control=skip_control,
                keep=keep,
            ):
                if batch.num_rows:
                    yield batch
            last = chunk.scan.headers[-1]
            served_below = int(last["base_offset"]) + int(last["last_offset_delta"]) + 1
            if max_offset is not None and served_below >= max_offset:
                return

    def count_records(
        self,
        start_offset: int | None = None,
        max_offset: int | None = None,
        *,
        isolation_level: str = "read_uncommitted",
    ) -> RecordCounts:
        """Data records and transaction markers at offsets [start_offset (log start), max_offset (log end)), as a
        consumer at `isolation_level` sees them (read_committed: up to the last stable offset, aborted data left
        out). From batch headers, every batch's CRC checked; a data batch that straddles the range is decoded."""
        from .file_records import select_batches
        from .records.record_batch import CONTROL_FLAG_MASK
        from .transactions.transaction_fates import check_crcs

        start = self.log_start_offset if start_offset is None else start_offset
        end = self._next_offset if max_offset is None else min(max_offset, self._next_offset)
        fates = None
        if parse_isolation_level(isolation_level, "isolation_level") == READ_COMMITTED:
            end = min(end, self.last_stable_offset)
            fates = self._transactions.fates(self._next_offset)
        records = markers = served_below = 0
        if start >= end:
            return RecordCounts(start, max(start, end), 0, 0)
        for chunk in self.read(start, end):
            check_crcs(chunk, len(chunk.scan))
            h = chunk.scan.headers
            keep = np.ones(len(h), bool)
            if fates is not None:  # as read_records decides what a read_committed consumer is handed
                drop, open_at, _ = fates.feed(chunk)
                if open_at is not None and open_at < end:  # the state missed an open transaction
                    end = min(end, self._transactions.open_transaction_found(open_at, served_below, self._next_offset))
                keep = ~drop
            base = h["base_offset"].astype(np.int64)
            last = base + h["last_offset_delta"].astype(np.int64)
            counts = h["record_count"].astype(np.int64)
            control = (h["attributes"].astype(np.int64) & CONTROL_FLAG_MASK) != 0
            inside = (base >= start) & (last < end)
            markers += int(counts[control & inside].sum())
            records += int(counts[~control & inside & keep].sum())
            for i in np.flatnonzero(~control & ~inside & keep & (last >= start) & (base < end)).tolist():
                records += self._records_in(select_batches(chunk, i, i + 1), start, end)
            served_below = int(last[-1]) + 1
            if served_below >= end:
                break
        return RecordCounts(start, end, records, markers)

    def _records_in(self, one: BatchChunk, start: int, end: int) -> int:
        """Records of a one-batch chunk with offsets in [start, end)."""
        from .records.decoder import iter_decoded

        decoded = iter_decoded(
            one.buf,
            scan=one.scan,
            source=one.source,
            base_position=one.base_position,
            max_message_bytes=self.max_batch_size,
            min_offset=start,
            max_offset=end,
        )
        return sum(b.num_rows for b in decoded)

    # ------------------------------------------------------------------ transactions (read side)
    @property
    def last_stable_offset(self) -> int:
        """The first offset of the earliest transaction still open in this partition, else the log end offset
        (Kafka's UnifiedLog.lastStableOffset). Worked out on first use, from the latest producer snapshot and a
        scan of batch headers after it (transaction_view.TransactionView), and kept: a reader that never asks
        pays nothing."""
        if self._tail_error is not None:
            raise self._tail_error
        return self._transactions.last_stable_offset(self._next_offset)

    def txn_index(self, seg: LogSegment) -> TransactionIndex:
        """The `.txnindex` of a segment of this log (opened once; read on first use)."""
        return self._transactions.txn_index(seg)

    def segment_aborted_txns(self, seg: LogSegment) -> np.ndarray:
        """The aborted transactions whose ABORT marker is in `seg` (ABORTED_TXN_DTYPE rows): its `.txnindex`, or
        what the log holds where that is missing or bad. What a rewrite of the segment must carry over."""
        return self._transactions.segment_aborted_txns(seg, self._next_offset)

    def collect_aborted_txns(
        self, start_offset: int, upper_bound_offset: int, *, max_entries: int | None = None
    ) -> np.ndarray:
        """The aborted transactions (ABORTED_TXN_DTYPE rows) overlapping [start_offset, upper_bound_offset)
        (Kafka's UnifiedLog.collectAbortedTransactions; see TransactionView.collect_aborted_txns)."""
        return self._transactions.collect_aborted_txns(
            start_offset, upper_bound_offset, self._next_offset, max_entries=max_entries
        )

    def offset_for_timestamp(self, timestamp: int, *, isolation_level: str = "read_uncommitted") -> int | None:
        """Earliest offset whose record timestamp >= timestamp, or None (Kafka's ListOffsets by time).
        read_committed: None too when that offset is at or past the last stable offset (as Kafka's
        Partition.fetchOffsetForTimestamp).

        Control records count, as in Kafka's FileRecords.searchForTimestamp: a transaction marker carries
        the broker's clock, so the answer may be a marker's offset (a reader starting there skips it).
        The first segment whose largest timestamp reaches it holds the answer; on an object store the
        partition's hint object gives the segments' largest timestamps (segment_metadata.py), so only
        segments it does not cover cost a `.timeindex` read."""
        from .records.decoder import decode_batches

        def decode(buf, scan):
            return decode_batches(buf, scan=scan, max_message_bytes=self.max_batch_size, skip_control=False)

        committed = parse_isolation_level(isolation_level, "isolation_level") == READ_COMMITTED
        found = self._offset_for_timestamp(timestamp, decode)
        if committed and found is not None and found >= self.last_stable_offset:
            return None
        return found

    def _offset_for_timestamp(self, timestamp: int, decode) -> int | None:
        known = self.segment_metadata()
        start = self.log_start_offset
        for seg in self._segments:
            if seg.base_offset < start and seg is not self.segment_for(start):
                continue
            try:
                if largest_timestamp(seg, known) < timestamp:
                    continue
                found = seg.find_offset_by_timestamp(timestamp, max(start, seg.base_offset), decode)
            finally:
                if seg is not self._segments.last:
                    seg.release_readers()
            if found is not None:
                return found
        return None

    def segment_metadata(self) -> dict:
        """Base offset -> SegmentMetadata from the partition's hint object (immutable logs; read once
        per Log); {} elsewhere or when there is none."""
        return self._appender.segment_metadata(self._producer_state)

    def split_points(self, start: int, end: int) -> list[int]:
        """Offsets in (start, end) where a reader may split the range without sharing a batch:
        segment base offsets and the batch starts the offset indexes record (entry offset + 1)."""
        points = []
        for i, seg in enumerate(self._segments):
            if seg.base_offset >= end:
                break
            if i + 1 < len(self._segments) and self._segments[i + 1].base_offset <= start:
                continue  # wholly before the range
            if seg.base_offset > start:
                points.append(seg.base_offset)
            try:
                entries = seg.offset_index.entry_array(0)
            except CorruptIndexError:  # an unreadable index only costs split points
                continue
            finally:
                if seg is not self._segments.last:
                    seg.release_readers()
            offs = seg.base_offset + entries["relative_offset"].astype(np.int64) + 1
            points.extend(offs[(offs > start) & (offs < end)].tolist())
        return sorted(set(points))

    # ------------------------------------------------------------------ truncation and log start
    def truncate_to(self, offset: int) -> None:
        """Remove every record at or above `offset` (whole batches; see LogSegment.truncate_to)."""
        self._require_writable()
        if offset >= self._next_offset:
            return
        if offset < self.log_start_offset:
            raise OffsetOutOfRangeError(
                f"cannot truncate {self.tp.topic}-{self.tp.partition} to {offset}, "
                f"below the log start offset {self.log_start_offset}"
            )
        while len(self._segments) > 1 and self._segments.last.base_offset >= offset:
            self._appender.delete_segment(self._segments.remove_last())
        self.active_segment.truncate_to(offset)
        self._next_offset = offset
        self.recovery_point = min(self.recovery_point, offset)
        self.flush()
        self._delete_snapshots_after(offset)

    def _index_aborted(self, txns) -> None:
        """Put in its segment's `.txnindex` each aborted transaction (AbortedTxn) it lacks, durably: Kafka appends
        the entry with the ABORT marker, and a producer snapshot above it tells a loader the index is whole. The
        sink's coordinator has written its own already; markers appended by other means get theirs here."""
        by_segment: dict[int, list] = {}
        for txn in txns:
            seg = self.segment_for(txn.last_offset)
            if seg is not None:
                by_segment.setdefault(seg.base_offset, []).append(txn)
        for base, found in by_segment.items():
            index = TransactionIndex.for_segment(self.fs, self.dir, base)
            try:
                have = set(index.entries()["last_offset"].astype(np.int64).tolist())
                last = index.last_offset
                for txn in found:
                    if txn.last_offset in have:
                        continue
                    if last is not None and txn.last_offset < last:
                        raise CorruptIndexError(
                            f"transaction index {self.fs.url(index.path)} lacks the abort {txn} the log holds, "
                            f"below its last entry"
                        )
                    index.append(txn)
                    last = txn.last_offset
                index.flush()
            finally:
                index.close()
            self._transactions.forget_index(base)  # a reader's cached copy is reread

    def _delete_snapshots_after(self, offset: int) -> None:
        """Truncation: the producer snapshots above the new log end go (Kafka's truncateAndReload), and the
        producer table with them when it is past it (the next snapshot reloads it)."""
        from .transactions.producer_snapshot import list_snapshots

        if self._producers is not None and self._producers.as_of > offset:
            self._producers = None
        if not self.immutable:
            self.fs.delete_many([s.path for s in list_snapshots(self.fs, self.dir) if s.offset > offset])

    def _delete_snapshots_below_log_start(self) -> None:
        """Retention or delete-records moved the log start: the producer snapshots below it go (Kafka deletes
        those of the deleted segments; every one below the log start is one its loader would not use)."""
        from .transactions.producer_snapshot import delete_snapshots_before

        if self._producers is not None and self._producers.as_of < self.log_start_offset:
            self._producers = None
        if not self.immutable:
            delete_snapshots_before(self.fs, self.dir, self.log_start_offset)

    def maybe_increment_log_start_offset(self, new_start: int) -> bool:
        """Move logStartOffset up (delete-records); segments wholly below it go at the next retention pass."""
        self._require_writable()
        if new_start > self._next_offset:
            raise OffsetOutOfRangeError(
                f"cannot move the log start offset of {self.tp.topic}-{self.tp.partition} to {new_start}, "
                f"beyond the log end offset {self._next_offset}"
            )
        if new_start <= self.log_start_offset:
            return False
        self.log_start_offset = new_start
        self._delete_snapshots_below_log_start()
        return True

    # ---- retention support
    def delete_oldest_segments(self, count: int) -> list[LogSegment]:
        """Drop the `count` oldest segments (Kafka's deleteSegments): when that is every segment, roll first so
        one remains; remove them from the live list, rename their files to `.deleted` (touched, so
        file.delete.delay.ms counts from now) and advance logStartOffset to the new first segment."""
        self._require_writable()
        if count <= 0:
            return []
        if count >= len(self._segments):
            self.roll()  # an empty active segment at the log end stays as it is (Kafka's isLastSegmentAndEmpty)
        count = min(count, len(self._segments) - 1)
        doomed = self._segments.remove_first(count)
        for seg in doomed:
            seg.change_file_suffixes("", DELETED_FILE_SUFFIX)
            for path in seg.files():
                if self.fs.exists(path):
                    self.fs.touch(path)  # a rename keeps the old mtime; the delay counts from the deletion
        if doomed and self.fs.capabilities.fsync:
            self.fs.sync_dir(self.dir)
        self.log_start_offset = max(self.log_start_offset, self._segments[0].base_offset)
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        if doomed:
            self._delete_snapshots_below_log_start()
        return doomed

    # ---- compaction support
    def segments_in_range(self, start: int, end: int) -> list[LogSegment]:
        """Segments that may hold offsets in [start, end) (Kafka's logSegments(from, to)): the one
        holding `start` (its floor) and every later one whose base offset is below `end`."""
        return self._segments.in_range(start, end)

    def non_active_segments_from(self, offset: int) -> list[LogSegment]:
        """Kafka's nonActiveLogSegmentsFrom: segments from the one holding `offset` up to the active one."""
        return self.segments_in_range(offset, self.active_segment.base_offset)

    def swap_in_memory(self, new_segments: list[LogSegment], old_segments: list[LogSegment]) -> None:
        """Put swapped-in segments in place of the ones they replace in the segment list, once the
        files (or objects) already say so: the last step of every swap (storage/segment_swap.py)."""
        for seg in new_segments:
            seg.mark_rolled()
        self._segments.replace(new_segments, old_segments)

    def remove_segments(self, segments: list[LogSegment]) -> None:
        """Take segments whose objects retention deleted out of the segment list (object stores)."""
        self._segments.remove(segments)

    def advance_log_start_offset(self, new_start: int) -> None:
        """Move logStartOffset, and the recovery point with it, up to `new_start` without the partition
        lock: retention on object stores, where every holder of the Log may run it (see
        log_retention.delete_old_segment_objects)."""
        if new_start > self.log_start_offset:
            self.log_start_offset = new_start
            self.recovery_point = max(self.recovery_point, new_start)
