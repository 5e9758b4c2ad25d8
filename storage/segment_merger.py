"""Segment merges, and the create-only segment swap both merges and compaction use on object stores.

On an object store every append is its own segment object, so frequent commits leave many small
segments. The merge pass groups adjacent ones below the last object as Kafka's cleaner groups
segments (groupSegmentsBySize: segment.bytes, index bytes, int32 relative offsets) and replaces each
group with one segment holding the same bytes concatenated, indexes rebuilt.

The swap, with create-only writes instead of renames and a lock:

1. PUT `<base>.index.swap` and `<base>.timeindex.swap` (prepared, not yet meaningful).
2. Create `<base>.log.swap` (If-None-Match): THE COMMIT POINT. From here the swap replaces every live
   segment with a base offset in [base, the swap's next offset); readers and writers' loaders see it
   so (LogLoader's swap view) without changing anything.
3. LIST: if another `.log.swap` is in the partition (a second maintenance job), delete ours and give up.
4. Complete (idempotent, any step may be repeated after a crash): copy the replaced objects to
   `.deleted` twins (in-flight readers go on from them; `<base>.log` only while it still holds the old
   bytes), delete the other replaced segments (`.log` objects first), copy the `.swap` onto
   `<base>.log` and put its indexes, then delete the `.swap` objects (`.log.swap` first).

A maintenance job completes a `.swap` it finds only once it is older than the lease TTL (an
abandoned one): younger ones belong to a job still running, which may still roll it back in step 3.
Segments are rewritten only below the "settled" offset (settled_bound), and the sink's writer-state
hint is made complete below it first (settle_hint), since the sink's replay check reads only each
segment's first batch header.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import CorruptRecordError, KafkaStorageError
from .filesystem import LogFileSystem
from .immutable_segment import IndexBuilder, next_offset_of, rebuild_indexes
from .index import OffsetIndex
from .log_segment import INT32_MAX, LogSegment, segment_settings
from .records.record_batch import scan_batches, validate_batches
from .topic_partition import (
    DELETED_FILE_SUFFIX, INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX,
    parse_segment_file, segment_file_name,
)

log = logging.getLogger(__name__)

DEFAULT_MERGE_MIN_AGE_MS = 60_000  # a segment is merged only when created this long ago (see settled_bound)
CACHE_SEGMENT_BYTES = 1 << 20  # settle_hint reads segments up to this size whole, for the merge to reuse
CACHE_BYTES = 64 << 20  # ... up to this much in all
SEGMENT_SUFFIXES = (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)


class SwapAbortedError(KafkaStorageError):
    """A swap was not made (another job's swap is in the partition, or the sources changed)."""


@dataclass
class MergeResult:
    """What one merge pass did to one partition."""

    topic: str
    partition: int
    bound: int = -1  # segments below this offset could be rewritten
    groups: list = field(default_factory=list)  # (base offset, replaced base offsets) per swap
    segments_before: int = 0
    segments_after: int = 0
    bytes_merged: int = 0


# ---------------------------------------------------------------- object helpers


def _names(fs: LogFileSystem, dir: str) -> dict[str, int]:
    fs.invalidate_listings(dir)
    return {f.name: f.size for f in fs.listdir(dir) if not f.is_dir}


def _copy(fs: LogFileSystem, src: str, dst: str) -> bool:
    """Server-side copy; False when src is gone."""
    copy = getattr(fs, "copy", None)
    try:
        if copy is not None:
            copy(src, dst)
        else:
            fs.write_atomic(dst, fs.read(src), durable=False)
        return True
    except FileNotFoundError:
        return False


def _delete_many(fs: LogFileSystem, paths: list[str]) -> None:
    many = getattr(fs, "delete_many", None)
    if many is not None:
        many(paths)
    else:
        for p in paths:
            fs.delete(p)


def modified_times(fs: LogFileSystem, dir: str, names) -> dict[str, int]:
    """Modification times (ms) of objects in dir: one LIST where the store offers it, else one call each."""
    many = getattr(fs, "modified_times", None)
    if many is not None:
        return many(dir)
    out = {}
    for n in names:
        try:
            out[n] = fs.modified_ms(fs.join(dir, n))
        except FileNotFoundError:
            pass
    return out


def _same_object(fs: LogFileSystem, a: str, b: str) -> bool:
    """Whether two objects hold the same bytes (plain MD5 ETags when both have one, else the bytes)."""
    from .object_store import _plain_md5_etag

    inner = getattr(fs, "_fs", None)
    try:
        if inner is not None and hasattr(fs, "_norm"):
            ia, ib = inner.info(fs._norm(a)), inner.info(fs._norm(b))
            if int(ia.get("size") or 0) != int(ib.get("size") or 0):
                return False
            ta, tb = _plain_md5_etag(ia.get("ETag") or ia.get("etag")), _plain_md5_etag(ib.get("ETag") or ib.get("etag"))
            if ta is not None and tb is not None:
                return ta == tb
        elif fs.size(a) != fs.size(b):
            return False
        return fs.read(a) == fs.read(b)
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------- where rewriting is safe


def settled_bound(log, *, now_ms: int, min_age_ms: int) -> int:
    """The offset below which segments may be rewritten: never the last segment object (the log end is
    read from it), and not the trailing segments created less than min_age_ms ago (a sink commit writes
    its writer-state hint right after its segment; min_age_ms must exceed that gap, see settle_hint)."""
    objs = [s for s in log.segments if s.size]
    if not objs:
        return log.log_start_offset
    bound = objs[-1].base_offset
    if min_age_ms > 0 and len(objs) > 1:
        mt = modified_times(log.fs, log.dir, [log.fs.basename(s.log_path) for s in objs[:-1]])
        for s in reversed(objs[:-1]):
            t = mt.get(log.fs.basename(s.log_path))
            if t is not None and now_ms - t >= min_age_ms:
                break
            bound = s.base_offset
    return bound


def settle_hint(log, bound: int, cache: dict | None = None) -> int:
    """Make the sink's writer-state hint complete below `bound` (its asOf >= bound) before segments below
    it are rewritten: the replay check reads only each segment's first batch header from asOf on, which
    a merge or compaction would hide. Returns the offset below which rewriting is safe now. Small
    segments are read whole into `cache` (base -> bytes) for the merge, which needs their bytes anyway."""
    from .producer_state import ObjectProducerStateManager
    from .records.record_batch import MAGIC_OFFSET, RECORD_BATCH_OVERHEAD, RecordBatchHeader

    mgr = ObjectProducerStateManager(log)
    if mgr.as_of >= bound:
        return bound
    budget = CACHE_BYTES
    for seg in mgr.unsummarized(below=bound):
        if cache is not None and RECORD_BATCH_OVERHEAD <= seg.size <= min(budget, CACHE_SEGMENT_BYTES):
            data = log.fs.read(seg.log_path, 0, seg.size)
            if len(data) == seg.size and data[MAGIC_OFFSET] == 2:
                cache[seg.base_offset] = data
                budget -= len(data)
                hd = RecordBatchHeader.read(data)
                mgr.headers[seg.base_offset] = (hd.producer_id, hd.producer_epoch, hd.base_sequence)
    if not mgr.update_hint({}, as_of=bound):  # not written: only what the old hint covers is safe
        return max(min(bound, mgr.as_of), -1)
    return bound


# ---------------------------------------------------------------- the swap


def swap_path(fs: LogFileSystem, dir: str, base: int, suffix: str = LOG_FILE_SUFFIX) -> str:
    return fs.join(dir, segment_file_name(base, suffix, SWAP_FILE_SUFFIX))


def live_path(fs: LogFileSystem, dir: str, base: int, suffix: str = LOG_FILE_SUFFIX) -> str:
    return fs.join(dir, segment_file_name(base, suffix))


def publish_swap(fs: LogFileSystem, dir: str, base: int, log_bytes, off_rows: np.ndarray, time_rows: np.ndarray,
                 *, next_offset: int, check: Callable[[], None] | None = None) -> None:
    """Make a finished output segment replace the live segments in [base, next_offset) (steps 1-4 of the
    module docstring). Raises SwapAbortedError, with nothing changed, if it cannot be committed."""
    if check is not None:
        check()  # the maintenance lease, right before the commit point
    fs.write_atomic(swap_path(fs, dir, base, INDEX_FILE_SUFFIX), off_rows.tobytes(), durable=False)
    fs.write_atomic(swap_path(fs, dir, base, TIME_INDEX_FILE_SUFFIX), time_rows.tobytes(), durable=False)
    log_swap = swap_path(fs, dir, base)
    if not fs.create_exclusive(log_swap, log_bytes):
        raise SwapAbortedError(f"{fs.url(log_swap)} exists already: another maintenance job is swapping segments "
                               f"of this partition; giving up this group")
    others = [n for n in _names(fs, dir) if n.endswith(LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX)
              and n != fs.basename(log_swap)]
    if others:  # another job's swap: nobody completes a young swap but its creator, so ours can go back
        _delete_many(fs, [log_swap])
        _delete_many(fs, [swap_path(fs, dir, base, s) for s in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)])
        raise SwapAbortedError(f"{fs.url(fs.join(dir, others[0]))} appeared while swapping segments at offset "
                               f"{base}: another maintenance job works on this partition; rolled back ours")
    complete_swap(fs, dir, base, next_offset=next_offset, off_rows=off_rows, time_rows=time_rows, fresh=True)


