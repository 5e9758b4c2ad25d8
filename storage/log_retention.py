"""Retention: which old segments of a partition go (Kafka's UnifiedLog.deleteOldSegments), and the removal
of `.deleted` files and deleted topics' `-delete` directories once file.delete.delay.ms has passed.

Three passes run in Kafka 3.x's order, each on what the previous one left: segments wholly below
logStartOffset (every cleanup.policy, as in Kafka), then, for policies containing `delete`,
retention.bytes over the whole partition and retention.ms against each segment's largest timestamp.
Each pass takes a prefix of the segments and stops at the first one it keeps. An empty active segment
is never deleted; a non-empty active segment that a pass would delete is rolled first.

A topic kept as an Iceberg table (storage/tables) holds its partitions: retention.bytes and retention.ms delete
a segment only once every offset of it is in the table (below `hold`, the table's next offset), as tiered
storage deletes a segment only once it is copied; a held active segment is never rolled away. The log start
pass (delete-records, an explicit request) is not held: the table records the offsets it skips as a gap.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .common.time import SYSTEM_TIME
from .fs.filesystem import LogFileSystem
from .log import Log
from .log_config import LogConfig
from .log_segment import LogSegment
from .segment_swap import copy_if_present
from .topic_partition import (
    DELETED_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TopicPartition,
    parse_log_dir_name,
    parse_segment_file,
)

REASON_LOG_START_OFFSET = "log-start-offset"
REASON_RETENTION_BYTES = "retention.bytes"
REASON_RETENTION_MS = "retention.ms"

Predicate = Callable[[LogSegment, "LogSegment | None"], bool]


@dataclass
class RetentionResult:
    """What one retention run did to a partition."""

    topic_partition: TopicPartition
    segments_deleted: int = 0
    deleted_base_offsets: list[int] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0
    log_start_offset_before: int = 0
    log_start_offset: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # segments deleted per rule
    rolled: bool = False  # every segment had expired: the active one was rolled so it could go
    removed_files: list[str] = field(default_factory=list)  # expired `.deleted` files removed
    skipped: str | None = None  # why the partition was not examined (a writer held its lock)


def segment_largest_timestamp(seg: LogSegment) -> int:
    """The timestamp retention.ms compares: the segment's largest record timestamp (its .timeindex), or, when
    no record carries one, the .log file's modification time (Kafka's LogSegment.largestTimestamp)."""
    ts = seg.largest_timestamp
    if ts < 0 and seg.size:
        ts = seg.fs.modified_ms(seg.log_path)
    return ts


def _held(make: Callable[[list[LogSegment], int], Predicate | None], hold: int | None):
    """A pass whose segments go only when all their offsets are below `hold` (None: no hold)."""
    if hold is None:
        return make

    def held_make(segs: list[LogSegment], log_start: int) -> Predicate | None:
        pred = make(segs, log_start)
        if pred is None:
            return None
        return lambda seg, nxt: nxt is not None and nxt.base_offset <= hold and pred(seg, nxt)

    return held_make


def _passes(
    config: LogConfig, now_ms: int, hold: int | None = None
) -> Iterator[tuple[str, Callable[[list[LogSegment], int], Predicate | None]]]:
    """(reason, make predicate from (segments, logStartOffset)) per pass; a None predicate skips the pass.
    `hold`: the offset of the topic's table (module doc), below which retention may delete."""

    def below_log_start(segs: list[LogSegment], log_start: int) -> Predicate:
        return lambda seg, nxt: nxt is not None and nxt.base_offset <= log_start

    yield REASON_LOG_START_OFFSET, below_log_start
    if not config.delete:
        return

    def over_size(segs: list[LogSegment], log_start: int) -> Predicate | None:
        limit = config.retention_bytes
        size = sum(s.size for s in segs)
        if limit < 0 or size < limit:
            return None
        diff = size - limit

        def pred(seg: LogSegment, nxt) -> bool:
            nonlocal diff
            if diff - seg.size >= 0:
                diff -= seg.size
                return True
            return False

        return pred

    def expired(segs: list[LogSegment], log_start: int) -> Predicate | None:
        if config.retention_ms < 0:
            return None
        return lambda seg, nxt: now_ms - segment_largest_timestamp(seg) > config.retention_ms

    yield REASON_RETENTION_BYTES, _held(over_size, hold)
    yield REASON_RETENTION_MS, _held(expired, hold)


