"""Segments as immutable objects: how the log appends on a filesystem without append or locks.

There every append is one whole segment named by its base offset (the log end offset the writer
saw), written with one create-only write: that write is the commit point, and a writer that loses
the name to another one appends nothing. The `.index` and `.timeindex` follow as whole objects,
built in memory with the planner appends use plus the final max-timestamp time entry (the segment
is complete when it is created). A segment whose index objects are missing (its writer stopped
between the writes) gets them rebuilt from the `.log`.
"""

from __future__ import annotations

import logging

import numpy as np

from ..common.constants import INT32_MAX
from ..errors import ConcurrentAppendError, CorruptRecordError, KafkaStorageError, RecordTooLargeError
from ..file_records import BatchChunk, check_headers
from ..fs.filesystem import LogFileSystem
from ..index import OffsetIndex, TimeIndex
from ..index_planner import IndexState, plan_index_entries
from ..records.record_batch import (
    MAGIC_OFFSET,
    RECORD_BATCH_OVERHEAD,
    RecordBatchHeader,
    scan_batches,
    validate_batches,
)

log = logging.getLogger(__name__)

MAX_SEGMENT_OBJECT_BYTES = INT32_MAX  # index positions are int32


def immutable_segments(fs: LogFileSystem) -> bool:
    """Whether a log on fs uses the create-only protocol: the store cannot append in place, or has no
    locks to keep two appenders apart."""
    caps = fs.capabilities
    return not (caps.append and caps.locks)


class IndexBuilder:
    """Index entries of one whole segment, fed batch runs in order; finish() adds the final time entry."""

    def __init__(self, interval: int):
        self.interval = interval
        self.state = IndexState()
        self._offsets: list[np.ndarray] = []
        self._positions: list[np.ndarray] = []
        self._timestamps: list[np.ndarray] = []
        self._time_offsets: list[np.ndarray] = []

    def add(self, positions, sizes, last_offsets, max_timestamps) -> None:
        plan = plan_index_entries(positions, sizes, last_offsets, max_timestamps, self.interval, self.state)
        self._offsets.append(plan.offset_entries[0])
        self._positions.append(plan.offset_entries[1])
        self._timestamps.append(plan.time_entries[0])
        self._time_offsets.append(plan.time_entries[1])
        self.state = plan.state

    def finish(self, base_offset: int) -> tuple[np.ndarray, np.ndarray]:
        """(offset index rows, time index rows) as the files hold them."""

        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        offsets, positions = cat(self._offsets), cat(self._positions)
        timestamps, time_offsets = cat(self._timestamps), cat(self._time_offsets)
        st = self.state
        last_ts = int(timestamps[-1]) if len(timestamps) else -1
        if st.max_timestamp >= 0 and st.max_timestamp > last_ts:  # what a roll appends (Kafka's onBecomeInactive)
            timestamps = np.append(timestamps, st.max_timestamp)
            time_offsets = np.append(time_offsets, st.offset_of_max_timestamp)
            st.last_time_entry = st.max_timestamp
        off_rows = np.empty(len(offsets), OffsetIndex.entry_dtype)
        off_rows["relative_offset"] = offsets - base_offset
        off_rows["position"] = positions
        time_rows = np.empty(len(timestamps), TimeIndex.entry_dtype)
        time_rows["timestamp"] = timestamps
        time_rows["relative_offset"] = time_offsets - base_offset
        return off_rows, time_rows


def write_indexes(seg, off_rows: np.ndarray, time_rows: np.ndarray) -> None:
    """Write a segment's two index objects whole (last writer wins: every writer builds the same bytes)."""
    seg.fs.write_atomic(seg.offset_index.path, off_rows.tobytes(), durable=False)
    seg.fs.write_atomic(seg.time_index.path, time_rows.tobytes(), durable=False)


def rebuild_indexes(seg, *, write: bool) -> None:
    """Read a whole segment object, validate it, and give it the indexes an append would have written:
    in memory, and as objects too when `write`. A segment object is whole, so a partial batch at its
    end is corruption, reported with the position; nothing is cut."""
    builder = IndexBuilder(seg.index_interval_bytes)
    end = 0
    expected = None
    try:
        for chunk in seg.iter_chunks(0):
            s = chunk.scan
            validate_batches(
                chunk.buf, s, source=seg.source, base_position=chunk.base_position, expected_first_offset=expected
            )
            seg.check_offsets_in_range(chunk)
            last = s.last_offsets
            builder.add(s.positions + chunk.base_position, s.sizes, last, s.headers["max_timestamp"].astype(np.int64))
            expected = int(last[-1]) + 1
            end = chunk.base_position + s.end
    finally:
        seg.release_readers()
    if end != seg.size:
        raise CorruptRecordError(
            f"partial batch in a segment object of {seg.size} bytes (objects are written whole; this one is damaged)",
            source=seg.source,
            position=end,
        )
    off_rows, time_rows = builder.finish(seg.base_offset)
    if write:
        write_indexes(seg, off_rows, time_rows)
    seg.install_indexes(off_rows, time_rows, builder.state)


