"""ObjectAppender: how a Log appends on a filesystem without append or locks (object stores).

Every append becomes one whole segment object at the log end offset, made with a create-only write
(storage/objects/immutable_segment.py); two writers are kept apart by that write alone.
"""

from __future__ import annotations

from ..errors import ConcurrentAppendError
from ..fs.filesystem import LogFileSystem
from ..log_appender import LogAppender, LogSegments
from ..log_config import LogConfig
from ..log_segment import LogSegment
from ..records.record_batch import BatchScan, MutableBytes
from ..topic_partition import TopicPartition
from .immutable_segment import create_segment_object
from .writer_state_hint import read_hint


class ObjectAppender(LogAppender):
    """The create-only protocol: a segment is written whole, indexes too, and is rolled from the start.
    The active segment is therefore either empty, in memory only until an append creates it at the
    log end offset, or the last complete object; nothing is ever appended to an existing object.
    The create-only write is the commit point, so nothing needs recovery and a lost create (another
    writer took the name) leaves this Log unable to append until it is reopened."""

    immutable = True
    needs_recovery_point = False

    def __init__(self, fs: LogFileSystem, dir: str, tp: TopicPartition, config: LogConfig, segments: LogSegments):
        super().__init__(fs, dir, tp, config, segments)
        if len(segments) and segments.last.size:  # a segment object is complete, indexes too
            segments.last.mark_rolled()
        self._lost_race = False  # an append lost its segment name: this Log's view is stale
        self._segment_metadata: dict | None = None  # the hint object's entries (segment_metadata.py), read once

    @property
    def lost_race(self) -> bool:
        return self._lost_race

    def append(self, buf: MutableBytes, scan: BatchScan, *, next_offset: int, now: int, producer_state) -> None:
        """The whole append becomes one segment object at `next_offset`, even one over segment.bytes
        (a roll after every append: the object is complete once created)."""
        try:
            seg = create_segment_object(
                self.fs,
                self.dir,
                self.tp,
                next_offset,
                buf,
                scan,
                self.config.index_interval_bytes,
                self.segment_kwargs(),
            )
        except ConcurrentAppendError:
            self._lost_race = True
            raise
        seg.mark_rolled()
        self._add_segment(seg)
        if producer_state is not None:
            producer_state.appended(seg, scan)

    def _retire(self, active: LogSegment) -> None:
        """Nothing to do on the store: an empty active segment exists only in memory, a written one is whole."""

    def _new_segment(self, base: int) -> LogSegment:
        """An empty segment in memory only, until an append creates it."""
        return LogSegment(self.fs, self.dir, base, log_size=0, index_size=0, time_index_size=0, **self.segment_kwargs())

    def flush(self) -> None:
        """Nothing: segment objects are whole and durable once created."""

    def close(self) -> None:
        """Nothing: the last segment object is complete already."""

    def segment_metadata(self, producer_state) -> dict:
        """Base offset -> SegmentMetadata from the partition's hint object: a writer's own, kept up to
        date by its appends, else the hint read once per Log ({} when there is none)."""
        if producer_state is not None:
            return producer_state.segments
        if self._segment_metadata is None:
            hint = read_hint(self.fs, self.dir)
            self._segment_metadata = hint.segments if hint is not None else {}
        return self._segment_metadata