def _deletable_count(segs: list[LogSegment], pred: Predicate) -> int:
    """How many leading segments `pred` deletes (Kafka's deletableSegments); an empty last segment stays."""
    k = 0
    while k < len(segs):
        nxt = segs[k + 1] if k + 1 < len(segs) else None
        if not pred(segs[k], nxt) or (nxt is None and segs[k].size == 0):
            break
        k += 1
    return k


def plan_deletion(log: Log, *, now_ms: int | None = None, hold: int | None = None) -> list[tuple[int, str]]:
    """(base offset, reason) of every segment a retention run would delete now, in order. Changes nothing,
    so it runs on a reader's Log without the partition lock."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
    segs = log.segments
    log_start = log.log_start_offset
    out: list[tuple[int, str]] = []
    for reason, make in _passes(log.config, now, hold):
        pred = make(segs, log_start)
        k = _deletable_count(segs, pred) if pred is not None else 0
        out += [(s.base_offset, reason) for s in segs[:k]]
        if k == len(segs):
            break  # a roll would leave only a new empty active segment: nothing more to delete
        segs = segs[k:]
        log_start = max(log_start, segs[0].base_offset)
    return out


def delete_old_segments(log: Log, *, now_ms: int | None = None, hold: int | None = None) -> RetentionResult:
    """Apply the three passes to a writable Log (its holder has the partition lock). Segment files are renamed
    to `.deleted`; the caller's close records the new log start offset in log-start-offset-checkpoint.
    Immutable segments (object stores) go through delete_old_segment_objects, checkpoint first."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
    if log.immutable:
        return delete_old_segment_objects(log, Log.record_checkpoints, now_ms=now, hold=hold)
    result = RetentionResult(log.tp, bytes_before=log.size, log_start_offset_before=log.log_start_offset)
    for reason, make in _passes(log.config, now, hold):
        segs = log.segments
        pred = make(segs, log.log_start_offset)
        k = _deletable_count(segs, pred) if pred is not None else 0
        if not k:
            continue
        result.rolled |= k == len(segs)
        doomed = log.delete_oldest_segments(k)
        result.deleted_base_offsets += [s.base_offset for s in doomed]
        result.reasons[reason] = result.reasons.get(reason, 0) + len(doomed)
    result.segments_deleted = len(result.deleted_base_offsets)
    result.bytes_after = log.size
    result.log_start_offset = log.log_start_offset
    return result


