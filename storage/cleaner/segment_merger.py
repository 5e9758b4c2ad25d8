"""Segment merges: many small segments become fewer, each holding the same batches concatenated.

On an object store every append is its own segment object, so frequent commits leave many small
segments. The merge pass groups adjacent ones below the last object as Kafka's cleaner groups
segments (groupSegmentsBySize: segment.bytes, index bytes, int32 relative offsets) and replaces each
group with one segment holding the same bytes concatenated, indexes rebuilt, through the segment
swap (storage/segment_swap.py): create-only on object stores, `.cleaned` -> `.swap` renames on disk.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..common.constants import INT32_MAX
from ..common.time import SYSTEM_TIME
from ..errors import CleaningAbortedError, CorruptIndexError, CorruptRecordError
from ..log_loader import LOCK_FILE
from ..log_segment import LogSegment
from ..objects.immutable_segment import IndexBuilder
from ..records.record_batch import CONTROL_FLAG_MASK, scan_batches, validate_batches
from ..segment_swap import (
    SwapAbortedError,
    list_names,
    publish_swap,
    replace_in_memory,
    replace_segments,
    settle_hint,
    settled_bound,
)
from ..topic_partition import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    segment_file_name,
)
from ..transactions.transaction_index import ABORTED_TXN_DTYPE, TransactionIndex
from .cleaner import group_segments_by_size

log = logging.getLogger(__name__)

DEFAULT_MERGE_MIN_AGE_MS = 60_000  # a segment is merged only when created this long ago (see settled_bound)


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


# ---------------------------------------------------------------- the merge pass


def merge_groups(log, bound: int, names: set[str]) -> list[list[LogSegment]]:
    """Adjacent segments below `bound` grouped by Kafka's groupSegmentsBySize rules; groups of two or
    more. A segment whose `.log.deleted` twin still exists is not rewritten again (an in-flight reader
    may need the twin), so it breaks a run."""
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
            out += [
                g for g in group_segments_by_size(run, cfg.segment_bytes, cfg.segment_index_bytes, bound) if len(g) > 1
            ]
    return out


def build_merged(
    log, group: list[LogSegment], cache: dict | None = None, controls: set[int] | None = None
) -> tuple[bytes, np.ndarray, np.ndarray, int]:
    """(bytes, offset index rows, time index rows, next offset) of a group's segments concatenated.
    Every batch is validated (CRC, lengths, offsets inside its segment and increasing) first. The base
    offsets of the members holding a control batch are added to `controls`."""
    fs = log.fs
    parts, builder, pos, prev_last = [], IndexBuilder(log.config.index_interval_bytes), 0, None
    for seg in group:
        data = (cache or {}).pop(seg.base_offset, None)
        if data is None:
            data = fs.read(seg.log_path, 0, seg.size)
        scan = scan_batches(data, max_batch_size=seg.max_batch_size)
        if len(data) != seg.size or scan.end != len(data) or not len(scan):
            raise CorruptRecordError(
                f"segment object is not {seg.size} bytes of whole batches", source=seg.source, position=scan.end
            )
        validate_batches(data, scan, source=seg.source)
        if controls is not None and (scan.headers["attributes"] & CONTROL_FLAG_MASK).any():
            controls.add(seg.base_offset)
        bases, lasts = scan.headers["base_offset"].astype(np.int64), scan.last_offsets
        if (
            bases[0] < seg.base_offset
            or (prev_last is not None and bases[0] <= prev_last)
            or int(lasts[-1]) - group[0].base_offset > INT32_MAX
        ):
            raise CorruptRecordError(
                f"batch offsets {int(bases[0])}.. do not follow offset {prev_last} in a merge "
                f"into segment {group[0].base_offset}",
                source=seg.source,
                position=0,
            )
        builder.add(scan.positions + pos, scan.sizes, lasts, scan.headers["max_timestamp"].astype(np.int64))
        parts.append(data)
        pos += len(data)
        prev_last = int(lasts[-1])
    assert prev_last is not None  # every member holds a batch, or the loop raised
    off_rows, time_rows = builder.finish(group[0].base_offset)
    return b"".join(parts), off_rows, time_rows, prev_last + 1


def merged_aborted_txns(log, group: list[LogSegment], names: set[str], controls: set[int]) -> np.ndarray:
    """The `.txnindex` entries of a merge's output: its sources' entries, in order (ABORTED_TXN_DTYPE rows). A
    source's listed `.txnindex` object is read and checked; where it is missing though the segment holds a
    control batch, or fails its checks, the entries come from the log's transaction state (whose scan finds the
    ABORT markers), as a reader's do. A merge never turns a missing index into a present, incomplete one."""
    rows = []
    for seg in group:
        if segment_file_name(seg.base_offset, TXN_INDEX_FILE_SUFFIX) in names:
            index = TransactionIndex.for_segment(log.fs, log.dir, seg.base_offset)
            try:
                index.sanity_check()
                rows.append(index.entries())
                continue
            except CorruptIndexError:
                pass  # the transaction state distrusts it too, and takes the log's
        elif seg.base_offset not in controls:
            continue  # no marker: nothing aborted ends here
        rows.append(log.segment_aborted_txns(seg))
    return np.concatenate(rows, dtype=ABORTED_TXN_DTYPE) if rows else np.empty(0, ABORTED_TXN_DTYPE)


