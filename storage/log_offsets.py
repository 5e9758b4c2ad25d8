"""LogOffsetsCache: log start, end and last stable offsets of many partitions (Kafka's ListOffsets for EARLIEST
and LATEST, at either isolation level), for a stream reader that asks for all of them every trigger.

A partition's offsets are computed from its files by LogManager.open_log (its listing, the last batch
and its CRC) and reused while nothing they depend on has changed:
- the partition directory's version (a segment made, deleted, renamed or swapped changes it);
- the active segment's `.log` version (an append or a truncation changes it);
- the partition's entry in log-start-offset-checkpoint (delete-records moves only that).

Versions come from LogFileSystem.file_version (local disk: inode, size, mtime, ctime). One whose mtime is
less than SETTLE_NS old is not trusted: a second change within the filesystem's timestamp tick would
leave it unchanged. On object stores segments are immutable, create-only objects, so the partition's
listing (names and sizes: one LIST, or the store's listing cache) is its version. memory:// computes
every time.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from dataclasses import dataclass

from .fs.filesystem import FileVersion
from .log_manager import LogManager
from .topic_partition import TopicPartition

#: A version this much older than now is settled: any later change shows in it. File timestamps tick
#: in jiffies (1-10 ms) locally; NFS servers stamp with their own clock, hence the wide margin.
SETTLE_NS = 2_000_000_000


@dataclass(frozen=True)
class LogOffsetSnapshot:
    log_start_offset: int
    log_end_offset: int
    last_stable_offset: int  # LATEST under read_committed; it moves only with the log's files, as the others


@dataclass(frozen=True)
class _Entry:
    dir: str
    active_log: str
    dir_version: Hashable
    log_version: FileVersion | None
    checkpointed_start: int | None
    offsets: LogOffsetSnapshot


class LogOffsetsCache:
    """Offsets per partition, recomputed only for partitions whose files changed (see the module doc)."""

    def __init__(self, clock_ns=time.time_ns):
        self.clock_ns = clock_ns
        self._entries: dict[TopicPartition, _Entry] = {}
        self.hits = self.misses = 0

    def offsets(self, lm: LogManager, tp: TopicPartition) -> LogOffsetSnapshot:
        """The partition's offsets now. Raises as LogManager.open_log does (unknown partition, damage)."""
        fs = lm.fs
        start = lm.checkpointed_log_start(tp)
        entry = self._entries.get(tp)
        if entry is not None:
            if (
                entry.checkpointed_start == start
                and self._dir_version(fs, entry.dir) == entry.dir_version
                and fs.file_version(entry.active_log) == entry.log_version
            ):
                self.hits += 1
                return entry.offsets
            del self._entries[tp]
        self.misses += 1
        dir = lm.partition_dir(tp)
        before = self._dir_version(fs, dir)
        with lm.open_log(tp) as log:
            found = LogOffsetSnapshot(log.log_start_offset, log.log_end_offset, log.last_stable_offset)
            active, seen_size = log.active_segment.log_path, log.active_segment.size
        if before is None or self._dir_version(fs, dir) != before:
            return found
        if isinstance(before, FileVersion):  # a stat: trusted once settled, with the active .log's own
            log_version = fs.file_version(active)
            settled = self.clock_ns() - SETTLE_NS
            if not (
                log_version is not None
                and log_version.size == seen_size
                and before.mtime_ns < settled
                and log_version.mtime_ns < settled
            ):
                return found
        else:
            log_version = None
        self._entries[tp] = _Entry(dir, active, before, log_version, start, found)
        return found

    @staticmethod
    def _dir_version(fs, dir: str) -> Hashable | None:
        version = fs.file_version(dir)
        if version is not None or fs.capabilities.append:
            return version
        return tuple(sorted((f.name, f.size, f.is_dir) for f in fs.listdir(dir)))

    def forget(self, keep) -> None:
        """Drop the entries of partitions not in `keep` (gone from the query)."""
        for tp in [tp for tp in self._entries if tp not in keep]:
            del self._entries[tp]
