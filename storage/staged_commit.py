"""Two-phase append for many parallel writers and one committer (a Spark sink's shape).

Phase 1 (RecordStager, on executors): route rows to partitions and append them to one staging Log
per partition in the task's staging directory under ROOT (a hidden name, so Kafka ignores it): the
same offsets-from-0, roll and index rules as the real log, so a staging segment is a finished
segment but for its offsets. Big ones are fsynced there, in parallel.
Phase 2 (commit_staged, on the driver): per partition, under its write lock, skip the batch if
this writer already committed it, else mark it pending, add the staged bytes and mark it committed
(ProducerStateManager). Big staging logs are adopted (baseOffsets patched, files renamed in: no
copy); small ones are copied into the active segment so frequent small commits do not make tiny
segments. A replayed batch id is skipped partition by partition.

On a filesystem without append or locks (object stores: immutable segments) the same two phases
run without a lock: a task stages each partition's batches in memory and writes them as whole
staging segment objects; the commit reads a partition's staged bytes (ranged GETs), stamps every
batch with the batch id (ObjectProducerStateManager) and appends them as ONE segment object with a
create-only write. A writer that loses the race for the log end reopens the log, checks again
whether its batch is in (the winner may have been a replay of it) and retries, a bounded number of times.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import ConcurrentAppendError, CorruptRecordError, InvalidConfigError, KafkaStorageError
from .immutable_segment import immutable_segments
from .log import Log, StagedSegment
from .log_config import LONG_MAX, LogConfig
from .log_manager import LogManager
from .log_segment import LogSegment, segment_settings
from .partitioner import partition_for_keys
from .producer_state import stamp_commit
from .records.builder import encode_records
from .records.record_batch import CompressionType, scan_batches
from .topic_partition import LOG_FILE_SUFFIX, TopicPartition, partition_dir_name, segment_file_name

log = logging.getLogger(__name__)

STAGED_PREFIX = ".kafkalog-staged-"
APPEND_CHUNK_BYTES = 64 * 1024 * 1024  # the copy path appends at most this much at a time
COALESCE_ROWS = 65536  # RecordStager routes and encodes rows this many at a time ...
COALESCE_BYTES = 16 * 1024 * 1024  # ... or this much Arrow data, whichever comes first
STAGED_MARKER = "task"  # in each staging directory: the task index; its mtime is the attempt's age
ADOPT_MIN_BYTES = 16 * 1024 * 1024  # a staging log this big (or half a segment) is adopted, not copied
STAGE_OBJECT_BYTES = 32 * 1024 * 1024  # immutable staging: a partition's batches become an object at this size
STAGE_MEMORY_BYTES = 128 * 1024 * 1024  # ... and the biggest buffer is written when a task holds this much
CONFLICT_RETRIES = 50  # immutable commits: how often a partition commit may lose the race for the log end
_BOUND_KEYS = ("message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
               "message.timestamp.difference.max.ms")


@dataclass(frozen=True)
class StagedPartition:
    """One task's staging log of one partition."""

    topic: str
    partition: int
    segments: tuple[StagedSegment, ...]
    records: int
    adopt: bool  # big enough, and the topic allows it: rename in; else copy

    @property
    def next_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


@dataclass(frozen=True)
class StagedFile:
    """One task's staging directory (name under ROOT) and what it holds."""

    name: str
    partitions: tuple[StagedPartition, ...]
    order: int = 0  # the task's partition id: commit appends tasks in this order

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)


def staged_name(writer_id: int) -> str:
    return f"{STAGED_PREFIX}{writer_id}-{uuid.uuid4().hex}"


def staging_config(config: LogConfig) -> LogConfig:
    """The topic's config for a staging log: no fsync per append (one at the end, if adopted), and
    CreateTime as given when the topic stamps LogAppendTime (the commit stamps it)."""
    overrides = {**config.overrides, "flush.messages": str(LONG_MAX)}
    if config.message_timestamp_type == "LogAppendTime":
        overrides = {k: v for k, v in overrides.items() if k not in _BOUND_KEYS}
        overrides["message.timestamp.type"] = "CreateTime"
    return LogConfig.from_dict(overrides)