def _swap_next_offset(fs: LogFileSystem, dir: str, base: int, names: dict[str, int], config) -> int:
    """The next offset of a `.swap` segment, from its index swap and tail (validated), else a full scan."""
    size = names.get(segment_file_name(base, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX), 0)
    idx = names.get(segment_file_name(base, INDEX_FILE_SUFFIX, SWAP_FILE_SUFFIX), 0)
    seg = LogSegment(fs, dir, base, file_suffix=SWAP_FILE_SUFFIX, log_size=size,
                     index_size=idx - idx % OffsetIndex.entry_dtype.itemsize, time_index_size=0,
                     **segment_settings(config))
    try:
        return next_offset_of(seg)
    finally:
        seg.release_readers()


def complete_swap(fs: LogFileSystem, dir: str, base: int, *, next_offset: int | None = None, config=None,
                  off_rows: np.ndarray | None = None, time_rows: np.ndarray | None = None,
                  fresh: bool = False) -> bool:
    """Finish the swap committed by `<base>.log.swap` (step 4); every step may be repeated. `fresh`: the
    caller just committed it, so `<base>.log` still holds the old bytes. False if the swap is gone."""
    names = _names(fs, dir)
    swap_name = segment_file_name(base, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    if swap_name not in names:
        return False
    if next_offset is None:
        next_offset = _swap_next_offset(fs, dir, base, names, config)
    log_swap, head = fs.join(dir, swap_name), live_path(fs, dir, base)
    swapped = False if fresh else (segment_file_name(base, LOG_FILE_SUFFIX) in names
                                   and _same_object(fs, head, log_swap))
    doomed: dict[str, list[str]] = {s: [] for s in SEGMENT_SUFFIXES}
    for name in sorted(names):
        p = parse_segment_file(name)
        if p is None or p.extra or p.suffix not in SEGMENT_SUFFIXES or not base <= p.base_offset < next_offset:
            continue
        if p.base_offset == base and swapped:
            continue  # its old bytes were kept as .deleted before the .log was replaced
        _copy(fs, fs.join(dir, name), fs.join(dir, name + DELETED_FILE_SUFFIX))
        if p.base_offset != base:
            doomed[p.suffix].append(fs.join(dir, name))
    _delete_many(fs, doomed[LOG_FILE_SUFFIX])  # .log objects first: a listing never shows an index without one
    _delete_many(fs, doomed[INDEX_FILE_SUFFIX] + doomed[TIME_INDEX_FILE_SUFFIX])
    if not swapped and not _copy(fs, log_swap, head):
        return False  # completed (and its .swap deleted) by another job meanwhile
    if off_rows is None or time_rows is None:
        off_rows, time_rows = _swap_indexes(fs, dir, base, config)
    fs.write_atomic(live_path(fs, dir, base, INDEX_FILE_SUFFIX), off_rows.tobytes(), durable=False)
    fs.write_atomic(live_path(fs, dir, base, TIME_INDEX_FILE_SUFFIX), time_rows.tobytes(), durable=False)
    _delete_many(fs, [log_swap])
    _delete_many(fs, [swap_path(fs, dir, base, s) for s in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX)])
    return True


