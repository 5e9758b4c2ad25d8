"""Phase 1 of the sink's two-phase append (phase 2 is storage/staging/staged_commit.py): RecordStager routes
one task's rows to partitions, encodes them as Kafka v2 batches and stages them per partition.

With append and locks, each partition's batches go to a staging Log in the task's hidden staging
directory under ROOT (offsets from 0, the topic's roll and index rules), so a staging segment is a
finished segment but for its offsets; big ones are fsynced there, in parallel. On an object store
(no append) a partition's batches wait in memory and are written as whole staging objects.
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..common.constants import INT64_MAX
from ..errors import CorruptRecordError, InvalidConfigError
from ..log import Log, StagedSegment
from ..log_config import LogConfig
from ..log_manager import LogManager
from ..log_segment import LogSegment, segment_settings
from ..objects.immutable_segment import immutable_segments
from ..records.builder import encode_records
from ..records.record_batch import CompressionType, scan_batches
from ..topic_partition import LOG_FILE_SUFFIX, TopicPartition, partition_dir_name, segment_file_name
from .partitioner import partition_for_keys
from .staged_commit import STAGED_MARKER, STAGED_PREFIX, StagedFile, StagedPartition

COALESCE_ROWS = 65536  # RecordStager routes and encodes rows this many at a time ...
COALESCE_BYTES = 16 * 1024 * 1024  # ... or this much Arrow data, whichever comes first
ADOPT_MIN_BYTES = 16 * 1024 * 1024  # a staging log this big (or half a segment) is adopted, not copied
STAGE_OBJECT_BYTES = 32 * 1024 * 1024  # immutable staging: a partition's batches become an object at this size
STAGE_MEMORY_BYTES = 128 * 1024 * 1024  # ... and the biggest buffer is written when a task holds this much
_BOUND_KEYS = (
    "message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms",
    "message.timestamp.difference.max.ms",
)


def staged_name(writer_id: int) -> str:
    return f"{STAGED_PREFIX}{writer_id}-{uuid.uuid4().hex}"


def staging_config(config: LogConfig) -> LogConfig:
    """The topic's config for a staging log: no fsync per append (one at the end, if adopted), and
    CreateTime as given when the topic stamps LogAppendTime (the commit stamps it)."""
    overrides = {**config.overrides, "flush.messages": str(INT64_MAX)}
    if config.message_timestamp_type == "LogAppendTime":
        overrides = {k: v for k, v in overrides.items() if k not in _BOUND_KEYS}
        overrides["message.timestamp.type"] = "CreateTime"
    return LogConfig.from_dict(overrides)


def staging_log(fs, dir: str, tp: TopicPartition, config: LogConfig) -> Log:
    """An empty staging Log in `dir` (offsets from 0), in writer modes: batch positions kept for
    adopt_segments, segments written past the OS cache."""
    seg = LogSegment.create(fs, dir, 0, track_batches=True, bulk_writes=True, **segment_settings(config))
    return Log(
        fs,
        dir,
        tp,
        config,
        [seg],
        log_start_offset=0,
        recovery_point=0,
        next_offset=0,
        writable=True,
        track_batches=True,
        bulk_writes=True,
    )


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
        self.segments.append(
            StagedSegment(
                self.dir,
                self.next_offset,
                nxt,
                len(buf),
                scan.positions.copy(),
                bases,
                int(scan.headers["max_timestamp"].astype(np.int64).max()),
            )
        )
        self.next_offset = nxt


class RecordStager:
    """Routes, encodes and stages one task's rows. Columns: value, and optionally key, timestamp,
    headers, topic, partition (as Spark's Kafka sink takes them)."""

    def __init__(
        self,
        lm: LogManager,
        writer_id: int,
        *,
        topic: str | None,
        compression: CompressionType,
        new_topic_config: dict | None = None,
        new_topic_partitions: int = 1,
        task_index: int = 0,
        max_batch_bytes: int | None = None,
        compression_level: int | None = None,
    ):
        self.lm = lm
        self.writer_id = writer_id
        self.topic = topic
        self.compression = compression
        self.new_topic_config = new_topic_config or {}
        self.new_topic_partitions = new_topic_partitions
        self.task_index = task_index
        self.max_batch_bytes = max_batch_bytes
        self.compression_level = compression_level  # None: the topic's compression.<codec>.level
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
        if "topic" in table.column_names and self.topic is None:  # a topic option overrides the column
            topics = table.column("topic")
            if topics.null_count:
                i = int(np.flatnonzero(topics.is_null().to_numpy(zero_copy_only=False))[0])
                raise InvalidConfigError(
                    f"row {first_row + i} of the task's input has a null topic and no 'topic' option is set"
                )
            for name in pc.unique(topics).to_pylist():  # per topic, not per row
                mask = pc.equal(topics, name)
                self._add_topic(table.filter(mask), name)
        else:
            if self.topic is None:
                raise InvalidConfigError("the input has no 'topic' column and no 'topic' option is set")
            self._add_topic(table, self.topic, first_row)

    def _add_topic(self, table, topic: str, first_row: int | None = None) -> None:
        num_partitions, max_bytes = self._topic_info(topic)
        n = table.num_rows
        if "partition" in table.column_names and table.column("partition").null_count < n:
            explicit = table.column("partition")
            parts = pc.fill_null(explicit, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            bad = np.flatnonzero(
                (parts >= num_partitions) | ((parts < 0) & ~explicit.is_null().to_numpy(zero_copy_only=False))
            )
            if bad.size:
                i = int(bad[0])
                row = f"row {first_row + i} of the task's input" if first_row is not None else "a row"
                raise InvalidConfigError(
                    f"{row}: partition {int(parts[i])} does not exist: topic '{topic}' has "
                    f"{num_partitions} partition(s)"
                )
            missing = parts < 0
        else:
            parts = np.full(n, -1, np.int64)
            missing = np.ones(n, bool)
        if missing.any():
            keys = table.column("key") if "key" in table.column_names else pa.nulls(n, pa.binary())
            if not missing.all():  # (no partition column: every row is keyed, and nothing is copied)
                keys = keys.filter(pa.array(missing))
            parts[missing] = partition_for_keys(keys, num_partitions, null_key_start=self._null_keys)
            self._null_keys += keys.null_count
        cols = [c for c in ("key", "value", "timestamp", "headers") if c in table.column_names]
        body = table.select(cols)
        order = None
        if n > 1 and (parts[1:] < parts[:-1]).any():  # each partition's rows, in input order: no gather of the data
            order = np.argsort(parts.astype(np.int16) if num_partitions <= 2**15 else parts, kind="stable")
            parts = parts[order]  # (a stable sort of int16 is a radix sort)
        starts = np.concatenate(([0], np.flatnonzero(parts[1:] != parts[:-1]) + 1, [n]))
        level = self.compression_level
        if level is None:
            level = self._configs[topic].compression_level(self.compression)
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=False):
            data, scan = encode_records(
                body if order is not None else body.slice(a, b - a),
                rows=order[a:b] if order is not None else None,
                compression=self.compression,
                compression_level=level,
                producer_id=self.writer_id,
                producer_epoch=0,
                max_batch_bytes=max_bytes,
            )
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
            staging: Log | _ObjectStaging
            if self._immutable:
                staging = _ObjectStaging(fs, d, tp, config.max_message_bytes)
            else:
                staging = staging_log(fs, d, tp, config)
            self._logs[tp] = (staging, 0)
        staging, rows = self._logs[tp]
        staging.append(data, built=scan)
        self._logs[tp] = (staging, rows + records)
        if self._immutable:  # bound the task's memory: write out the biggest buffer when it holds too much
            held = [(st.pending, key) for key, (st, _) in self._logs.items() if isinstance(st, _ObjectStaging)]
            if sum(n for n, _ in held) >= STAGE_MEMORY_BYTES:
                self._logs[max(held)[1]][0].flush()

    def _adoptable(self, staging: Log) -> bool:
        config = self._configs[staging.tp.topic]
        threshold = min(ADOPT_MIN_BYTES, max(1, config.segment_bytes // 2))
        return (
            staging.size >= threshold
            and config.message_timestamp_type == "CreateTime"
            and self.lm.fs.capabilities.atomic_rename
        )

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
                segments.append(
                    StagedSegment(
                        staging.dir, seg.base_offset, nxt, seg.size, positions, bases, seg.max_timestamp_so_far
                    )
                )
            staging.release(fsync=adopt)  # rolled segments were fsynced on roll; no final time entry here
            parts.append(StagedPartition(tp.topic, tp.partition, tuple(segments), rows, adopt))
        self._logs.clear()
        return StagedFile(self.name, tuple(parts), self.task_index)

    def abort(self) -> None:
        self._pending = []
        for staging, _ in self._logs.values():
            if isinstance(staging, _ObjectStaging):
                continue
            staging.release(fsync=False)
        self._logs.clear()
        for d in self._dirs:
            self.lm.fs.delete_dir(d)