class _ObjectStaging:
    """One partition's staging "log" where nothing can be appended: encoded batches wait in memory and
    are written as whole staging segment objects (offsets from 0), at STAGE_OBJECT_BYTES or finish()."""

    def __init__(self, fs, dir: str, tp: TopicPartition, max_batch_size: int):
        self.fs, self.dir, self.tp = fs, dir, tp
        self.max_batch_size = max_batch_size
        self.segments: list[StagedSegment] = []
        self.next_offset = 0
        self.pending = 0  # bytes held in memory
        self.size = 0  # bytes staged in all
        self._chunks: list[bytes] = []

    def append(self, data, built=None) -> None:
        self._chunks.append(bytes(data))
        self.pending += len(data)
        self.size += len(data)
        if self.pending >= STAGE_OBJECT_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._chunks:
            return
        buf = bytearray(b"".join(self._chunks))
        self._chunks, self.pending = [], 0
        scan = scan_batches(buf, max_batch_size=self.max_batch_size)
        if scan.end != len(buf) or not len(scan):
            raise CorruptRecordError("encoded batches do not parse", source=self.fs.url(self.dir), position=scan.end)
        counts = scan.headers["last_offset_delta"].astype(np.int64) + 1
        bases = self.next_offset + np.concatenate(([0], np.cumsum(counts)[:-1]))
        arr = np.frombuffer(buf, np.uint8)
        cols = np.arange(8, dtype=np.int64)
        arr[(scan.positions[:, None] + cols[None, :]).ravel()] = bases.astype(">i8").view(np.uint8)
        path = self.fs.join(self.dir, segment_file_name(self.next_offset, LOG_FILE_SUFFIX))
        self.fs.write_atomic(path, buf, durable=False)
        nxt = int(bases[-1] + counts[-1])
        self.segments.append(StagedSegment(self.dir, self.next_offset, nxt, len(buf), scan.positions.copy(), bases,
                                           int(scan.headers["max_timestamp"].astype(np.int64).max())))
        self.next_offset = nxt