def create_segment_object(
    fs: LogFileSystem, dir: str, tp, base: int, buf, scan, index_interval_bytes: int, segment_kwargs: dict
):
    """Write validated, offset-assigned batches as the segment object at `base`; returns its LogSegment.

    The create-only write of the .log is the commit point: if another writer holds the name, nothing
    is written and ConcurrentAppendError is raised (after dropping cached listings of the dir). The
    index objects follow; a failure there is only logged, since any loader rebuilds missing indexes.
    An append larger than segment.bytes still becomes one object.
    """
    from ..log_segment import LogSegment

    where = f"{tp.topic}-{tp.partition}"
    if scan.end > MAX_SEGMENT_OBJECT_BYTES:
        raise RecordTooLargeError(
            f"append to {where}: {scan.end} bytes in one append; on this filesystem every append is one "
            f"segment object, and index positions are int32, so at most {MAX_SEGMENT_OBJECT_BYTES} bytes"
        )
    last = scan.last_offsets
    seg = LogSegment(fs, dir, base, log_size=scan.end, index_size=0, time_index_size=0, **segment_kwargs)
    if not seg.can_convert_to_relative_offset(int(last[-1])):
        raise RecordTooLargeError(
            f"append to {where}: offsets {base}..{int(last[-1])} do not fit one segment "
            f"(relative offsets are int32); split the append"
        )
    builder = IndexBuilder(index_interval_bytes)
    builder.add(scan.positions, scan.sizes, last, scan.headers["max_timestamp"].astype(np.int64))
    off_rows, time_rows = builder.finish(base)
    if not fs.create_exclusive(seg.log_path, memoryview(buf)[: scan.end]):
        fs.invalidate_listings(dir)
        try:
            empty = fs.size(seg.log_path) == 0
        except FileNotFoundError:
            empty = False
        if empty:  # not made by this protocol (a tool, or a copied Kafka dir): say what to do
            raise KafkaStorageError(
                f"append to {where}: an empty segment object {seg.source} blocks appends at "
                f"offset {base}; it holds no records: delete it"
            )
        raise ConcurrentAppendError(
            f"append to {where}: another writer created the segment at offset {base} "
            f"first ({seg.source}); nothing was appended; reopen the log and retry",
            topic=tp.topic,
            partition=tp.partition,
            offset=base,
        )
    try:
        write_indexes(seg, off_rows, time_rows)
    except (KafkaStorageError, OSError) as e:
        log.warning(
            "%s: segment %d is committed but its index objects were not written (%s); the next loader rebuilds them",
            where,
            base,
            e,
        )
    seg.install_indexes(off_rows, time_rows, builder.state, first_max_timestamp=int(scan.headers["max_timestamp"][0]))
    return seg


def next_offset_of(seg) -> int:
    """Offset after the last batch of a whole segment object, with at most two ranged GETs: the last
    offset index entry (8 bytes) and the .log from the batch it points at to the end. No reader
    handles are opened (their swap checks cost a request per file)."""
    if seg.size == 0:
        return seg.base_offset
    fs, idx = seg.fs, seg.offset_index
    starts = [0]
    n = idx.entries
    if n:
        if idx._loaded_from <= n - 1:  # in memory (built by an append or a rebuild)
            starts.insert(0, int(idx._cache[n - 1 - idx._loaded_from]["position"]))
        else:
            raw = fs.read(idx.path, (n - 1) * idx.entry_size, n * idx.entry_size)
            if len(raw) == idx.entry_size:
                starts.insert(0, int.from_bytes(raw[4:8], "big", signed=True))
    whole_end = 0
    for start in starts:  # a bad index entry falls back to the whole object
        if not 0 <= start < seg.size:
            continue
        data = fs.read(seg.log_path, start, seg.size)
        scan = scan_batches(data, max_batch_size=seg.max_batch_size)
        if len(scan) and scan.end == len(data) == seg.size - start:
            # the offsets as every reader checks them: a header that lies must not set the log end
            check_headers(BatchChunk(data, scan, start, seg.source), prev_last=None, base_offset=seg.base_offset)
            return int(scan.last_offsets[-1]) + 1
        whole_end = start + scan.end
    raise CorruptRecordError(
        f"segment object of {seg.size} bytes does not end with a whole batch (objects are "
        f"written whole; this one is damaged)",
        source=seg.source,
        position=whole_end,
    )


def read_first_header(fs: LogFileSystem, path: str) -> RecordBatchHeader | None:
    """The first batch header of a segment object (one ranged GET of 61 bytes); None if it is empty."""
    data = fs.read(path, 0, RECORD_BATCH_OVERHEAD)
    if not data:
        return None
    if len(data) < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            f"segment object starts with a partial batch header ({len(data)} bytes)", source=fs.url(path), position=0
        )
    if data[MAGIC_OFFSET] != 2:
        raise CorruptRecordError(f"first batch has magic {data[MAGIC_OFFSET]}, not 2", source=fs.url(path), position=0)
    return RecordBatchHeader.read(data)


def check_exclusive_create(fs: LogFileSystem, what: str) -> None:
    if not fs.capabilities.exclusive_create:
        raise KafkaStorageError(
            f"{what}: this filesystem ({fs.protocol}) has neither append with locks nor "
            f"create-only writes, so appends cannot be kept apart; it can only be read"
        )
