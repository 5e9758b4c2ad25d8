"""LogManager: Kafka's log dirs. Topics and their configs, partition logs, checkpoints, and the background
duties (retention, delete-records, topic deletion).

ROOT names one log dir or several (log_dirs.py). A new partition goes to the log dir holding the fewest
partitions (ties: the first listed); a partition is found in whichever dir holds it; each log dir keeps
checkpoint files for the partitions it holds. Topic metadata lives in the first log dir as one topic file
per topic (metadata/topic_metadata.py; one found in another log dir is read too). Topics whose partition
directories exist without that file (a log dir written by Kafka) are found from the directory names and
get the default config.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterable

from .common.time import SYSTEM_TIME
from .errors import (
    InvalidConfigError,
    InvalidTopicError,
    KafkaStorageError,
    LogLockedError,
    OffsetOutOfRangeError,
    TableError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
)
from .fs.filesystem import LogFileSystem
from .log import Log
from .log_config import LogConfig
from .log_description import (
    LogDirsDescription,
    PartitionDescription,
    SegmentDescription,
    TableDescription,
    TopicDescription,
)
from .log_dirs import LOG_DIRS_PREFIX, open_log_dirs
from .log_listing import LogListing
from .log_loader import LOCK_FILE, LogLoader
from .log_retention import (
    RetentionResult,
    delete_old_segments,
    plan_deletion,
    remove_expired_delete_dirs,
    remove_expired_deleted_files,
    write_delete_marker,
)
from .metadata.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    CorruptCheckpointError,
    OffsetCheckpointFile,
)
from .metadata.topic_metadata import (
    MAX_PARTITIONS,
    TOPIC_FILE_SUFFIX,
    TopicMetadata,
    read_topic_file,
    topic_file_name,
    topic_named_in,
)
from .objects.segment_metadata import largest_timestamp
from .tables.table_config import TableConfig, check_change, require_pyiceberg
from .tables.table_state import forget_state, read_state, retention_hold
from .topic_partition import (
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TopicPartition,
    deleted_dir_name,
    parse_log_dir_name,
    partition_dir_name,
    segment_file_name,
    unify_collision_chars,
    validate_topic_name,
)

logger = logging.getLogger(__name__)

ROOT_LOCK_FILE = ".lock"
CHECKPOINT_FILES = (RECOVERY_POINT_CHECKPOINT_FILE, LOG_START_OFFSET_CHECKPOINT_FILE, CLEANER_OFFSET_CHECKPOINT_FILE)


def _rename_dir(fs: LogFileSystem, src: str, dst: str) -> None:
    """Rename a directory; on a store whose rename moves single files (fsspec's memory store), entry by entry."""
    try:
        fs.rename(src, dst)
        return
    except (FileNotFoundError, IsADirectoryError):
        if not fs.isdir(src) or fs.exists(dst):
            raise
    fs.mkdirs(dst)
    for f in fs.listdir(src):
        s, d = fs.join(src, f.name), fs.join(dst, f.name)
        _rename_dir(fs, s, d) if f.is_dir else fs.rename(s, d)
    fs.delete_dir(src)


class LogManager:
    """Everything under the log dirs: create/list/describe/delete topics, open partition logs, keep
    checkpoints, apply retention and delete-records."""

    def __init__(self, root: str, storage_options: dict | None = None, *, fs: LogFileSystem | None = None):
        self.fs, self.log_dirs = open_log_dirs(root, storage_options, fs)
        self.root = self.log_dirs[0]  # the first log dir: topic files, the sink's staging files
        self._checkpoints = {
            d: {name: OffsetCheckpointFile(self.fs, self.fs.join(d, name)) for name in CHECKPOINT_FILES}
            for d in self.log_dirs
        }
        self.recovery_checkpoint = self._checkpoints[self.root][RECOVERY_POINT_CHECKPOINT_FILE]
        self.log_start_checkpoint = self._checkpoints[self.root][LOG_START_OFFSET_CHECKPOINT_FILE]
        self._cache = LogListing(self.fs, self.log_dirs)  # inside snapshot(): what was read, reused

    @contextlib.contextmanager
    def snapshot(self):
        """Inside, log dir listings, topic files and checkpoint files are read once and reused, so a pass
        over N partitions (planning, describe, maintenance, a commit) costs O(N), not O(N) per partition.
        Answers are as of the first read, as if the pass had run a moment earlier; a change made through
        this LogManager forgets them. Writers' recovery points (hints, never fsynced) are written once
        when the snapshot ends, instead of one checkpoint rewrite per closed log. The reads are kept by
        LogListing (log_listing.py)."""
        if self._cache.active:
            yield self
            return
        self._cache.open()
        try:
            yield self
        finally:
            for log_dir, points in self._cache.close().items():
                self._update_dir_checkpoints(log_dir, points, {})

    def forget_snapshot(self) -> None:
        """A change was made: what snapshot() read so far may be stale (a no-op outside snapshot())."""
        self._cache.forget()

    def url(self, path: str | None = None) -> str:
        if path is None:
            if len(self.log_dirs) == 1:
                return self.fs.url(self.root)
            return LOG_DIRS_PREFIX + ",".join(self.fs.url(d) for d in self.log_dirs)
        return self.fs.url(path)

    def _dir_lock(self, log_dir: str, timeout: float = 60):
        """The log dir's `.lock`, held briefly while its checkpoints or topic files change. Lock order:
        partition locks before log dir locks, and the first log dir's before the others'."""
        self.fs.mkdirs(log_dir)
        return self._lock(self.fs.join(log_dir, ROOT_LOCK_FILE), timeout)

    def _lock(self, path: str, timeout: float | None):
        """An exclusive lock, or nothing on a filesystem without locks (object stores), where topic files
        and segments are published with create-only writes and checkpoint files are hints."""
        if not self.fs.capabilities.locks:
            return contextlib.nullcontext()
        return self.fs.lock(path, timeout=timeout)

    def read_checkpoint(self, file: OffsetCheckpointFile) -> dict:
        """A checkpoint file's entries, read once inside snapshot(): do not modify the result."""
        return self._cache.memoized(("checkpoint", file.path), file.read)

    def checkpoint_file(self, name: str, log_dir: str | None = None) -> OffsetCheckpointFile:
        """A checkpoint file (recovery point, log start offset, cleaner offset) of one log dir (default: first)."""
        return self._checkpoints[log_dir or self.root][name]

    def log_dir_of(self, tp: TopicPartition) -> str:
        """The log dir that holds (or would now get) a partition."""
        return self._log_dir_of_path(self.partition_dir(tp))

    def _log_dir_of_path(self, partition_path: str) -> str:
        parent = self.fs.dirname(partition_path)
        return parent if parent in self._checkpoints else self.root

    # ------------------------------------------------------------------ topics
    def _topic_file(self, topic: str) -> str:
        return self.fs.join(self.root, topic_file_name(topic))

    def _topic_files(self, topic: str) -> list[str]:
        """The topic's metadata files that exist, first log dir first."""
        name = topic_file_name(topic)
        return [self.fs.join(d, name) for d in self.log_dirs if self._cache.has(d, name, False)]

    def create_topic(self, topic: str, partitions: int = 1, config: dict | None = None) -> TopicMetadata:
        """Validate, persist the topic file with a create-only write, and make the partition directories.
        On a filesystem with append and locks (local disk, memory://) each new partition also gets its
        first, empty segment files (`00000000000000000000.log`, `.index`, `.timeindex`), as Kafka creates
        them with the topic. On an object store a segment object exists only once an append creates it."""
        validate_topic_name(topic)
        self.forget_snapshot()
        if isinstance(partitions, bool) or not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidConfigError(
                f"topic {topic}: the partition count must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}"
            )
        cfg = LogConfig.from_dict(config or {})
        if cfg.table_mode != "off":
            self._check_table_config(topic, cfg)
        if self._partition_dirs().get(topic) or self._topic_files(topic):
            raise TopicExistsError(f"topic '{topic}' already exists in {self.url()}")
        clash = [t for t in self.topics() if t != topic and unify_collision_chars(t) == unify_collision_chars(topic)]
        if clash:  # Kafka's rule: '.' and '_' collide in metric names
            raise InvalidTopicError(f"Topic '{topic}' collides with existing topic: {clash[0]}")
        meta = TopicMetadata(topic, partitions, cfg, uuid.uuid4().hex)
        body = meta.to_bytes()
        with self._dir_lock(self.root):  # writers make missing partition dirs under it: none before we are done
            if not self.fs.create_exclusive(self._topic_file(topic), body):
                raise TopicExistsError(f"topic '{topic}' already exists in {self.url()}")
            self._prune_checkpoints(topic)  # entries left by a topic of this name removed by hand
            counts = self._partition_counts()
            for p in range(partitions):
                if self._locate(TopicPartition(topic, p)) is None:
                    d = min(self.log_dirs, key=lambda d: counts[d])  # min keeps the first of equals
                    counts[d] += 1
                    path = self.fs.join(d, partition_dir_name((topic, p)))
                    self.fs.mkdirs(path)
                    self._create_first_segment(path)
        if self.fs.capabilities.fsync:  # the new entries survive a power cut with the data under them
            for d in self.log_dirs:
                if self.fs.isdir(d):
                    self.fs.sync_dir(d)
        self.forget_snapshot()  # what was read above, before the topic existed
        return meta

    def _create_first_segment(self, partition_path: str) -> None:
        """A new partition's empty segment files at offset 0, as Kafka's topic creation leaves them. Only
        where segments are appended in place: on an object store an empty active segment lives in memory
        until an append creates its object. Create-only, so a writer that opened the new directory first
        (it needs no log dir lock) keeps what it wrote."""
        caps = self.fs.capabilities
        if not (caps.append and caps.locks):
            return
        for suffix in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):  # empty: nothing to fsync
            self.fs.create_exclusive(self.fs.join(partition_path, segment_file_name(0, suffix)), b"", durable=False)
        if caps.fsync:
            self.fs.sync_dir(partition_path)  # the three entries, in one fsync

    def get_or_create_topic(self, topic: str, partitions: int = 1, config: dict | None = None) -> TopicMetadata:
        try:
            return self.topic(topic)
        except UnknownTopicOrPartitionError:
            try:
                return self.create_topic(topic, partitions, config)
            except TopicExistsError:  # another process won the race
                return self.topic(topic)

    def _live_dirs(self) -> dict[TopicPartition, list[str]]:
        """Every live partition directory, by partition (more than one path: the same partition in two dirs)."""
        out: dict[TopicPartition, list[str]] = {}
        for d in self.log_dirs:
            for f in self._cache.listing(d):
                if not f.is_dir:
                    continue
                parsed = parse_log_dir_name(f.name)
                if parsed is not None and parsed.kind == "live":
                    out.setdefault(parsed.topic_partition, []).append(self.fs.join(d, f.name))
        return out

    def _partition_dirs(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for tp in self._live_dirs():
            out.setdefault(tp.topic, set()).add(tp.partition)
        return out

    def _partition_counts(self) -> dict[str, int]:
        counts = {d: 0 for d in self.log_dirs}
        for paths in self._live_dirs().values():
            for path in paths:
                counts[self._log_dir_of_path(path)] += 1
        return counts

    def topics(self) -> list[str]:
        names = set(self._partition_dirs())
        for d in self.log_dirs:
            for f in self._cache.listing(d):
                if f.is_dir or not f.name.endswith(TOPIC_FILE_SUFFIX):
                    continue
                stem = f.name[: -len(TOPIC_FILE_SUFFIX)]
                if "~" not in stem:
                    names.add(stem)
                    continue
                try:  # a long topic's hashed file name: the name is in the file
                    name = topic_named_in(read_topic_file(self.fs, self.fs.join(d, f.name)))
                except FileNotFoundError:
                    continue
                except (ValueError, KeyError, TypeError) as e:
                    raise InvalidConfigError(f"topic file {self.url(self.fs.join(d, f.name))} is not valid: {e}") from e
                if topic_file_name(name) == f.name:
                    names.add(name)
        return sorted(names)

    def topic(self, topic: str) -> TopicMetadata:
        return self._cache.memoized(("topic", topic), lambda: self._read_topic(topic))

    def _read_topic(self, topic: str) -> TopicMetadata:
        for path in self._topic_files(topic)[:1]:
            try:
                meta = TopicMetadata.from_bytes(read_topic_file(self.fs, path))
                if meta.name != topic:
                    raise ValueError(f"it names topic {meta.name!r}, not {topic!r}")
                return meta
            except FileNotFoundError:
                break  # deleted since we looked
            except (ValueError, KeyError, TypeError) as e:
                raise InvalidConfigError(f"topic file {self.url(path)} is not valid: {e}") from e
        parts = self._partition_dirs().get(topic)
        if not parts:
            raise UnknownTopicOrPartitionError(f"topic '{topic}' does not exist in {self.url()}")
        return TopicMetadata(topic, max(parts) + 1, LogConfig(), None, persisted=False)

    def alter_topic_config(self, topic: str, set_config: dict, delete_keys: Iterable[str] = ()) -> TopicMetadata:
        self.forget_snapshot()
        meta = self.topic(topic)
        overrides = {k: v for k, v in meta.config.overrides.items() if k not in set(delete_keys)}
        overrides.update({k: str(v) for k, v in set_config.items()})
        config = LogConfig.from_dict(overrides)
        self._check_table_config(topic, config)
        new = TopicMetadata(topic, meta.partitions, config, meta.topic_id or uuid.uuid4().hex)
        body = new.to_bytes()
        with self._dir_lock(self.root, timeout=30):
            self.fs.write_atomic((self._topic_files(topic) or [self._topic_file(topic)])[0], body)
        self.forget_snapshot()
        return new

    def _check_table_config(self, topic: str, config: LogConfig) -> None:
        """A table config needs the tables extra, and cannot change under a table already made
        (storage/tables/table_config.check_change)."""
        if config.table_mode != "off":
            require_pyiceberg(topic)
            if not config.table_catalog and self.fs.protocol != "file":
                raise InvalidConfigError(
                    f"topic '{topic}': {self.url()} is not on local disk, so it has no table catalog of its own "
                    f"(SQLite needs a local file): set table.catalog to a pyiceberg catalog (docs/tables.md, "
                    f"'Catalogs')"
                )
        state = read_state(self.fs, self.root, topic)
        check_change(topic, config, state.shape if state is not None else None)

    # ------------------------------------------------------------------ partitions
    def _locate(self, tp: TopicPartition) -> str | None:
        """The partition's directory in whichever log dir holds it, or None."""
        name = partition_dir_name(tp)
        found = [self.fs.join(d, name) for d in self.log_dirs if self._cache.has(d, name, True)]
        if len(found) > 1:
            raise KafkaStorageError(
                f"partition {tp.topic}-{tp.partition} has a directory in two log dirs: "
                f"{self.url(found[0])} and {self.url(found[1])}; remove one of them"
            )
        return found[0] if found else None

    def partition_dir(self, tp: TopicPartition) -> str:
        """The partition's directory: where it is, or, for a partition with none yet, where it would go now."""
        name = partition_dir_name(tp)
        if len(self.log_dirs) == 1:
            return self.fs.join(self.root, name)
        found = self._locate(tp)
        if found is not None:
            return found
        counts = self._partition_counts()
        return self.fs.join(min(self.log_dirs, key=lambda d: counts[d]), name)

    def partitions(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in range(self.topic(topic).partitions)]

    def _check_partition(self, tp: TopicPartition) -> TopicMetadata:
        meta = self.topic(tp.topic)
        if not 0 <= tp.partition < meta.partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {tp.partition} does not exist: topic '{tp.topic}' has {meta.partitions} partition(s)"
            )
        return meta

    def _create_partition_dir(self, tp: TopicPartition) -> str:
        """Make a missing partition directory, under the first log dir's lock so that a topic deletion or
        another writer placing it elsewhere cannot interleave."""
        self.forget_snapshot()
        with self._dir_lock(self.root):
            self._check_partition(tp)  # the topic may have been deleted since
            path = self.partition_dir(tp)
            self.fs.mkdirs(path)
        self.forget_snapshot()
        return path

    def open_log(
        self,
        tp: TopicPartition,
        *,
        writable: bool = False,
        lock_timeout: float | None = 30.0,
        config: LogConfig | None = None,
    ) -> Log:
        """Load a partition. A writable Log holds the partition lock until close() and records the
        recovery point and log start offset in its log dir's checkpoint files when it closes."""
        meta = self._check_partition(tp)
        dir = self._locate(tp)
        if dir is None:
            if writable:
                dir = self._create_partition_dir(tp)
            elif meta.persisted and self._topic_files(tp.topic):
                # The topic file declares the partition, nothing was written to it yet: an empty log. On an
                # object store this is the normal case (a prefix exists only once an object is under it).
                # The topic file is looked up again so a topic deleted since topic() read it stays unknown.
                dir = self.partition_dir(tp)
            else:
                raise UnknownTopicOrPartitionError(
                    f"partition directory {self.url(self.partition_dir(tp))} does not exist"
                )
        log_dir = self._log_dir_of_path(dir)
        files = self._checkpoints[log_dir]
        key = (tp.topic, tp.partition)
        recovery = self._cache.deferred_recovery_point(log_dir, key)
        if recovery is None:
            recovery = self._cache.memoized(("recovery", log_dir), lambda: self._recovery_points(files)).get(key, 0)
        start = self._cache.memoized(("start", log_dir), files[LOG_START_OFFSET_CHECKPOINT_FILE].read).get(key, 0)
        log = LogLoader(
            self.fs,
            dir,
            tp,
            config or meta.config,
            recovery_point=recovery,
            log_start_offset=start,
            writable=writable,
            lock_timeout=lock_timeout,
            create_dir=False,
        ).load()
        if writable:
            log.call_on_close(self._record_checkpoints)
        return log

    def checkpointed_log_start(self, tp: TopicPartition) -> int | None:
        """The partition's entry in its log dir's log-start-offset-checkpoint (None: it has none)."""
        if len(self.log_dirs) == 1:
            log_dir = self.root
        else:
            path = self._locate(tp)
            log_dir = self._log_dir_of_path(path) if path is not None else self.root
        files = self._checkpoints[log_dir]
        return self._cache.memoized(("start", log_dir), files[LOG_START_OFFSET_CHECKPOINT_FILE].read).get(
            (tp.topic, tp.partition)
        )

    def _record_checkpoints(self, log: Log) -> None:
        log_dir, key = self._log_dir_of_path(log.dir), (log.tp.topic, log.tp.partition)
        if not self._cache.active:
            self._update_dir_checkpoints(log_dir, {log.tp: log.recovery_point}, {log.tp: log.log_start_offset})
            return
        self._cache.defer_recovery_point(log_dir, key, log.recovery_point)
        start = self._cache.memoized(
            ("start", log_dir), self._checkpoints[log_dir][LOG_START_OFFSET_CHECKPOINT_FILE].read
        )
        if start.get(key, 0) != log.log_start_offset:  # delete-records or retention: written now, durably
            self._update_dir_checkpoints(log_dir, {}, {log.tp: log.log_start_offset})

    def update_checkpoints(self, recovery_points: dict, log_start_offsets: dict) -> None:
        """Merge entries into the checkpoint files of the log dirs holding the partitions (see
        _update_dir_checkpoints: log start offsets are only raised)."""
        by_dir: dict[str, tuple[dict, dict]] = {}
        for i, entries in enumerate((recovery_points, log_start_offsets)):
            for k, v in entries.items():
                tp = TopicPartition(*k)
                path = self._locate(tp)
                d = self._log_dir_of_path(path) if path is not None else self.root
                by_dir.setdefault(d, ({}, {}))[i][tp] = v
        for d, (rps, lsos) in by_dir.items():
            self._update_dir_checkpoints(d, rps, lsos)

    def _update_dir_checkpoints(self, log_dir: str, recovery_points: dict, log_start_offsets: dict) -> None:
        """Merge entries in, under the log dir's lock. Log start offsets are only ever raised: a writer that
        read its entry before waiting for the partition lock, or a pass that read it long ago, must not
        undo a delete-records made meanwhile (nothing lowers a log start offset; topic deletion removes
        the entries instead)."""
        self.forget_snapshot()
        files = self._checkpoints[log_dir]
        with self._dir_lock(log_dir):
            if recovery_points:
                cur = self._recovery_points(files)
                new = {tuple(k): v for k, v in recovery_points.items() if cur.get(tuple(k)) != v}
                if new:  # a hint (recovery only rereads more without it): written without an fsync
                    cur.update(new)
                    files[RECOVERY_POINT_CHECKPOINT_FILE].write(cur, durable=False)
            if log_start_offsets:
                cur = files[LOG_START_OFFSET_CHECKPOINT_FILE].read()
                changed = {
                    TopicPartition(*k): v for k, v in log_start_offsets.items() if cur.get(TopicPartition(*k), 0) < v
                }
                if changed:
                    cur.update(changed)
                    files[LOG_START_OFFSET_CHECKPOINT_FILE].write(cur)

    @staticmethod
    def _recovery_points(files: dict) -> dict:
        """A log dir's recovery points. The file is written without an fsync, so after a crash it may be
        damaged: then every partition is recovered from its start (slower, never wrong)."""
        try:
            return files[RECOVERY_POINT_CHECKPOINT_FILE].read()
        except CorruptCheckpointError as e:
            logger.warning("%s; recovering the partitions of this log dir from their start", e)
            return {}

    def _prune_checkpoints(self, topic: str) -> None:
        """Drop a topic's entries from every checkpoint file. The caller holds the first log dir's lock."""
        self.forget_snapshot()
        for d in self.log_dirs:
            with contextlib.nullcontext() if d == self.root else self._dir_lock(d):
                for f in self._checkpoints[d].values():
                    cur = f.read()
                    kept = {k: v for k, v in cur.items() if k[0] != topic}
                    if len(kept) != len(cur):
                        f.write(kept)

    # ------------------------------------------------------------------ retention and delete-records
    def apply_retention(
        self, tp: TopicPartition, *, now_ms: int | None = None, lock_timeout: float | None = 30.0
    ) -> RetentionResult:
        """One retention run on a partition (see storage/log_retention.py). The plan is made on a reader's
        view; the partition lock is taken only when there is something to delete, and re-plans under it."""
        now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
        hold = self.table_hold(tp)
        with self.open_log(tp) as log:
            if not plan_deletion(log, now_ms=now, hold=hold):
                return RetentionResult(
                    tp,
                    bytes_before=log.size,
                    bytes_after=log.size,
                    log_start_offset_before=log.log_start_offset,
                    log_start_offset=log.log_start_offset,
                )
        with self.open_log(tp, writable=True, lock_timeout=lock_timeout) as log:
            return delete_old_segments(log, now_ms=now, hold=hold)  # close records the new log start offset

    def table_hold(self, tp: TopicPartition) -> int | None:
        """The offset below which retention and the cleaner may act on a partition of a topic kept as an Iceberg
        table (its table's next offset), or None (no table): storage/tables/table_state.retention_hold."""
        return retention_hold(self.fs, self.root, tp.topic, tp.partition, self.topic(tp.topic).config)

    def remove_expired_deleted_files(self, tp: TopicPartition, *, now_ms: int | None = None) -> list[str]:
        """Remove a partition's `.deleted` files older than the topic's file.delete.delay.ms."""
        dir = self._locate(tp)
        if dir is None:
            return []
        delay = self.topic(tp.topic).config.file_delete_delay_ms
        return remove_expired_deleted_files(self.fs, dir, delay, now_ms=now_ms)

    def retention_pass(
        self, topics: Iterable[str] | None = None, *, now_ms: int | None = None, lock_timeout: float | None = 30.0
    ) -> list[RetentionResult]:
        """Retention and `.deleted` file removal for every partition (Kafka's log retention task). A partition
        whose lock stays taken is reported as skipped; topics deleted meanwhile are passed over."""
        now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
        results = []
        for name in self.topics() if topics is None else topics:
            try:
                tps = self.partitions(name)
            except UnknownTopicOrPartitionError:
                continue
            for tp in tps:
                try:
                    result = self.apply_retention(tp, now_ms=now, lock_timeout=lock_timeout)
                except LogLockedError as e:
                    result = RetentionResult(tp, skipped=str(e))
                except UnknownTopicOrPartitionError:
                    continue
                result.removed_files = self.remove_expired_deleted_files(tp, now_ms=now)
                results.append(result)
        return results

    def delete_records(self, tp: TopicPartition, offset: int, *, lock_timeout: float | None = 30.0) -> int:
        """kafka-delete-records: raise the partition's log start offset to `offset` (-1: the log end, which is
        the high watermark here) and persist it; returns the new low watermark. Segments wholly below it go
        at the next retention run, as in Kafka. A lower offset than the current start changes nothing."""
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < -1:
            raise OffsetOutOfRangeError(
                f"delete-records on topic '{tp.topic}' partition {tp.partition}: offset "
                f"{offset!r} is not an offset >= 0 or -1 (the high watermark)"
            )
        with self.open_log(tp, writable=True, lock_timeout=lock_timeout) as log:
            target = log.log_end_offset if offset == -1 else offset
            if target > log.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"cannot delete records of topic '{tp.topic}' partition {tp.partition} before offset {target}: "
                    f"it is beyond the log end offset (high watermark) {log.log_end_offset}; the log start "
                    f"offset is {log.log_start_offset}"
                )
            log.maybe_increment_log_start_offset(target)
            return log.log_start_offset  # close() persists it in log-start-offset-checkpoint

    # ------------------------------------------------------------------ topic deletion
    def delete_topic(self, topic: str, *, lock_timeout: float | None = 30.0, now_ms: int | None = None) -> list[str]:
        """Delete a topic as Kafka does: its metadata goes and every partition directory is renamed to
        `<topic>-<p>.<id>-delete`, so opens fail with UnknownTopicOrPartitionError; the directories are
        removed after the topic's file.delete.delay.ms (remove_deleted_topic_dirs). Each partition's write lock
        is taken first, so a commit in progress finishes whole; if one stays locked past `lock_timeout`
        seconds nothing is deleted. Returns the renamed directories."""
        self.forget_snapshot()
        meta = self.topic(topic)
        now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
        live = sorted((tp, path) for tp, paths in self._live_dirs().items() if tp.topic == topic for path in paths)
        deadline = None if lock_timeout is None else time.monotonic() + lock_timeout
        renamed = []
        with contextlib.ExitStack() as held:
            for tp, path in live:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    held.enter_context(self._lock(self.fs.join(path, LOCK_FILE), remaining))
                except LogLockedError:
                    raise LogLockedError(
                        f"cannot delete topic '{topic}': partition {tp.partition} "
                        f"({self.url(path)}) is still locked by a writer after {lock_timeout}s; "
                        f"nothing was deleted"
                    ) from None
                except FileNotFoundError:
                    continue  # renamed by a concurrent deletion
            with self._dir_lock(self.root):
                for path in self._topic_files(topic):
                    self.fs.delete(path)
                forget_state(self.fs, self.root, topic)  # its table stays in its catalog; a new topic makes its own
                for tp, path in live:
                    if not self.fs.isdir(path):
                        continue
                    dst = self.fs.join(self.fs.dirname(path), deleted_dir_name(tp))
                    _rename_dir(self.fs, path, dst)
                    write_delete_marker(self.fs, dst, tp, delete_time_ms=now, delay_ms=meta.config.file_delete_delay_ms)
                    renamed.append(dst)
                if self.fs.capabilities.fsync:
                    for d in self.log_dirs:
                        if self.fs.isdir(d):
                            self.fs.sync_dir(d)
                self._prune_checkpoints(topic)
        self.forget_snapshot()
        return renamed

    def remove_deleted_topic_dirs(self, *, now_ms: int | None = None) -> list[str]:
        """Remove deleted topics' `-delete` directories whose delay has passed (Kafka's kafka-delete-logs task)."""
        self.forget_snapshot()
        out = []
        for d in self.log_dirs:
            out += remove_expired_delete_dirs(self.fs, d, now_ms=now_ms)
        return out

    # ------------------------------------------------------------------ description
    def describe(self, topics: Iterable[str] | None = None) -> LogDirsDescription:
        """Topics, partitions, log start/end offsets, segments and bytes (read-only)."""
        with self.snapshot():
            described = tuple(self._describe_topic(name) for name in (topics if topics is not None else self.topics()))
        return LogDirsDescription(self.url(), described)

    def _describe_topic(self, name: str) -> TopicDescription:
        meta = self.topic(name)
        partitions = []
        for tp in self.partitions(name):
            dir = self._locate(tp)
            if dir is None:
                partitions.append(PartitionDescription(tp.partition, 0, 0, 0, ()))
                continue
            with self.open_log(tp) as log:
                known = log.segment_metadata()  # object stores: no .timeindex GET per segment
                segments = tuple(
                    SegmentDescription(int(s.base_offset), int(s.size), int(largest_timestamp(s, known)))
                    for s in log.segments
                    if s.size or s is log.active_segment
                )
                partitions.append(
                    PartitionDescription(
                        tp.partition,
                        int(log.log_start_offset),
                        int(log.log_end_offset),
                        int(log.size),
                        segments,
                        log_dir=self.url(self._log_dir_of_path(dir)),
                    )
                )
        return TopicDescription(
            name, meta.topic_id, meta.config.overrides, tuple(partitions), self._describe_table(name, meta, partitions)
        )

    def _describe_table(self, name: str, meta, partitions: list) -> TableDescription | None:
        """The topic's table and its lag, from ROOT's table state (no catalog is asked)."""
        cfg = TableConfig.of(name, meta.config)
        try:
            state = read_state(self.fs, self.root, name)
        except TableError as e:
            shown = cfg.display_name if cfg is not None else name
            return TableDescription(shown, meta.config.table_mode, False, {}, 0, 0, "", -1, (), error=str(e))
        if state is None and cfg is None:
            return None
        if state is None:
            assert cfg is not None
            nxt: dict[int, int] = {}
            return TableDescription(
                cfg.display_name, cfg.mode, False, nxt, sum(p.log_end_offset for p in partitions), 0, "", -1, ()
            )
        behind, time_behind = 0, 0
        for p in partitions:
            table_next = state.next_offsets.get(p.partition, 0)
            if table_next < p.log_end_offset:
                behind += p.log_end_offset - max(table_next, p.log_start_offset)
                newest = max((s.largest_timestamp for s in p.segments), default=-1)
                have = state.max_timestamps.get(p.partition, -1)
                if have < 0:  # nothing of it in the table yet: measured from its oldest segment
                    have = min((s.largest_timestamp for s in p.segments if s.size), default=newest)
                if newest >= 0:
                    time_behind = max(time_behind, newest - have)
        return TableDescription(
            state.table,
            state.shape.get("table.mode", ""),
            cfg is None,
            dict(state.next_offsets),
            behind,
            time_behind,
            state.metadata_location,
            state.committed_at_ms,
            state.gaps,
        )