def _swap_indexes(fs: LogFileSystem, dir: str, base: int, config) -> tuple[np.ndarray, np.ndarray]:
    """The indexes of a completed swap's `<base>.log`, rebuilt from its bytes (a crashed swap's index
    objects are not trusted: they may be another attempt's)."""
    seg = LogSegment(fs, dir, base, index_size=0, time_index_size=0, **segment_settings(config))
    seg.needs_rebuild = True
    rebuild_indexes(seg, write=False)
    return seg.offset_index.entry_array(0).copy(), seg.time_index.entry_array(0).copy()


def complete_pending_swaps(fs: LogFileSystem, dir: str, config, *, now_ms: int, abandoned_after_ms: int) -> list[int]:
    """Complete the `.swap`s of a partition older than abandoned_after_ms (their job is gone), and remove
    prepared index swaps left without a `.log.swap` as old. Returns the completed base offsets."""
    names = _names(fs, dir)
    swaps = [p for p in (parse_segment_file(n) for n in names) if p is not None and p.extra == SWAP_FILE_SUFFIX]
    if not swaps:
        return []
    mt = modified_times(fs, dir, [n for n in names if n.endswith(SWAP_FILE_SUFFIX)])
    old = {n for n, t in mt.items() if now_ms - t >= abandoned_after_ms}
    done = []
    log_swaps = sorted(p.base_offset for p in swaps if p.suffix == LOG_FILE_SUFFIX)
    for base in log_swaps:
        if segment_file_name(base, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX) in old:
            if complete_swap(fs, dir, base, config=config):
                done.append(base)
    stray = [fs.join(dir, segment_file_name(p.base_offset, p.suffix, SWAP_FILE_SUFFIX)) for p in swaps
             if p.suffix != LOG_FILE_SUFFIX and p.base_offset not in log_swaps
             and segment_file_name(p.base_offset, p.suffix, SWAP_FILE_SUFFIX) in old]
    _delete_many(fs, stray)
    return done


