"""How a partition's segments grow: the segment list (Kafka's LogSegments), the part of appending both
protocols share (LogAppender), and Kafka's own protocol, appending in place on a local disk
(InPlaceAppender). The other protocol, one whole segment object per append on stores without append
or locks, is storage/objects/object_appender.py.

A Log picks its appender when it is made and never changes it; the appender changes the segment list
only through LogSegments' methods, and the Log reads it.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections.abc import Iterator

import numpy as np

from .errors import KafkaStorageError
from .fs.filesystem import LogFileSystem
from .log_config import LogConfig
from .log_segment import BatchChunk, LogSegment, segment_settings, select_batches
from .records.record_batch import BatchScan, MutableBytes, as_uint8
from .topic_partition import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TopicPartition,
    segment_file_name,
)


class LogSegments:
    """A partition's segments in increasing base offset order (Kafka's LogSegments); at least one
    between the Log's operations.

    The last one is the active segment; base offsets strictly increase, and every segment's offsets
    lie below the next one's base offset. Lookups bisect a parallel list of base offsets."""

    def __init__(self, segments: list[LogSegment]):
        self._segments = list(segments)
        self._bases = [s.base_offset for s in self._segments]

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(list(self._segments))

    def __getitem__(self, i: int) -> LogSegment:
        return self._segments[i]

    def to_list(self) -> list[LogSegment]:
        return list(self._segments)

    @property
    def last(self) -> LogSegment:
        return self._segments[-1]

    def floor_index(self, offset: int) -> int:
        """Position of the segment with the largest base offset <= offset; -1 when there is none."""
        return bisect.bisect_right(self._bases, offset) - 1

    def floor(self, offset: int) -> LogSegment | None:
        """The segment with the largest base offset <= offset (Kafka's floorEntry)."""
        i = self.floor_index(offset)
        return self._segments[i] if i >= 0 else None

    def in_range(self, start: int, end: int) -> list[LogSegment]:
        """The segment holding `start` (its floor) and every later one whose base offset is below `end`."""
        if end <= start:
            return []
        lo = max(0, self.floor_index(start))
        return self._segments[lo : bisect.bisect_left(self._bases, end)]

    def add(self, seg: LogSegment) -> None:
        """Put a segment at the end; its base offset must be above every other one's."""
        if self._bases and seg.base_offset <= self._bases[-1]:
            raise ValueError(f"segment {seg.base_offset} does not follow segment {self._bases[-1]}")
        self._segments.append(seg)
        self._bases.append(seg.base_offset)

    def remove_last(self) -> LogSegment:
        self._bases.pop()
        return self._segments.pop()

    def remove_first(self, count: int) -> list[LogSegment]:
        gone = self._segments[:count]
        del self._segments[:count]
        del self._bases[:count]
        return gone

    def remove(self, segments: list[LogSegment]) -> None:
        gone = {id(s) for s in segments}
        self._segments = [s for s in self._segments if id(s) not in gone]
        self._bases = [s.base_offset for s in self._segments]

    def replace(self, new_segments: list[LogSegment], old_segments: list[LogSegment]) -> None:
        """Put `new_segments` in place of `old_segments` (a swap), keeping base offset order."""
        old = {id(s) for s in old_segments}
        kept = [s for s in self._segments if id(s) not in old]
        self._segments = sorted(kept + list(new_segments), key=lambda s: s.base_offset)
        self._bases = [s.base_offset for s in self._segments]


class LogAppender(ABC):
    """One append protocol of a writable Log: writes batches into its segments, rolls, flushes, closes.

    Shared: every segment but the last is rolled; a roll retires the active segment (an empty one
    goes) and starts one at a higher base offset, never below the last one's."""

    #: a Log on this protocol cannot append in place: every append is a whole, complete segment
    immutable = False
    #: whether recovery after a crash starts from the recovery point (so a writer's close checkpoints it)
    needs_recovery_point = True

    def __init__(self, fs: LogFileSystem, dir: str, tp: TopicPartition, config: LogConfig, segments: LogSegments):
        self.fs = fs
        self.dir = dir
        self.tp = tp
        self.config = config
        self.segments = segments
        for seg in segments.to_list()[:-1]:
            seg.mark_rolled()

    @property
    def lost_race(self) -> bool:
        """Whether another writer appended since this Log was opened, so that it may not append again."""
        return False

    def segment_kwargs(self) -> dict:
        return segment_settings(self.config)

    @abstractmethod
    def append(self, buf: MutableBytes, scan: BatchScan, *, next_offset: int, now: int, producer_state) -> None:
        """Write validated, offset-assigned batches (the first at `next_offset`) into the segments."""

    @abstractmethod
    def _retire(self, active: LogSegment) -> None:
        """The files' part of retiring the active segment before a new one starts."""

    @abstractmethod
    def _new_segment(self, base: int) -> LogSegment:
        """A new, empty active segment at `base`."""

    @abstractmethod
    def flush(self) -> None:
        """Make every appended byte durable."""

    @abstractmethod
    def close(self) -> None:
        """A writer's last step before its segments' handles are closed."""

    def roll(self, base: int) -> LogSegment:
        """Close the active segment to appends and start a new one at `base` (an empty active segment
        there already is the answer)."""
        active = self.segments.last
        if active.size == 0 and active.base_offset == base:
            return active
        self._retire(active)
        if active.size == 0:
            self.segments.remove_last()
        else:
            active.mark_rolled()
        if len(self.segments) and base <= self.segments.last.base_offset:
            raise KafkaStorageError(
                f"cannot roll {self.tp.topic}-{self.tp.partition} to base offset {base}: "
                f"segment {self.segments.last.base_offset} exists"
            )
        seg = self._new_segment(base)
        self.segments.add(seg)
        return seg

    def _add_segment(self, seg: LogSegment) -> None:
        """Put a segment written elsewhere at the log end: an empty active segment before it goes (its
        files, if any, were retired), the one before it is rolled."""
        if len(self.segments) and self.segments.last.size == 0:
            self.segments.remove_last()
        if len(self.segments):
            self.segments.last.mark_rolled()
        self.segments.add(seg)

    def delete_segment(self, seg: LogSegment) -> None:
        """Delete the files of a segment already taken out of the list (truncation)."""
        seg.delete()

    def adopt_segments(self, staged: list, first: int) -> None:
        """Take whole staged segments in at offset `first` (see Log.adopt_segments)."""
        raise KafkaStorageError(
            f"{self.tp.topic}-{self.tp.partition}: cannot adopt staged segments on this "
            f"filesystem (it needs append, locks and atomic rename); append their bytes"
        )

    def segment_metadata(self, producer_state) -> dict:
        """Base offset -> SegmentMetadata, where the protocol keeps it; {} where it does not."""
        return {}


