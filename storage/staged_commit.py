"""Two-phase append for many parallel writers and one committer (a Spark sink's shape).

Phase 1 (RecordStager, on executors): route rows to partitions, encode them into v2 batches and
write the bytes to one staging file per task at ROOT (a file, so Kafka ignores it).
Phase 2 (commit_staged, on the driver): per partition, under its write lock, skip the batch if
this writer already committed it, else mark it pending, append the staged bytes and mark it
committed (ProducerStateManager). A replayed batch id is skipped partition by partition.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import InvalidConfigError, KafkaStorageError
from .log_manager import LogManager
from .partitioner import partition_for_keys
from .records.builder import build_records
from .records.record_batch import CompressionType, scan_batches
from .topic_partition import TopicPartition

log = logging.getLogger(__name__)

STAGED_PREFIX = ".kafkalog-staged-"
APPEND_CHUNK_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class StagedSection:
    topic: str
    partition: int
    start: int  # byte range in the staging file
    end: int
    records: int


@dataclass(frozen=True)
class StagedFile:
    name: str  # file name under ROOT
    sections: tuple[StagedSection, ...]
    order: int = 0  # the task's partition id: commit appends files in this order

    @property
    def records(self) -> int:
        return sum(s.records for s in self.sections)


def staged_name(writer_id: int) -> str:
    return f"{STAGED_PREFIX}{writer_id}-{uuid.uuid4().hex}"


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
        self.sections: list[StagedSection] = []
        self._appender = None
        self._size = 0
        self._partitions: dict[str, int] = {}
        self._max_bytes: dict[str, int] = {}
        self._null_keys = task_index  # spread null keys, starting at a different partition per task

    def _topic_info(self, topic: str) -> tuple[int, int]:
        if topic not in self._partitions:
            meta = self.lm.get_or_create_topic(topic, self.new_topic_partitions, self.new_topic_config)
            self._partitions[topic] = meta.partitions
            limit = meta.config.max_message_bytes - 61
            self._max_bytes[topic] = min(limit, self.max_batch_bytes or limit)
        return self._partitions[topic], self._max_bytes[topic]

    def add(self, table: pa.Table | pa.RecordBatch) -> None:
        if table.num_rows == 0:
            return
        if "topic" in table.column_names:
            topics = table.column("topic")
            if self.topic is not None:
                topics = pc.fill_null(topics, self.topic)
            elif topics.null_count:
                i = int(np.flatnonzero(topics.is_null().to_numpy(zero_copy_only=False))[0])
                raise InvalidConfigError(f"row {i} has a null topic and no 'topic' option is set")
            for name in pc.unique(topics).to_pylist():  # per topic, not per row
                mask = pc.equal(topics, name)
                self._add_topic(table.filter(mask), name)
        else:
            self._add_topic(table, self.topic)

    def _add_topic(self, table, topic: str) -> None:
        num_partitions, max_bytes = self._topic_info(topic)
        n = table.num_rows
        if "partition" in table.column_names and table.column("partition").null_count < n:
            explicit = table.column("partition")
            parts = pc.fill_null(explicit, -1).to_numpy(zero_copy_only=False).astype(np.int64)
            bad = np.flatnonzero((parts >= num_partitions) | ((parts < 0) & ~explicit.is_null().to_numpy(
                zero_copy_only=False)))
            if bad.size:
                i = int(bad[0])
                raise InvalidConfigError(f"row {i}: partition {int(parts[i])} does not exist: topic '{topic}' has "
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
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        bounds = np.flatnonzero(np.diff(sorted_parts)) + 1
        cols = [c for c in ("key", "value", "timestamp", "headers") if c in table.column_names]
        body = table.select(cols)
        for rows in np.split(order, bounds):
            p = int(parts[rows[0]])
            data = build_records(body.take(pa.array(rows)), compression=self.compression,
                                 producer_id=self.writer_id, producer_epoch=0, max_batch_bytes=max_bytes)
            self._write(topic, p, data, len(rows))

    def _write(self, topic: str, partition: int, data: bytes, records: int) -> None:
        if self._appender is None:
            self.lm.fs.mkdirs(self.lm.root)
            self._appender = self.lm.fs.open_appender(self.lm.fs.join(self.lm.root, self.name))
        self._appender.write(data)
        self.sections.append(StagedSection(topic, partition, self._size, self._size + len(data), records))
        self._size += len(data)

    def finish(self) -> StagedFile | None:
        """Close the staging file; None when the task had no rows."""
        if self._appender is None:
            return None
        self._appender.flush(fsync=False)  # a crash before commit re-runs the task anyway
        self._appender.close()
        self._appender = None
        return StagedFile(self.name, tuple(self.sections), self.task_index)

    def abort(self) -> None:
        if self._appender is not None:
            self._appender.close()
            self._appender = None
        self.lm.fs.delete(self.lm.fs.join(self.lm.root, self.name))


@dataclass
class CommitResult:
    appended: dict[TopicPartition, tuple[int, int]] = field(default_factory=dict)  # tp -> (first, last offset)
    skipped: list[TopicPartition] = field(default_factory=list)  # already held this batch
    records: int = 0


def commit_staged(lm: LogManager, writer_id: int, batch_id: int, staged: list[StagedFile], *,
                  ephemeral: bool = False, lock_timeout: float | None = 600.0) -> CommitResult:
    """Append every staged section, exactly once per (writer, batch, partition); then drop the files.

    Partitions are committed one at a time, each under its write lock; a crash between two leaves
    some committed and the replay skips exactly those. Every staged file's bytes are read before the
    partition's commit begins, so losing a file fails the commit before anything is appended.
    """
    result = CommitResult()
    by_tp: dict[TopicPartition, list[tuple[str, StagedSection]]] = {}
    for f in sorted(staged, key=lambda f: (f.order, f.name)):
        for s in f.sections:
            by_tp.setdefault(TopicPartition(s.topic, s.partition), []).append((f.name, s))
    for tp in sorted(by_tp):
        with lm.open_log(tp, writable=True, lock_timeout=lock_timeout) as plog:
            state = plog.producer_state
            if state.entry(writer_id).committed_batch_id >= batch_id:
                result.skipped.append(tp)
                log.info("%s: batch %d of writer %d is already in the log; skipped", tp, batch_id, writer_id)
                continue
            chunks = list(_read_sections(lm, by_tp[tp]))
            offsets = sum(int((scan_batches(data).headers["last_offset_delta"].astype(np.int64) + 1).sum())
                          for data in chunks)
            first = plog.log_end_offset
            state.begin(writer_id, batch_id, first, first + offsets)
            for data in chunks:
                plog.append(data)
            state.complete(writer_id)
            if ephemeral:
                state.forget(writer_id)
            result.appended[tp] = (first, plog.log_end_offset - 1)
            result.records += sum(s.records for _, s in by_tp[tp])
    cleanup_staged(lm, writer_id, [f.name for f in staged])
    return result


def _read_sections(lm: LogManager, sections: list[tuple[str, StagedSection]]):
    """Staged bytes of one partition in chunks of up to APPEND_CHUNK_BYTES, each read into one
    preallocated bytearray that Log.append then takes over (no further copies)."""
    group: list[tuple[str, StagedSection]] = []
    size = 0
    for name, s in sections + [(None, None)]:
        if name is None or (group and size + (s.end - s.start) > APPEND_CHUNK_BYTES):
            buf, pos = bytearray(size), 0
            for gname, g in group:
                data = lm.fs.read(lm.fs.join(lm.root, gname), g.start, g.end)
                if len(data) != g.end - g.start:
                    raise KafkaStorageError(f"staging file {lm.url(lm.fs.join(lm.root, gname))} is shorter than "
                                            f"its commit message says ({g.start}..{g.end}); nothing was appended")
                buf[pos:pos + len(data)] = data
                pos += len(data)
            if group:
                yield buf
            group, size = [], 0
        if name is not None:
            group.append((name, s))
            size += s.end - s.start


def cleanup_staged(lm: LogManager, writer_id: int, names: list[str] | None = None) -> None:
    """Delete this writer's staging files: all of them, or the named ones plus any older unnamed ones
    (attempts that failed or were killed before reporting). Newer unnamed files are left alone: a
    restarted query may already be staging its replay while an old commit finishes."""
    prefix = f"{STAGED_PREFIX}{writer_id}-"
    mine = [f.name for f in lm.fs.listdir(lm.root) if not f.is_dir and f.name.startswith(prefix)]
    if names is None:
        doomed = mine
    else:
        named = set(names) & set(mine)
        oldest = min((lm.fs.modified_ms(lm.fs.join(lm.root, n)) for n in named), default=None)
        doomed = list(named)
        if oldest is not None:
            doomed += [n for n in mine if n not in named and lm.fs.modified_ms(lm.fs.join(lm.root, n)) <= oldest]
    for name in doomed:
        lm.fs.delete(lm.fs.join(lm.root, name))