class RecordStager:
    """Routes, encodes and stages one task's rows. Columns: value, and optionally key, timestamp,
    headers, topic, partition (as Spark's Kafka sink takes them)."""

    def __init__(self, lm: LogManager, writer_id: int, *, topic: str | None, compression: CompressionType,
                 new_topic_config: dict | None = None, new_topic_partitions: int = 1, task_index: int = 0,
                 max_batch_bytes: int | None = None):
        self.lm = lm
        self.writer_id = writer_id
        self.topic = topic
        self.compression = compression
        self.new_topic_config = new_topic_config or {}
        self.new_topic_partitions = new_topic_partitions
        self.task_index = task_index
        self.max_batch_bytes = max_batch_bytes
        self.name = staged_name(writer_id)
        self._dirs: set[str] = set()  # this task's staging directory in each log dir it wrote to
        self._logs: dict[TopicPartition, tuple[Log | _ObjectStaging, int]] = {}  # staging log, rows staged
        self._immutable = immutable_segments(lm.fs)  # stage in memory, write whole objects
        self._partitions: dict[str, int] = {}
        self._max_bytes: dict[str, int] = {}
        self._configs: dict[str, LogConfig] = {}
        self._null_keys = task_index  # spread null keys, starting at a different partition per task
        self._pending: list = []  # rows queued by add(), not yet routed (see COALESCE_ROWS)
        self._pending_rows = self._pending_bytes = self._rows_seen = 0

    def _topic_info(self, topic: str) -> tuple[int, int]:
        if topic not in self._partitions:
            meta = self.lm.get_or_create_topic(topic, self.new_topic_partitions, self.new_topic_config)
            self._partitions[topic] = meta.partitions
            self._configs[topic] = meta.config
            limit = meta.config.max_message_bytes - 61
            self._max_bytes[topic] = min(limit, self.max_batch_bytes or limit)
        return self._partitions[topic], self._max_bytes[topic]

    def add(self, table: pa.Table | pa.RecordBatch) -> None:
        """Queue rows; they are routed and encoded COALESCE_ROWS at a time (Spark hands over 10k-row
        batches, and the fixed cost per encode and append is worth spreading), at the latest by finish()."""
        if table.num_rows == 0:
            return
        if self._pending and table.schema != self._pending[0].schema:
            self._drain()
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self._pending_bytes += table.nbytes
        if self._pending_rows >= COALESCE_ROWS or self._pending_bytes >= COALESCE_BYTES:
            self._drain()

    def _drain(self) -> None:
        if not self._pending:
            return
        parts = [t if isinstance(t, pa.Table) else pa.Table.from_batches([t]) for t in self._pending]
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts).combine_chunks()
        first_row = self._rows_seen
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        self._rows_seen += table.num_rows
        if "topic" in table.column_names:
            topics = table.column("topic")
            if self.topic is not None:
                topics = pc.fill_null(topics, self.topic)
            elif topics.null_count:
                i = int(np.flatnonzero(topics.is_null().to_numpy(zero_copy_only=False))[0])
                raise InvalidConfigError(f"row {first_row + i} of the task's input has a null topic and no 'topic' "
                                         f"option is set")
            for name in pc.unique(topics).to_pylist():  # per topic, not per row
                mask = pc.equal(topics, name)
                self._add_topic(table.filter(mask), name)
        else:
            self._add_topic(table, self.topic, first_row)

    def _add_topic(self, table, topic: str, first_row: int | None = None) -> None:
        num_partitions, max_bytes = self._topic_info(topic)
        n = table.num_rows
        if "partition" in table.column_names and table.column("partition").null_count < n:
            explicit = table.column("partition")
            parts = pc.fill_null(explicit, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            bad = np.flatnonzero((parts >= num_partitions) | ((parts < 0) & ~explicit.is_null().to_numpy(
                zero_copy_only=False)))
            if bad.size:
                i = int(bad[0])
                row = f"row {first_row + i} of the task's input" if first_row is not None else "a row"
                raise InvalidConfigError(f"{row}: partition {int(parts[i])} does not exist: topic '{topic}' has "
                                         f"{num_partitions} partition(s)")
            missing = parts < 0
        else:
            parts = np.full(n, -1, np.int64)
            missing = np.ones(n, bool)
        if missing.any():
            keys = table.column("key") if "key" in table.column_names else pa.nulls(n, pa.binary())
            keyed = partition_for_keys(keys.filter(pa.array(missing)), num_partitions, null_key_start=self._null_keys)
            parts[missing] = keyed
            nulls = int(pc.sum(keys.filter(pa.array(missing)).is_null()).as_py() or 0)
            self._null_keys += nulls
        cols = [c for c in ("key", "value", "timestamp", "headers") if c in table.column_names]
        body = table.select(cols)
        if n > 1 and (parts[1:] < parts[:-1]).any():  # one gather into partition order, then zero-copy slices
            order = np.argsort(parts.astype(np.int16) if num_partitions <= 2**15 else parts, kind="stable")
            parts = parts[order]  # (a stable sort of int16 is a radix sort)
            body = body.take(pa.array(order))
        starts = np.concatenate(([0], np.flatnonzero(parts[1:] != parts[:-1]) + 1, [n]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
            data, scan = encode_records(body.slice(a, b - a), compression=self.compression,
                                        producer_id=self.writer_id, producer_epoch=0, max_batch_bytes=max_bytes)
            self._write(topic, int(parts[a]), data, scan, b - a)

    def _write(self, topic: str, partition: int, data, scan, records: int) -> None:
        tp = TopicPartition(topic, partition)
        if tp not in self._logs:
            fs = self.lm.fs
            # staged beside the partition (same log dir, so the commit can rename the files in)
            task_dir = fs.join(self.lm.log_dir_of(tp), self.name)
            if task_dir not in self._dirs:  # its marker's mtime dates the attempt (cleanup_staged)
                fs.mkdirs(task_dir)
                fs.write_atomic(fs.join(task_dir, STAGED_MARKER), b"%d\n" % self.task_index, durable=False)
                self._dirs.add(task_dir)
            config = staging_config(self._configs[topic])
            d = fs.join(task_dir, partition_dir_name(tp))
            fs.mkdirs(d)
            if self._immutable:
                staging = _ObjectStaging(fs, d, tp, config.max_message_bytes)
            else:
                seg = LogSegment.create(fs, d, 0, **segment_settings(config))
                seg.appended = []
                staging = Log(fs, d, tp, config, [seg], log_start_offset=0, recovery_point=0, next_offset=0,
                              writable=True)
                staging.track_batches = True
            self._logs[tp] = (staging, 0)
        staging, rows = self._logs[tp]
        staging.append(data, built=scan)
        self._logs[tp] = (staging, rows + records)
        if self._immutable:  # bound the task's memory: write out the biggest buffer when it holds too much
            held = [(st.pending, key) for key, (st, _) in self._logs.items()]
            if sum(n for n, _ in held) >= STAGE_MEMORY_BYTES:
                self._logs[max(held)[1]][0].flush()

    def _adoptable(self, staging: Log) -> bool:
        config = self._configs[staging.tp.topic]
        threshold = min(ADOPT_MIN_BYTES, max(1, config.segment_bytes // 2))
        return (staging.size >= threshold and config.message_timestamp_type == "CreateTime"
                and self.lm.fs.capabilities.atomic_rename)

    def finish(self) -> StagedFile | None:
        """Close the staging logs (fsync the ones the commit will adopt); None when the task had no rows."""
        self._drain()
        if not self._logs:
            return None
        parts = []
        for tp in sorted(self._logs):
            staging, rows = self._logs[tp]
            if isinstance(staging, _ObjectStaging):
                staging.flush()
                parts.append(StagedPartition(tp.topic, tp.partition, tuple(staging.segments), rows, False))
                continue
            adopt = self._adoptable(staging)
            segments = []
            for i, seg in enumerate(staging.segments):
                if seg.size == 0:
                    continue
                nxt = staging.segments[i + 1].base_offset if i + 1 < len(staging.segments) else staging.log_end_offset
                positions = np.concatenate([p for p, _ in seg.appended]) if seg.appended else np.zeros(0, np.int64)
                bases = np.concatenate([b for _, b in seg.appended]) if seg.appended else np.zeros(0, np.int64)
                segments.append(StagedSegment(staging.dir, seg.base_offset, nxt, seg.size, positions, bases,
                                              seg.max_timestamp_so_far))
                seg.close(fsync=adopt)  # rolled ones were fsynced on roll; no final time entry here
            staging.closed = True
            parts.append(StagedPartition(tp.topic, tp.partition, tuple(segments), rows, adopt))
        self._logs.clear()
        return StagedFile(self.name, tuple(parts), self.task_index)

    def abort(self) -> None:
        self._pending = []
        for staging, _ in self._logs.values():
            if isinstance(staging, _ObjectStaging):
                continue
            for seg in staging.segments:
                seg.close(fsync=False)
        self._logs.clear()
        for d in self._dirs:
            self.lm.fs.delete_dir(d)


@dataclass
class CommitResult:
    appended: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # tp -> (first, last offset)
    skipped: list[TopicPartition] = field(default_factory=list)  # already held this batch
    records: int = 0


def commit_staged(lm: LogManager, writer_id: int, batch_id: int, staged: list[StagedFile], *,
                  ephemeral: bool = False, lock_timeout: float | None = 600.0,
                  conflict_retries: int = CONFLICT_RETRIES) -> CommitResult:
    """Append every staged partition log, exactly once per (writer, batch, partition); then drop the files.

    Partitions are committed one at a time, each under its write lock; a crash between two leaves
    some committed and the replay skips exactly those. Every staged file is checked (present, of the
    size its message says) before a partition's commit begins, so a lost file fails the commit
    before anything is appended. Without append or locks (immutable segments) each partition's
    commit is one create-only segment object instead (see _commit_immutable).
    """
    result = CommitResult()
    by_tp: dict[TopicPartition, list[StagedPartition]] = {}
    for f in sorted(staged, key=lambda f: (f.order, f.name)):
        for p in f.partitions:
            by_tp.setdefault(TopicPartition(p.topic, p.partition), []).append(p)
    immutable = immutable_segments(lm.fs)
    for tp in sorted(by_tp):
        if immutable:
            _commit_immutable(lm, tp, by_tp[tp], writer_id, batch_id, result, ephemeral=ephemeral,
                              lock_timeout=lock_timeout, retries=conflict_retries)
            continue
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            if state.entry(writer_id).committed_batch_id >= batch_id:
                result.skipped.append(tp)
                log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
                continue
            pieces = by_tp[tp]
            for piece in pieces:
                _check_staged(lm, piece)
            first = plog.log_end_offset
            state.begin(writer_id, batch_id, first, first + sum(p.next_offset for p in pieces))
            for piece in pieces:
                if piece.adopt and _same_log_dir(lm, piece, plog.dir):
                    plog.adopt_segments(list(piece.segments))
                else:
                    for data in read_staged(lm, piece):
                        plog.append(data)
            state.complete(writer_id)
            if ephemeral:
                state.forget(writer_id)
            result.appended[tp] = (first, plog.log_end_offset - 1)
            result.records += sum(p.records for p in pieces)
    cleanup_staged(lm, writer_id, [f.name for f in staged])
    return result


def _commit_immutable(lm: LogManager, tp: TopicPartition, pieces: list[StagedPartition], writer_id: int,
                      batch_id: int, result: CommitResult, *, ephemeral: bool, lock_timeout: float | None,
                      retries: int) -> None:
    """One partition's commit on immutable segments: check, stamp, append as one object; on a lost race
    reopen, check again (the winner may have been a replay of this very batch) and retry."""
    data = None
    headers: dict = {}  # first batch headers by base offset, kept across attempts (segments are immutable)
    lost = None
    for attempt in range(max(1, retries)):
        if lost is not None:  # back off a little, more after each loss
            time.sleep(random.uniform(0, min(1.0, 0.005 * 2 ** min(attempt, 8))))
        for d in lm.log_dirs:  # one LIST each answers open_log's existence checks from the listing cache
            lm.fs.listdir(d)
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            state.headers = headers
            if state.entry(writer_id).committed_batch_id >= batch_id:
                result.skipped.append(tp)
                log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
                return
            if data is None:  # one buffer: the partition's commit must be one object to be atomic
                data = _read_stamped(lm, tp, pieces, writer_id, batch_id, plog.max_batch_size)
            first = plog.log_end_offset
            state.begin(writer_id, batch_id, first, first + sum(p.next_offset for p in pieces))
            try:
                plog.append(data)  # patched in place (offsets, LogAppendTime); every attempt redoes all of it
            except ConcurrentAppendError as e:
                log.info("%s: batch %d of writer %d lost offset %d to another writer (attempt %d); retrying",
                         tp, batch_id, writer_id, first, attempt + 1)
                lost = e
                continue
            state.complete(writer_id)
            if ephemeral:
                state.forget(writer_id)
            result.appended[tp] = (first, plog.log_end_offset - 1)
            result.records += sum(p.records for p in pieces)
            return
    raise ConcurrentAppendError(f"{tp.topic}-{tp.partition}: batch {batch_id} of writer {writer_id} lost the race for "
                                f"the log end to other writers {max(1, retries)} times (last at offset {lost.offset}); "
                                f"nothing of it was appended", topic=tp.topic, partition=tp.partition,
                                offset=lost.offset)


def _read_stamped(lm: LogManager, tp: TopicPartition, pieces: list[StagedPartition], writer_id: int, batch_id: int,
                  max_batch_size: int) -> bytearray:
    data = bytearray()
    for piece in pieces:
        for chunk in read_staged(lm, piece):
            data += chunk
    stamp_commit(data, writer_id, batch_id, max_batch_size=max_batch_size,
                 source=f"staged batches of {tp.topic}-{tp.partition}")
    return data


def _same_log_dir(lm: LogManager, piece: StagedPartition, partition_dir: str) -> bool:
    """Adopting renames files: only within one log dir (a partition placed after staging may not be)."""
    fs = lm.fs
    return fs.dirname(fs.dirname(piece.segments[0].dir)) == fs.dirname(partition_dir)


def _check_staged(lm: LogManager, piece: StagedPartition) -> None:
    for seg in piece.segments:
        path = lm.fs.join(seg.dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
        size = lm.fs.size(path) if lm.fs.exists(path) else None
        if size != seg.size:
            raise KafkaStorageError(f"staged segment {lm.url(path)} holds {size} bytes, its commit message says "
                                    f"{seg.size}; nothing was appended")


def read_staged(lm: LogManager, piece: StagedPartition):
    """A staging log's batches in whole-batch chunks of up to APPEND_CHUNK_BYTES (the copy path), each
    a bytearray Log.append takes over."""
    for seg in piece.segments:
        path = lm.fs.join(seg.dir, segment_file_name(seg.base_offset, LOG_FILE_SUFFIX))
        ends = np.append(seg.positions[1:], seg.size) if len(seg.positions) else np.zeros(0, np.int64)
        start = 0
        while start < seg.size:
            # the last batch end within the chunk budget (at least one batch)
            k = max(int(np.searchsorted(ends, start + APPEND_CHUNK_BYTES, side="right")),
                    int(np.searchsorted(ends, start, side="right")) + 1)
            end = int(ends[k - 1])
            data = lm.fs.read(path, start, end)
            if len(data) != end - start:
                raise KafkaStorageError(f"staged segment {lm.url(path)} is shorter than its commit message says "
                                        f"({start}..{end})")
            yield bytearray(data)
            start = end


def cleanup_staged(lm: LogManager, writer_id: int, names: list[str] | None = None) -> None:
    """Delete this writer's staging directories in every log dir: all of them, or the named ones plus
    any older unnamed ones (attempts that failed or were killed before reporting). Newer unnamed ones
    are left alone: a restarted query may already be staging its replay while an old commit finishes."""
    prefix = f"{STAGED_PREFIX}{writer_id}-"
    fs = lm.fs
    found: list[tuple[str, str, bool]] = []  # (log dir, name, is_dir)
    for log_dir in lm.log_dirs:  # (a missing log dir lists as empty)
        found += [(log_dir, f.name, f.is_dir) for f in fs.listdir(log_dir) if f.name.startswith(prefix)]

    def age(log_dir: str, name: str, is_dir: bool) -> int:
        path = fs.join(log_dir, name)
        marker = fs.join(path, STAGED_MARKER)
        return fs.modified_ms(marker if is_dir and fs.exists(marker) else path)

    if names is None:
        doomed = found
    else:
        named = [f for f in found if f[1] in set(names)]
        others = [f for f in found if f[1] not in set(names)]
        oldest = min((age(*f) for f in named), default=None) if others else None  # ages cost a request each
        doomed = named + ([f for f in others if age(*f) <= oldest] if oldest is not None else [])
    for log_dir, name, is_dir in doomed:
        path = fs.join(log_dir, name)
        if is_dir:
            fs.delete_dir(path)
        else:
            fs.delete(path)