class InPlaceAppender(LogAppender):
    """Kafka's protocol, on a filesystem with append and locks: batches are appended to the active
    segment's `.log` and its indexes grow with them; the writer holds the partition lock, so it is
    the only one. A torn tail from a crash is cut by the next writer's recovery (LogLoader).

    Writer modes (a staging log's): track_batches records every appended batch's position and base
    offset in its segment (Log.adopt_segments renames them in later), bulk_writes lets big appends
    bypass the OS cache."""

    def __init__(
        self,
        fs: LogFileSystem,
        dir: str,
        tp: TopicPartition,
        config: LogConfig,
        segments: LogSegments,
        *,
        dir_changed: bool = True,
        track_batches: bool = False,
        bulk_writes: bool = False,
    ):
        super().__init__(fs, dir, tp, config, segments)
        self._dir_changed = dir_changed  # entries made, renamed or removed since the directory was last fsynced
        self._track_batches = track_batches
        self._bulk_writes = bulk_writes

    def append(self, buf: MutableBytes, scan: BatchScan, *, next_offset: int, now: int, producer_state) -> None:
        """Append the batches to the active segment, rolling wherever LogSegment.batches_before_roll
        (Kafka's shouldRoll) says so; each run between rolls is one write."""
        cfg = self.config
        chunk = BatchChunk(as_uint8(buf).data, scan, 0, "append")  # slices below are views, not copies
        bases = scan.headers["base_offset"].astype(np.int64)
        seg = self.segments.last
        start = 0
        while start < len(scan):
            n = seg.batches_before_roll(
                scan, start, segment_bytes=cfg.segment_bytes, segment_ms=cfg.max_segment_ms, now_ms=now
            )
            if n:
                part = select_batches(chunk, start, start + n)
                seg.append(part.buf, part.scan)
                start += n
            if start < len(scan):
                seg = self.roll(int(bases[start]))

    def _retire(self, active: LogSegment) -> None:
        """An empty active segment is deleted (Kafka deletes and recreates it); a non-empty one rolls
        (final time index entry, trimmed indexes)."""
        if active.size == 0:
            active.delete()
            self._dir_changed = True
        else:
            active.on_become_inactive()
            active.close()

    def _new_segment(self, base: int) -> LogSegment:
        seg = LogSegment.create(
            self.fs,
            self.dir,
            base,
            track_batches=self._track_batches,
            bulk_writes=self._bulk_writes,
            **self.segment_kwargs(),
        )
        self._dir_changed = True
        return seg

    def delete_segment(self, seg: LogSegment) -> None:
        seg.delete()
        self._dir_changed = True

    def flush(self) -> None:
        """fsync the log and index bytes of the last two segments (each file only if it changed since its
        last fsync; older ones were fsynced on roll), then the directory if entries changed."""
        for seg in self.segments.to_list()[-2:]:
            seg.flush(fsync=True)
        if self.fs.capabilities.fsync and self._dir_changed:
            self.fs.sync_dir(self.dir)
            self._dir_changed = False

    def close(self) -> None:
        self.segments.last.close(final_time_entry=True)

    def adopt_segments(self, staged: list, first: int) -> None:
        """Rename whole staged segments (offsets from 0, indexes built) in at offset `first`: check they are
        contiguous and complete, retire the active segment, patch each batch's baseOffset in place and
        rename the files in (the .log first: a crash leaves at most indexes to rebuild)."""
        if not staged:
            return
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
        active = self.segments.last
        self._retire(active)
        if active.size == 0:
            self.segments.remove_last()
        for s in staged:
            base = first + s.base_offset
            names = [
                (segment_file_name(s.base_offset, sfx), segment_file_name(base, sfx))
                for sfx in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)
            ]
            src_log = self.fs.join(s.dir, names[0][0])
            self.fs.write_at(src_log, s.positions, (s.base_offsets + first).astype(">i8").tobytes(), durable=True)
            for src, dst in names:
                self.fs.rename(self.fs.join(s.dir, src), self.fs.join(self.dir, dst))
            self._dir_changed = True
            self._add_segment(LogSegment(self.fs, self.dir, base, log_size=s.size, **self.segment_kwargs()))