def delete_old_segment_objects(
    log: Log, record_log_start: Callable[[Log], None], *, now_ms: int | None = None, hold: int | None = None
) -> RetentionResult:
    """Retention on immutable segments (object stores: no rename, no lock), on a reader's or writer's Log.

    As Kafka orders it: the log start offset moves first and `record_log_start(log)` checkpoints it; then
    each expired segment's objects are copied to `.deleted` twins (in-flight readers go on from them)
    and deleted, `.log` objects first. Every step may be repeated: after a crash, a segment whose
    objects survived sits below the checkpointed log start and the next pass deletes it again. The last
    segment object always stays, even expired (the log end offset is read from it; the log start
    offset then equals the log end offset, so nothing of it is readable)."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
    result = RetentionResult(log.tp, bytes_before=log.size, log_start_offset_before=log.log_start_offset)
    objects = [s for s in log.segments if s.size]
    plan = plan_deletion(log, now_ms=now, hold=hold)
    doomed_bases = {b for b, _ in plan}
    k = 0
    while k < len(objects) and objects[k].base_offset in doomed_bases:
        k += 1
    new_start = objects[k].base_offset if k < len(objects) else log.log_end_offset
    doomed = objects[: min(k, len(objects) - 1)]
    result.rolled = bool(objects) and k == len(objects)
    if new_start > log.log_start_offset:
        log.advance_log_start_offset(new_start)
        record_log_start(log)  # before any object goes: a crash leaves segments below it, deleted next time
    delete_segment_objects(log.fs, log.dir, doomed, orphans_below=log.log_start_offset)
    log.remove_segments(doomed)
    for base, reason in plan:
        if any(s.base_offset == base for s in doomed):
            result.reasons[reason] = result.reasons.get(reason, 0) + 1
    result.deleted_base_offsets = [s.base_offset for s in doomed]
    result.segments_deleted = len(doomed)
    result.bytes_after = log.size
    result.log_start_offset = log.log_start_offset
    return result


def delete_segment_objects(fs: LogFileSystem, dir: str, segments: list[LogSegment], *, orphans_below: int = -1) -> None:
    """Copy each segment's objects to `.deleted` twins, then delete them (.log objects first, so no listing
    shows an index without its log). Idempotent: a missing object is skipped. Index objects below
    `orphans_below` whose .log is gone (a crash between the deletes) go the same way."""
    logs: list[str] = []
    indexes: list[str] = []
    for seg in segments:
        seg.release_readers()
        for path in seg.files():
            if copy_if_present(fs, path, path + DELETED_FILE_SUFFIX):
                (logs if path == seg.log_path else indexes).append(path)
    names = {f.name for f in fs.listdir(dir) if not f.is_dir} if orphans_below > 0 else set()
    for name in sorted(names):
        p = parse_segment_file(name)
        if (
            p is not None
            and not p.extra
            and p.suffix != ".log"
            and p.base_offset < orphans_below
            and f"{p.base_offset:020d}.log" not in names
        ):
            path = fs.join(dir, name)
            if path not in indexes and copy_if_present(fs, path, path + DELETED_FILE_SUFFIX):
                indexes.append(path)
    fs.delete_many(logs)
    fs.delete_many(indexes)


def remove_expired_deleted_files(fs: LogFileSystem, dir: str, delay_ms: int, *, now_ms: int | None = None) -> list[str]:
    """Remove the `.deleted` segment files in a partition directory whose modification time is at least
    `delay_ms` (file.delete.delay.ms) old; returns their names. Needs no lock: nothing reads these names."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
    # one scandir locally, one fresh LIST on object stores (where the deletes are batched too)
    times = fs.modified_times(dir)
    swaps = [p.base_offset for p in map(parse_segment_file, times) if p is not None and p.extra == SWAP_FILE_SUFFIX]
    keep_from = min(swaps, default=None)  # an unfinished swap may still need the originals it moved
    due = sorted(
        n
        for n, t in times.items()
        if now - t >= delay_ms
        and (p := parse_segment_file(n)) is not None
        and p.extra == DELETED_FILE_SUFFIX
        and (keep_from is None or p.base_offset < keep_from)
    )
    fs.delete_many([fs.join(dir, n) for n in due])
    return due


# ---------------------------------------------------------------- deleted topics' directories

#: Written into a partition directory renamed to `-delete`: when it was deleted and the topic's
#: file.delete.delay.ms (the topic file is gone by then). A dir without it (Kafka's) counts from its mtime.
DELETE_MARKER_FILE = "kafkalog-delete.json"
MAX_MARKER_BYTES = 4096


def write_delete_marker(fs: LogFileSystem, dir: str, tp: TopicPartition, *, delete_time_ms: int, delay_ms: int) -> None:
    body = {"topic": tp.topic, "partition": tp.partition, "deleteTimeMs": delete_time_ms, "fileDeleteDelayMs": delay_ms}
    fs.write_atomic(fs.join(dir, DELETE_MARKER_FILE), json.dumps(body).encode() + b"\n")


def delete_dir_due_ms(fs: LogFileSystem, dir: str) -> int:
    """When a `-delete` directory may be removed: its marker's deletion time + delay, else its mtime + the
    default file.delete.delay.ms."""
    marker = fs.join(dir, DELETE_MARKER_FILE)
    try:
        if fs.exists(marker) and fs.size(marker) <= MAX_MARKER_BYTES:
            doc = json.loads(fs.read(marker))
            return int(doc["deleteTimeMs"]) + int(doc["fileDeleteDelayMs"])
    except (ValueError, KeyError, TypeError, FileNotFoundError):
        pass  # an unreadable marker: fall back to the directory's mtime
    return fs.modified_ms(dir) + LogConfig().file_delete_delay_ms


def remove_expired_delete_dirs(fs: LogFileSystem, log_dir: str, *, now_ms: int | None = None) -> list[str]:
    """Remove the `<topic>-<partition>.<id>-delete` directories of one log dir whose delay has passed."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
    removed = []
    for f in fs.listdir(log_dir):
        parsed = parse_log_dir_name(f.name) if f.is_dir else None
        if parsed is None or parsed.kind != "delete":
            continue
        path = fs.join(log_dir, f.name)
        try:
            if now < delete_dir_due_ms(fs, path):
                continue
        except FileNotFoundError:  # removed by another job meanwhile
            continue
        fs.delete_dir(path)
        removed.append(path)
    return sorted(removed)
