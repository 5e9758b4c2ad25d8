"""LogManager: one log dir (ROOT). Topics and their configs, partition logs, and the root checkpoints.

Topic metadata (partition count, config overrides) lives in `ROOT/<topic>.kafkalog-topic.json`: a
file, not a directory, so a Kafka broker pointed at ROOT would still load it. Topics whose
partition directories exist without that file (a log dir written by Kafka) are found from the
directory names and get the default config.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Iterable

from .checkpoint import (
    LOG_START_OFFSET_CHECKPOINT_FILE, RECOVERY_POINT_CHECKPOINT_FILE, OffsetCheckpointFile,
)
from .errors import InvalidConfigError, TopicExistsError, UnknownTopicOrPartitionError
from .filesystem import LogFileSystem, open_filesystem
from .log import Log
from .log_config import LogConfig
from .log_loader import LogLoader
from .topic_partition import TopicPartition, parse_log_dir_name, partition_dir_name, validate_topic_name

TOPIC_FILE_SUFFIX = ".kafkalog-topic.json"
ROOT_LOCK_FILE = ".lock"


@dataclass(frozen=True)
class TopicMetadata:
    name: str
    partitions: int
    config: LogConfig
    topic_id: str | None = None
    persisted: bool = True  # False: inferred from partition directories only

    def to_json(self) -> dict:
        return {"version": 1, "topic": self.name, "topicId": self.topic_id, "partitions": self.partitions,
                "config": self.config.overrides}


class LogManager:
    """Everything under one ROOT: create/list/describe topics, open partition logs, keep checkpoints."""

    def __init__(self, root: str, storage_options: dict | None = None, *, fs: LogFileSystem | None = None):
        if fs is None:
            fs, root = open_filesystem(root, storage_options)
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        self.recovery_checkpoint = OffsetCheckpointFile(fs, fs.join(self.root, RECOVERY_POINT_CHECKPOINT_FILE))
        self.log_start_checkpoint = OffsetCheckpointFile(fs, fs.join(self.root, LOG_START_OFFSET_CHECKPOINT_FILE))

    def url(self, path: str | None = None) -> str:
        return self.fs.url(self.root if path is None else path)

    # ------------------------------------------------------------------ topics
    def _topic_file(self, topic: str) -> str:
        return self.fs.join(self.root, topic + TOPIC_FILE_SUFFIX)

    def create_topic(self, topic: str, partitions: int = 1, config: dict | None = None) -> TopicMetadata:
        """Validate, persist the topic file with a create-only write, and make the partition directories."""
        validate_topic_name(topic)
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidConfigError(f"topic {topic}: partitions must be a positive integer, got {partitions!r}")
        cfg = LogConfig.from_dict(config or {})
        if self._partition_dirs().get(topic):
            raise TopicExistsError(f"topic '{topic}' already exists in {self.url()}")
        meta = TopicMetadata(topic, partitions, cfg, uuid.uuid4().hex)
        self.fs.mkdirs(self.root)
        body = json.dumps(meta.to_json(), indent=2, sort_keys=True).encode() + b"\n"
        if not self.fs.create_exclusive(self._topic_file(topic), body):
            raise TopicExistsError(f"topic '{topic}' already exists in {self.url()}")
        for p in range(partitions):
            self.fs.mkdirs(self.partition_dir(TopicPartition(topic, p)))
        if self.fs.capabilities.fsync:  # the new entries in ROOT survive a power cut with the data under them
            self.fs.sync_dir(self.root)
        return meta

    def get_or_create_topic(self, topic: str, partitions: int = 1, config: dict | None = None) -> TopicMetadata:
        try:
            return self.topic(topic)
        except UnknownTopicOrPartitionError:
            try:
                return self.create_topic(topic, partitions, config)
            except TopicExistsError:  # another process won the race
                return self.topic(topic)

    def _partition_dirs(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for f in self.fs.listdir(self.root):
            if not f.is_dir:
                continue
            parsed = parse_log_dir_name(f.name)
            if parsed is not None and parsed.kind == "live":
                out.setdefault(parsed.topic_partition.topic, set()).add(parsed.topic_partition.partition)
        return out

    def topics(self) -> list[str]:
        names = set(self._partition_dirs())
        for f in self.fs.listdir(self.root):
            if not f.is_dir and f.name.endswith(TOPIC_FILE_SUFFIX):
                names.add(f.name[: -len(TOPIC_FILE_SUFFIX)])
        return sorted(names)

    def topic(self, topic: str) -> TopicMetadata:
        path = self._topic_file(topic)
        if self.fs.exists(path):
            try:
                doc = json.loads(self.fs.read(path))
                return TopicMetadata(doc["topic"], int(doc["partitions"]), LogConfig.from_dict(doc.get("config", {})),
                                     doc.get("topicId"))
            except (ValueError, KeyError, TypeError) as e:
                raise InvalidConfigError(f"topic file {self.url(path)} is not valid: {e}") from e
        parts = self._partition_dirs().get(topic)
        if not parts:
            raise UnknownTopicOrPartitionError(f"topic '{topic}' does not exist in {self.url()}")
        return TopicMetadata(topic, max(parts) + 1, LogConfig(), None, persisted=False)

    def alter_topic_config(self, topic: str, set_config: dict, delete_keys: Iterable[str] = ()) -> TopicMetadata:
        meta = self.topic(topic)
        overrides = {k: v for k, v in meta.config.overrides.items() if k not in set(delete_keys)}
        overrides.update({k: str(v) for k, v in set_config.items()})
        new = TopicMetadata(topic, meta.partitions, LogConfig.from_dict(overrides), meta.topic_id or uuid.uuid4().hex)
        body = json.dumps(new.to_json(), indent=2, sort_keys=True).encode() + b"\n"
        with self.fs.lock(self.fs.join(self.root, ROOT_LOCK_FILE), timeout=30):
            self.fs.write_atomic(self._topic_file(topic), body)
        return new

    # ------------------------------------------------------------------ partitions
    def partition_dir(self, tp: TopicPartition) -> str:
        return self.fs.join(self.root, partition_dir_name(tp))

    def partitions(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in range(self.topic(topic).partitions)]

    def open_log(self, tp: TopicPartition, *, writable: bool = False, lock_timeout: float | None = 30.0,
                 config: LogConfig | None = None) -> Log:
        """Load a partition. A writable Log holds the partition lock until close() and records the
        recovery point and log start offset in ROOT's checkpoint files when it closes."""
        meta = self.topic(tp.topic)
        if not 0 <= tp.partition < meta.partitions:
            raise UnknownTopicOrPartitionError(
                f"partition {tp.partition} does not exist: topic '{tp.topic}' has {meta.partitions} partition(s)")
        key = (tp.topic, tp.partition)
        recovery = self.recovery_checkpoint.read().get(key, 0)
        start = self.log_start_checkpoint.read().get(key, 0)
        dir = self.partition_dir(tp)
        if not writable and not self.fs.isdir(dir):
            raise UnknownTopicOrPartitionError(f"partition directory {self.url(dir)} does not exist")
        log = LogLoader(self.fs, dir, tp, config or meta.config, recovery_point=recovery, log_start_offset=start,
                        writable=writable, lock_timeout=lock_timeout).load()
        if writable:
            log._on_close = self._record_checkpoints
        return log

    def _record_checkpoints(self, log: Log) -> None:
        self.update_checkpoints({log.tp: log.recovery_point}, {log.tp: log.log_start_offset})

    def update_checkpoints(self, recovery_points: dict, log_start_offsets: dict) -> None:
        """Merge entries into the root checkpoint files under the root lock (read, merge, atomic write)."""
        with self.fs.lock(self.fs.join(self.root, ROOT_LOCK_FILE), timeout=60):
            if recovery_points:
                cur = self.recovery_checkpoint.read()
                cur.update({tuple(k): v for k, v in recovery_points.items()})
                self.recovery_checkpoint.write(cur)
            if log_start_offsets:
                cur = self.log_start_checkpoint.read()
                changed = {tuple(k): v for k, v in log_start_offsets.items() if cur.get(tuple(k), 0) != v}
                if changed:
                    cur.update(changed)
                    self.log_start_checkpoint.write(cur)

    # ------------------------------------------------------------------ description
    def describe(self, topics: Iterable[str] | None = None) -> dict:
        """Topics, partitions, log start/end offsets, segments and bytes (read-only)."""
        out = {"root": self.url(), "topics": []}
        for name in (topics if topics is not None else self.topics()):
            meta = self.topic(name)
            t = {"topic": name, "partitions": [], "config": meta.config.overrides, "topicId": meta.topic_id}
            for tp in self.partitions(name):
                dir = self.partition_dir(tp)
                if not self.fs.isdir(dir):
                    t["partitions"].append({"partition": tp.partition, "logStartOffset": 0, "logEndOffset": 0,
                                            "size": 0, "segments": []})
                    continue
                with self.open_log(tp) as log:
                    t["partitions"].append({
                        "partition": tp.partition, "logStartOffset": log.log_start_offset,
                        "logEndOffset": log.log_end_offset, "size": log.size,
                        "segments": [{"baseOffset": s.base_offset, "size": s.size,
                                      "largestTimestamp": s.largest_timestamp} for s in log.segments if s.size
                                     or s is log.active_segment],
                    })
            out["topics"].append(t)
        return out
