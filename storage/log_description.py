"""What LogManager.describe() returns (Kafka's DescribeLogDirs answer): log dirs, topics, partitions and
segments as read from the files, with to_dict() for `kafkalog describe --json`. Plain values, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentDescription:
    """One segment of a described partition (only the active one may be empty)."""

    base_offset: int
    size: int  # bytes of its .log
    largest_timestamp: int

    def to_dict(self) -> dict:
        return {"baseOffset": self.base_offset, "size": self.size, "largestTimestamp": self.largest_timestamp}


@dataclass(frozen=True)
class PartitionDescription:
    """One partition of a described topic; log_dir is None while it has no directory (nothing written)."""

    partition: int
    log_start_offset: int
    log_end_offset: int
    size: int  # bytes of all its segments
    segments: tuple[SegmentDescription, ...]
    log_dir: str | None = None  # the URL of the log dir holding it

    def to_dict(self) -> dict:
        where = {} if self.log_dir is None else {"logDir": self.log_dir}
        return {
            "partition": self.partition,
            **where,
            "logStartOffset": self.log_start_offset,
            "logEndOffset": self.log_end_offset,
            "size": self.size,
            "segments": [s.to_dict() for s in self.segments],
        }


@dataclass(frozen=True)
class TableDescription:
    """A topic's Iceberg table as ROOT's table state records it (storage/tables/table_state.py), and its lag:
    offsets and time behind the log end. `error`: the state could not be read."""

    table: str
    mode: str
    paused: bool  # table.mode is off now, the table stays
    next_offsets: dict[int, int]
    offsets_behind: int  # the log end offsets less the table's, summed over partitions
    time_behind_ms: int  # the newest record timestamp in the log less the newest in the table (0: caught up)
    metadata_location: str
    committed_at_ms: int  # -1: nothing committed yet
    gaps: tuple[tuple[int, int, int], ...]
    error: str | None = None

    def to_dict(self) -> dict:
        return {
            "table": self.table,
            "mode": self.mode,
            "paused": self.paused,
            "nextOffsets": {str(p): o for p, o in sorted(self.next_offsets.items())},
            "offsetsBehind": self.offsets_behind,
            "timeBehindMs": self.time_behind_ms,
            "metadataLocation": self.metadata_location,
            "committedAtMs": self.committed_at_ms,
            "gaps": [list(g) for g in self.gaps],
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True)
class TopicDescription:
    """One described topic: its id (None for a topic Kafka wrote, with no topic file), config overrides,
    partitions and its Iceberg table (None: not kept as one)."""

    topic: str
    topic_id: str | None
    config: dict[str, str]
    partitions: tuple[PartitionDescription, ...]
    table: TableDescription | None = None

    def to_dict(self) -> dict:
        return {
            "topic": self.topic,
            "partitions": [p.to_dict() for p in self.partitions],
            "config": self.config,
            "topicId": self.topic_id,
            **({"table": self.table.to_dict()} if self.table is not None else {}),
        }


@dataclass(frozen=True)
class LogDirsDescription:
    """What LogManager.describe() found under ROOT (its URL); to_dict() is `kafkalog describe --json`."""

    root: str
    topics: tuple[TopicDescription, ...]

    def to_dict(self) -> dict:
        return {"root": self.root, "topics": [t.to_dict() for t in self.topics]}
