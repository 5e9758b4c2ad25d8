"""Log: one partition's ordered segments. Append with offset assignment and rolling, read by offset,
find offsets by timestamp, truncate, and move logStartOffset (Kafka's UnifiedLog + LocalLog)."""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # Arrow is loaded by the reads that decode, not by a process that only appends
    import pyarrow

from .errors import ConcurrentAppendError, CorruptIndexError, KafkaStorageError, OffsetOutOfRangeError
from .fs.filesystem import LogFileSystem
from .log_config import LogConfig
from .log_segment import BatchChunk, LogSegment, segment_settings, select_batches
from .log_validator import (
    assign_offsets,
    check_built,
    check_timestamps,
    maybe_recompress,
    stamp_log_append_time,
    validate_input,
)
from .objects.immutable_segment import create_segment_object, immutable_segments
from .objects.segment_metadata import largest_timestamp
from .producer_state import read_hint
from .records.record_batch import BatchScan
from .topic_partition import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TopicPartition,
    segment_file_name,
)

log = logging.getLogger(__name__)


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


def now_ms() -> int:
    return int(time.time() * 1000)


class Log:
    """A partition's log. Readers share it freely; only a writable Log (holding the partition lock) appends."""

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
    ):
        self.fs = fs
        self.dir = dir
        self.tp = tp
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        # no append or no locks: every append is one new segment object made with a create-only write
        self.immutable = immutable_segments(fs)
        for seg in segments[:-1]:
            seg.rolled = True
        if self.immutable and segments and segments[-1].size:  # a segment object is complete, indexes too
            segments[-1].rolled = True
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._next_offset = next_offset
        self.writable = writable
        self._lock = lock
        self._on_close = on_close  # LogManager records the checkpoints when a writer closes
        self.producer_state = None  # a writer's ProducerStateManager, set by the loader
        self.track_batches = False  # a staging log records batch positions for adopt_segments
        self.bulk_writes = False  # ... and writes its segments past the OS cache (LogSegment.bulk_writes)
        self._segment_metadata: dict | None = None  # an immutable log's hint entries (segment_metadata.py)
        self._lost_race = False  # an immutable append lost its segment name: this Log's view is stale
        self.tail_error = None  # a reader's: the last segment ends in a damaged batch (LogSegment.scan_tail)
        self._opened_log_start = log_start_offset
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self.dir_changed = True  # entries made, renamed or removed since the directory was last fsynced
        self.closed = False

    # ------------------------------------------------------------------ state
    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def log_end_offset(self) -> int:
        """The offset after the last valid batch. A reader whose last segment ends in a damaged batch
        raises that error instead: the true log end is unknown."""
        if self.tail_error is not None:
            raise self.tail_error
        return self._next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self._segments)

    def segment_for(self, offset: int) -> LogSegment | None:
        """The segment with the largest base offset <= offset (Kafka's floorEntry)."""
        i = bisect.bisect_right(self._bases, offset) - 1
        return self._segments[i] if i >= 0 else None

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
        if self._lost_race:
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
        now = now_ms() if now is None else now
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
        if self.immutable:
            self._append_object(buf, scan)
        else:
            self._append_runs(buf, scan, now)
        last_offsets = scan.last_offsets
        max_ts = scan.headers["max_timestamp"].astype(np.int64)
        j = int(np.argmax(max_ts))
        self._next_offset = int(last_offsets[-1]) + 1
        n_records = int(scan.headers["record_count"].astype(np.int64).sum())
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

    def _append_runs(self, buf: bytearray, scan: BatchScan, now: int) -> None:
        """Group consecutive batches per segment, rolling where Kafka's shouldRoll would, and append each group.

        The roll checks run per batch (a Python loop over batches, not records), simulating the index
        interval rule so that "index full" is decided exactly as Kafka decides it.
        """
        sizes = scan.sizes
        last = scan.last_offsets
        max_ts = scan.headers["max_timestamp"].astype(np.int64)
        bases = scan.headers["base_offset"].astype(np.int64)
        cfg = self.config
        chunk = BatchChunk(memoryview(buf), scan, 0, "append")  # slices below are views, not copies
        seg = self.active_segment
        start = pending = planned = 0
        since = seg._load_index_state().bytes_since_last_entry
        for i in range(len(scan)):  # per batch, not per record
            size_now = seg.size + pending
            first_ts = seg.rolling_based_timestamp if seg.size else (int(max_ts[start]) if pending else None)
            if first_ts is not None and first_ts >= 0:
                waited = int(max_ts[i]) - first_ts
            else:
                waited = now - seg.created_ms
            roll = (
                size_now > cfg.segment_bytes - int(sizes[i])
                or (size_now > 0 and waited > cfg.max_segment_ms)
                or seg.offset_index.entries + planned >= seg.offset_index.max_entries
                or seg.time_index.entries + planned >= seg.time_index.max_entries - 1
                or int(last[i]) - seg.base_offset > 2**31 - 1
            )
            if roll and size_now > 0:
                if i > start:
                    part = select_batches(chunk, start, i)
                    seg.append(part.buf, part.scan)
                seg = self.roll(int(bases[i]))
                start, pending, planned, since = i, 0, 0, 0
            if since > cfg.index_interval_bytes:
                planned += 1
                since = 0
            since += int(sizes[i])
            pending += int(sizes[i])
        part = select_batches(chunk, start, len(scan))
        seg.append(part.buf, part.scan)

    def _append_object(self, buf: bytearray, scan: BatchScan) -> None:
        """Immutable segments: the whole append becomes one segment object at the log end offset
        (see storage/objects/immutable_segment.py). A lost create leaves this Log unable to append."""
        try:
            seg = create_segment_object(
                self.fs,
                self.dir,
                self.tp,
                self._next_offset,
                buf,
                scan,
                self.config.index_interval_bytes,
                self.segment_kwargs(),
            )
        except ConcurrentAppendError:
            self._lost_race = True
            raise
        if self._segments and self._segments[-1].size == 0:  # the empty (never written) active segment
            self._segments.pop()
            self._bases.pop()
        if self._segments:
            self._segments[-1].rolled = True
        seg.rolled = True
        self._segments.append(seg)
        self._bases.append(seg.base_offset)
        if self.producer_state is not None:
            self.producer_state.appended(seg, scan)

    def roll(self, new_base_offset: int | None = None) -> LogSegment:
        """Close the active segment to appends and start a new one at the next offset.

        Immutable segments: the new segment is empty and exists only in memory until an append
        creates it."""
        self._require_writable()
        base = self._next_offset if new_base_offset is None else new_base_offset
        active = self.active_segment
        if active.size == 0 and active.base_offset == base:
            return active
        if self.immutable:
            if active.size == 0:
                self._segments.pop()
                self._bases.pop()
            else:
                active.rolled = True
            if self._bases and base <= self._bases[-1]:
                raise KafkaStorageError(
                    f"cannot roll {self.tp.topic}-{self.tp.partition} to base offset {base}: "
                    f"segment {self._bases[-1]} exists"
                )
            seg = LogSegment(
                self.fs, self.dir, base, log_size=0, index_size=0, time_index_size=0, **self.segment_kwargs()
            )
            self._segments.append(seg)
            self._bases.append(base)
            return seg
        self._retire_active_segment()
        if self._bases and base <= self._bases[-1]:
            raise KafkaStorageError(
                f"cannot roll {self.tp.topic}-{self.tp.partition} to base offset {base}: "
                f"segment {self._bases[-1]} exists"
            )
        seg = LogSegment.create(self.fs, self.dir, base, **self.segment_kwargs())
        self.dir_changed = True
        if self.track_batches:
            seg.appended = []
        seg.bulk_writes = self.bulk_writes
        self._segments.append(seg)
        self._bases.append(base)
        return seg

    def _retire_active_segment(self) -> None:
        """Before a new segment: an empty active segment goes (Kafka deletes and recreates it), a
        non-empty one rolls (final time index entry, trimmed indexes)."""
        active = self.active_segment
        if active.size == 0:
            active.delete()
            self.dir_changed = True
            self._segments.pop()
            self._bases.pop()
        else:
            active.on_become_inactive()
            active.close()
            active.rolled = True

    def adopt_segments(self, staged: list[StagedSegment]) -> LogAppendInfo:
        """Append whole segments a staging Log wrote (offsets from 0, indexes built): roll, patch each
        batch's baseOffset in place, rename the files in. Nothing is copied, so a big commit costs a
        few renames; index entries are relative to the segment base, so they move unchanged.
        The caller made the staged bytes durable; the patched headers and the directory are synced here."""
        self._require_writable()
        if self.immutable:
            raise KafkaStorageError(
                f"{self.tp.topic}-{self.tp.partition}: cannot adopt staged segments on this "
                f"filesystem (it needs append, locks and atomic rename); append their bytes"
            )
        if not staged:
            return LogAppendInfo(self._next_offset, self._next_offset - 1, -1, -1, 0, 0, 0, -1)
        first = self._next_offset
        expected = 0
        for s in staged:
            if s.base_offset != expected or s.next_offset <= s.base_offset:
                raise KafkaStorageError(
                    f"staged segments in {self.fs.url(s.dir)} are not contiguous at "
                    f"offset {s.base_offset} (expected {expected}); nothing was appended"
                )
            expected = s.next_offset
            src = self.fs.join(s.dir, segment_file_name(s.base_offset, LOG_FILE_SUFFIX))
            if self.fs.size(src) != s.size:
                raise KafkaStorageError(
                    f"staged segment {self.fs.url(src)} holds {self.fs.size(src)} bytes, its "
                    f"commit message says {s.size}; nothing was appended"
                )
        self._retire_active_segment()
        for s in staged:
            base = first + s.base_offset
            names = [
                (segment_file_name(s.base_offset, sfx), segment_file_name(base, sfx))
                for sfx in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)
            ]
            src_log = self.fs.join(s.dir, names[0][0])
            self.fs.write_at(src_log, s.positions, (s.base_offsets + first).astype(">i8").tobytes(), durable=True)
            for src, dst in names:  # the .log first: a crash leaves at most indexes to rebuild
                self.fs.rename(self.fs.join(s.dir, src), self.fs.join(self.dir, dst))
            self.dir_changed = True
            seg = LogSegment(self.fs, self.dir, base, log_size=s.size, **self.segment_kwargs())
            if self._segments:
                self._segments[-1].rolled = True
            self._segments.append(seg)
            self._bases.append(base)
        self._next_offset = first + staged[-1].next_offset
        self.flush()
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
        if not self.immutable:  # immutable segments are whole and durable once created
            for seg in self._segments[-2:]:
                seg.flush(fsync=True)  # each file only if it changed since its last fsync
            if self.fs.capabilities.fsync and self.dir_changed:
                self.fs.sync_dir(self.dir)
                self.dir_changed = False
        self.recovery_point = self._next_offset
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()

    def close(self) -> None:
        if self.closed:
            return
        if self.writable and not self.immutable:
            self.active_segment.close(final_time_entry=True)
        if self.writable:
            self.flush()
        for seg in self._segments:
            seg.close()
        self.closed = True
        # immutable segments need no recovery, so the recovery point is not worth a checkpoint write;
        # the log start offset still is, when it moved
        record = not self.immutable or self.log_start_offset != self._opened_log_start
        try:
            if self.writable and record and not self._lost_race and self._on_close is not None:
                self._on_close(self)
        finally:
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
        i = max(0, bisect.bisect_right(self._bases, start_offset) - 1)
        offset = start_offset
        for k in range(i, len(self._segments)):
            seg = self._segments[k]
            if seg.base_offset >= end:
                break
            upper = self._bases[k + 1] if k + 1 < len(self._segments) else None
            try:
                for chunk in seg.read_batches(max(offset, seg.base_offset), end, upper=upper):
                    yield chunk
            finally:
                if seg is not self._segments[-1]:
                    seg.release_readers()  # one segment's files open at a time
        if self.tail_error is not None and (max_offset is None or max_offset > self._next_offset):
            raise self.tail_error  # everything before the damage was served; the damage is not skipped

    def read_records(
        self, start_offset: int, max_offset: int | None = None, *, skip_control: bool = True
    ) -> Iterator[pyarrow.RecordBatch]:
        """Decoded records in [start_offset, max_offset) as Arrow batches (decoder.RECORD_SCHEMA), with
        memory bounded by decoder.DECODE_BUDGET_BYTES plus one batch, whatever the batches hold."""
        from .records.decoder import iter_decoded

        for chunk in self.read(start_offset, max_offset):
            for batch in iter_decoded(
                chunk.buf,
                scan=chunk.scan,
                source=chunk.source,
                base_position=chunk.base_position,
                max_message_bytes=self.max_batch_size,
                min_offset=start_offset,
                max_offset=max_offset,
                skip_control=skip_control,
            ):
                if batch.num_rows:
                    yield batch

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Earliest offset whose record timestamp >= timestamp, or None (Kafka's ListOffsets by time).

        Control records count, as in Kafka's FileRecords.searchForTimestamp: a transaction marker carries
        the broker's clock, so the answer may be a marker's offset (a reader starting there skips it).
        The first segment whose largest timestamp reaches it holds the answer; on an object store the
        partition's hint object gives the segments' largest timestamps (segment_metadata.py), so only
        segments it does not cover cost a `.timeindex` read."""
        from .records.decoder import decode_batches

        def decode(buf, scan):
            return decode_batches(buf, scan=scan, max_message_bytes=self.max_batch_size, skip_control=False)

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
                if seg is not self._segments[-1]:
                    seg.release_readers()
            if found is not None:
                return found
        return None

    def segment_metadata(self) -> dict:
        """Base offset -> SegmentMetadata from the partition's hint object (immutable logs; read once
        per Log); {} elsewhere or when there is none."""
        if not self.immutable:
            return {}
        if self.producer_state is not None:  # a writer's, kept up to date by its appends
            return self.producer_state.segments
        if self._segment_metadata is None:
            hint = read_hint(self.fs, self.dir)
            self._segment_metadata = hint.segments if hint is not None else {}
        return self._segment_metadata

    def split_points(self, start: int, end: int) -> list[int]:
        """Offsets in (start, end) where a reader may split the range without sharing a batch:
        segment base offsets and the batch starts the offset indexes record (entry offset + 1)."""
        points = []
        for i, seg in enumerate(self._segments):
            if seg.base_offset >= end:
                break
            if i + 1 < len(self._segments) and self._bases[i + 1] <= start:
                continue  # wholly before the range
            if seg.base_offset > start:
                points.append(seg.base_offset)
            try:
                entries = seg.offset_index.entry_array(0)
            except CorruptIndexError:  # an unreadable index only costs split points
                continue
            finally:
                if seg is not self._segments[-1]:
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
        while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
            seg = self._segments.pop()
            self._bases.pop()
            seg.delete()
            self.dir_changed = True
        self.active_segment.truncate_to(offset)
        self._next_offset = offset
        self.recovery_point = min(self.recovery_point, offset)
        self.flush()

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
        return True

    # ---- retention support
    def delete_oldest_segments(self, count: int) -> list[LogSegment]:
        """Drop the `count` oldest segments (Kafka's deleteSegments): when that is every segment, roll first so
        one remains; remove them from the live list, rename their files to `.deleted` (touched, so
        file.delete.delay.ms counts from now) and advance logStartOffset to the new first segment."""
        from .topic_partition import DELETED_FILE_SUFFIX

        self._require_writable()
        if count <= 0:
            return []
        if count >= len(self._segments):
            self.roll()  # an empty active segment at the log end stays as it is (Kafka's isLastSegmentAndEmpty)
        count = min(count, len(self._segments) - 1)
        doomed = self._segments[:count]
        del self._segments[:count]
        del self._bases[:count]
        for seg in doomed:
            seg.change_file_suffixes("", DELETED_FILE_SUFFIX)
            for path in seg.files():
                if self.fs.exists(path):
                    self.fs.touch(path)  # a rename keeps the old mtime; the delay counts from the deletion
        if doomed and self.fs.capabilities.fsync:
            self.fs.sync_dir(self.dir)
        self.log_start_offset = max(self.log_start_offset, self._bases[0])
        self.recovery_point = max(self.recovery_point, self.log_start_offset)
        return doomed

    # ---- compaction support
    def segments_in_range(self, start: int, end: int) -> list[LogSegment]:
        """Segments that may hold offsets in [start, end) (Kafka's logSegments(from, to)): the one
        holding `start` (its floor) and every later one whose base offset is below `end`."""
        if end <= start:
            return []
        lo = max(0, bisect.bisect_right(self._bases, start) - 1)
        hi = bisect.bisect_left(self._bases, end)
        return self._segments[lo:hi]

    def non_active_segments_from(self, offset: int) -> list[LogSegment]:
        """Kafka's nonActiveLogSegmentsFrom: segments from the one holding `offset` up to the active one."""
        return self.segments_in_range(offset, self.active_segment.base_offset)

    def swap_in_memory(self, new_segments: list[LogSegment], old_segments: list[LogSegment]) -> None:
        """Put swapped-in segments in place of the ones they replace in the segment list, once the
        files (or objects) already say so: the last step of every swap (storage/segment_swap.py)."""
        old_ids = {id(s) for s in old_segments}
        for seg in new_segments:
            seg.rolled = True
        kept = [s for s in self._segments if id(s) not in old_ids]
        self._segments = sorted(kept + list(new_segments), key=lambda s: s.base_offset)
        self._bases = [s.base_offset for s in self._segments]