def replace_in_memory(log, base: int, size: int, old_segments: list[LogSegment], off_rows=None,
                      time_rows=None) -> None:
    """After an object swap: put the new segment in place of the old ones in a Log's segment list."""
    from .immutable_segment import prime_index

    seg = LogSegment(log.fs, log.dir, base, log_size=size, index_size=0, time_index_size=0, **log.segment_kwargs())
    if off_rows is not None:
        prime_index(seg.offset_index, off_rows)
        prime_index(seg.time_index, time_rows)
    for s in old_segments:
        s.release_readers()
    log.swap_in_memory([seg], old_segments)


# ---------------------------------------------------------------- the merge pass


def merge_groups(log, bound: int, names: set[str]) -> list[list[LogSegment]]:
    """Adjacent segments below `bound` grouped by Kafka's groupSegmentsBySize rules; groups of two or
    more. A segment whose `.log.deleted` twin still exists is not rewritten again (an in-flight reader
    may need the twin), so it breaks a run."""
    from .cleaner import group_segments_by_size

    start_seg = log.segment_for(log.log_start_offset)
    runs: list[list[LogSegment]] = [[]]
    for s in log.segments:
        if not s.size or s.base_offset >= bound or (start_seg is not None and s.base_offset < start_seg.base_offset):
            continue
        if segment_file_name(s.base_offset, LOG_FILE_SUFFIX, DELETED_FILE_SUFFIX) in names:
            runs.append([])
            continue
        runs[-1].append(s)
    cfg = log.config
    out = []
    for run in runs:
        if len(run) > 1:
            out += [g for g in group_segments_by_size(run, cfg.segment_bytes, cfg.segment_index_bytes, bound)
                    if len(g) > 1]
    return out


def build_merged(log, group: list[LogSegment], cache: dict | None = None) -> tuple[bytes, np.ndarray, np.ndarray, int]:
    """(bytes, offset index rows, time index rows, next offset) of a group's segments concatenated.
    Every batch is validated (CRC, lengths, offsets inside its segment and increasing) first."""
    fs = log.fs
    parts, builder, pos, prev_last = [], IndexBuilder(log.config.index_interval_bytes), 0, None
    for seg in group:
        data = (cache or {}).pop(seg.base_offset, None)
        if data is None:
            data = fs.read(seg.log_path, 0, seg.size)
        scan = scan_batches(data, max_batch_size=seg.max_batch_size)
        if len(data) != seg.size or scan.end != len(data) or not len(scan):
            raise CorruptRecordError(f"segment object is not {seg.size} bytes of whole batches", source=seg.source,
                                     position=scan.end)
        validate_batches(data, scan, source=seg.source)
        bases, lasts = scan.headers["base_offset"].astype(np.int64), scan.last_offsets
        if bases[0] < seg.base_offset or (prev_last is not None and bases[0] <= prev_last) \
                or int(lasts[-1]) - group[0].base_offset > INT32_MAX:
            raise CorruptRecordError(f"batch offsets {int(bases[0])}.. do not follow offset {prev_last} in a merge "
                                     f"into segment {group[0].base_offset}", source=seg.source, position=0)
        builder.add(scan.positions + pos, scan.sizes, lasts, scan.headers["max_timestamp"].astype(np.int64))
        parts.append(data)
        pos += len(data)
        prev_last = int(lasts[-1])
    off_rows, time_rows = builder.finish(group[0].base_offset)
    return b"".join(parts), off_rows, time_rows, prev_last + 1