def merge_small_segments(
    log,
    *,
    now_ms: int | None = None,
    min_age_ms: int = DEFAULT_MERGE_MIN_AGE_MS,
    check: Callable[[], None] | None = None,
    lock_timeout: float | None = 30.0,
) -> MergeResult:
    """The merge pass over a reader's Log. On an object store the caller holds the maintenance lease
    (`check` re-checks it before each commit point) and pending swaps were completed first. On a
    filesystem with locks it is the cleaner's swap: `.cleaned` output, then Log.replace_segments under
    the partition lock, after checking the sources did not change (an opt-in there: appends already
    fill segments up to segment.bytes)."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else int(now_ms)
    if not log.immutable:
        return _merge_local(log, lock_timeout)
    res = MergeResult(log.tp.topic, log.tp.partition, segments_before=len([s for s in log.segments if s.size]))
    names = list_names(log.fs, log.dir)
    if any(n.endswith(SWAP_FILE_SUFFIX) for n in names):
        raise SwapAbortedError(
            f"{log.tp}: a swap is pending in {log.fs.url(log.dir)}; it is completed once "
            f"abandoned (older than the maintenance lease TTL)"
        )
    bound = settled_bound(log, now_ms=now, min_age_ms=min_age_ms)
    groups = merge_groups(log, bound, set(names))
    cache: dict[int, bytes] = {}
    if groups:
        bound = settle_hint(log, bound, cache)
        groups = merge_groups(log, bound, set(names))
    res.bound = bound
    for group in groups:
        controls: set[int] = set()
        data, off_rows, time_rows, nxt = build_merged(log, group, cache, controls)
        txn_rows = merged_aborted_txns(log, group, set(names), controls)
        publish_swap(
            log.fs,
            log.dir,
            group[0].base_offset,
            data,
            off_rows,
            time_rows,
            next_offset=nxt,
            txn_rows=txn_rows,
            check=check,
        )
        replace_in_memory(log, group[0].base_offset, len(data), group, off_rows, time_rows)
        res.groups.append((group[0].base_offset, tuple(s.base_offset for s in group)))
        res.bytes_merged += len(data)
    res.segments_after = len([s for s in log.segments if s.size])
    return res


def _merge_local(log, lock_timeout: float | None) -> MergeResult:
    """Local disk: each group is appended batch run by batch run into `<base>.log.cleaned` and swapped in
    as the cleaner swaps (crash-safe by the loader's `.swap` completion)."""
    fs = log.fs
    res = MergeResult(log.tp.topic, log.tp.partition, segments_before=len(log.segments))
    res.bound = log.active_segment.base_offset
    for group in merge_groups(log, res.bound, set()):
        mtimes = {id(s): fs.modified_ms(s.log_path) for s in group}
        out = LogSegment.create(
            fs, log.dir, group[0].base_offset, file_suffix=CLEANED_FILE_SUFFIX, **log.segment_kwargs()
        )
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
            lock = (
                contextlib.nullcontext() if log.writable else fs.lock(fs.join(log.dir, LOCK_FILE), timeout=lock_timeout)
            )
            with lock:
                for seg in group:  # retention, a writer's recovery or a cleaner did not act on them meanwhile
                    try:
                        same = fs.size(seg.log_path) == seg.size and fs.modified_ms(seg.log_path) == mtimes[id(seg)]
                    except FileNotFoundError:
                        same = False
                    if not same:
                        raise CleaningAbortedError(
                            f"{log.tp}: segment {fs.url(seg.log_path)} changed while being merged; giving up this round"
                        )
                replace_segments(log, [out], group)
        except BaseException:
            if out.file_suffix == CLEANED_FILE_SUFFIX:
                out.delete()
            raise
        res.groups.append((group[0].base_offset, tuple(s.base_offset for s in group)))
        res.bytes_merged += out.size
    res.segments_after = len(log.segments)
    return res