def merge_small_segments(log, *, now_ms: int | None = None, min_age_ms: int = DEFAULT_MERGE_MIN_AGE_MS,
                         check: Callable[[], None] | None = None, lock_timeout: float | None = 30.0) -> MergeResult:
    """The merge pass over a reader's Log. On an object store the caller holds the maintenance lease
    (`check` re-checks it before each commit point) and pending swaps were completed first. On a
    filesystem with locks it is the cleaner's swap: `.cleaned` output, then Log.replace_segments under
    the partition lock, after checking the sources did not change (an opt-in there: appends already
    fill segments up to segment.bytes)."""
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    if not log.immutable:
        return _merge_local(log, lock_timeout)
    res = MergeResult(log.tp.topic, log.tp.partition, segments_before=len([s for s in log.segments if s.size]))
    names = _names(log.fs, log.dir)
    if any(n.endswith(SWAP_FILE_SUFFIX) for n in names):
        raise SwapAbortedError(f"{log.tp}: a swap is pending in {log.fs.url(log.dir)}; it is completed once "
                               f"abandoned (older than the maintenance lease TTL)")
    bound = settled_bound(log, now_ms=now, min_age_ms=min_age_ms)
    groups = merge_groups(log, bound, set(names))
    cache: dict[int, bytes] = {}
    if groups:
        bound = settle_hint(log, bound, cache)
        groups = merge_groups(log, bound, set(names))
    res.bound = bound
    for group in groups:
        data, off_rows, time_rows, nxt = build_merged(log, group, cache)
        publish_swap(log.fs, log.dir, group[0].base_offset, data, off_rows, time_rows, next_offset=nxt, check=check)
        replace_in_memory(log, group[0].base_offset, len(data), group, off_rows, time_rows)
        res.groups.append((group[0].base_offset, tuple(s.base_offset for s in group)))
        res.bytes_merged += len(data)
    res.segments_after = len([s for s in log.segments if s.size])
    return res


def _merge_local(log, lock_timeout: float | None) -> MergeResult:
    """Local disk: each group is appended batch run by batch run into `<base>.log.cleaned` and swapped in
    as the cleaner swaps (crash-safe by the loader's `.swap` completion)."""
    import contextlib

    from .cleaner import CleaningAbortedError
    from .log_loader import LOCK_FILE
    from .topic_partition import CLEANED_FILE_SUFFIX

    fs = log.fs
    res = MergeResult(log.tp.topic, log.tp.partition, segments_before=len(log.segments))
    res.bound = log.active_segment.base_offset
    for group in merge_groups(log, res.bound, set()):
        mtimes = {id(s): fs.modified_ms(s.log_path) for s in group}
        out = LogSegment.create(fs, log.dir, group[0].base_offset, file_suffix=CLEANED_FILE_SUFFIX,
                                **log.segment_kwargs())
        try:
            for seg in group:
                try:
                    for chunk in seg.iter_chunks(0):
                        validate_batches(chunk.buf, chunk.scan, source=chunk.source, base_position=chunk.base_position)
                        out.append(chunk.buf, chunk.scan)
                finally:
                    seg.release_readers()
            out.on_become_inactive()
            out.close()
            lock = contextlib.nullcontext() if log.writable else fs.lock(fs.join(log.dir, LOCK_FILE),
                                                                        timeout=lock_timeout)
            with lock:
                for seg in group:  # retention, a writer's recovery or a cleaner did not act on them meanwhile
                    try:
                        same = fs.size(seg.log_path) == seg.size and fs.modified_ms(seg.log_path) == mtimes[id(seg)]
                    except FileNotFoundError:
                        same = False
                    if not same:
                        raise CleaningAbortedError(f"{log.tp}: segment {fs.url(seg.log_path)} changed while being "
                                                   f"merged; giving up this round")
                log.replace_segments([out], group)
        except BaseException:
            if out.file_suffix == CLEANED_FILE_SUFFIX:
                out.delete()
            raise
        res.groups.append((group[0].base_offset, tuple(s.base_offset for s in group)))
        res.bytes_merged += out.size
    res.segments_after = len(log.segments)
    return res
