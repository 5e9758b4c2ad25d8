"""The segment swap: how compaction and merge output replaces the segments it was made from.

Local disk (append, renames, a partition lock), as Kafka's replaceSegments: `<base>.log.cleaned`
(written by the cleaner or the merger) -> `.swap` -> the old files -> `.deleted` -> `.swap` stripped,
then the in-memory segment list. A crash leaves `.cleaned` files (the loader removes them) or `.swap`
files (the loader completes the swap: storage/log_loader.py). A cleaner writes its `.cleaned` files
holding the partition's `.cleaner.lock` (flock), so a writer's loader removes only those of a cleaner
that is gone; the swap refuses to start unless every output file is there, whole.

Object stores, with create-only writes instead of renames and a lock:

1. PUT `<base>.index.swap` and `<base>.timeindex.swap` (prepared, not yet meaningful), and
   `<base>.txnindex.swap` when the output has aborted transactions (else any stale one is deleted).
2. Create `<base>.log.swap` (If-None-Match): THE COMMIT POINT. From here the swap replaces every live
   segment with a base offset in [base, the swap's next offset); readers and writers' loaders see it
   so (LogLoader's swap view) without changing anything.
3. LIST: if another `.log.swap` is in the partition (a second maintenance job), delete ours and give up.
4. Complete (idempotent, any step may be repeated after a crash): copy the replaced objects to
   `.deleted` twins (in-flight readers go on from them; `<base>.log` only while it still holds the old
   bytes), delete the other replaced segments (`.log` objects first, then their indexes, `.txnindex`
   too), copy the `.swap` onto `<base>.log` and put its indexes (`<base>.txnindex` the output's, or
   none), then delete the `.swap` objects (`.log.swap` first).

A maintenance job completes a `.swap` it finds only once it is older than the lease TTL (an
abandoned one): younger ones belong to a job still running, which may still roll it back in step 3.
Segments are rewritten only below the "settled" offset (settled_bound), and the sink's writer-state
hint is made complete below it first (settle_hint), since the sink's replay check reads only each
segment's first batch header.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .errors import CorruptRecordError, KafkaStorageError, SwapAbortedError
from .file_records import check_headers, crc_failures
from .fs.filesystem import LogFileSystem
from .log_segment import LogSegment, segment_settings
from .objects.immutable_segment import rebuild_indexes
from .objects.object_producer_state import ObjectProducerStateManager
from .records.record_batch import MAGIC_OFFSET, RECORD_BATCH_OVERHEAD, RecordBatchHeader
from .topic_partition import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TXN_INDEX_FILE_SUFFIX,
    parse_segment_file,
    segment_file_name,
)

logger = logging.getLogger(__name__)

CACHE_SEGMENT_BYTES = 1 << 20  # settle_hint reads segments up to this size whole, for the merge to reuse
CACHE_BYTES = 64 << 20  # ... up to this much in all
SEGMENT_SUFFIXES = (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX)
INDEX_SWAP_SUFFIXES = (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, TXN_INDEX_FILE_SUFFIX)  # a swap's prepared objects


CLEANER_LOCK_FILE = ".cleaner.lock"  # held while a cleaner writes `.cleaned` output in the partition dir


def cleaner_output_lock(fs: LogFileSystem, dir: str, *, timeout: float | None):
    """The lock a cleaner holds while its `.cleaned` output exists (nothing on stores without locks)."""
    if not fs.capabilities.locks:
        return contextlib.nullcontext()
    return fs.lock(fs.join(dir, CLEANER_LOCK_FILE), timeout=timeout)


# ---------------------------------------------------------------- local disk


def replace_segments(log, new_segments: list[LogSegment], old_segments: list[LogSegment]) -> None:
    """Swap compaction output (segments whose files end in `.cleaned`) in for the segments it
    replaces, as Kafka's replaceSegments does: `.cleaned` -> `.swap`, old files -> `.deleted`
    (touched: file.delete.delay.ms counts from now), `.swap` -> live names, then the in-memory list.
    The caller holds the partition lock. A crash between steps leaves `.swap` files, which the
    loader completes (it removes the live segments the swap covers), or only `.cleaned` files,
    which it removes. The active segment is never replaced."""
    old_ids = {id(s) for s in old_segments}
    live_segments = log.segments
    if id(log.active_segment) in old_ids:
        raise KafkaStorageError(f"{log.tp.topic}-{log.tp.partition}: the active segment cannot be replaced")
    if any(not any(s is live for live in live_segments) for s in old_segments):
        raise KafkaStorageError(f"{log.tp.topic}-{log.tp.partition}: a replaced segment is not in the log")
    fresh = sorted(new_segments, key=lambda s: s.base_offset)
    for seg in fresh:  # the output must be there whole: a swap of missing files would drop the sources' data
        for path in seg.files():
            if path != seg.txn_index_path and not log.fs.exists(path):  # (no .txnindex: nothing aborted)
                raise SwapAbortedError(
                    f"{log.tp.topic}-{log.tp.partition}: compaction output {log.fs.url(path)} "
                    f"is gone; nothing was replaced"
                )
        if log.fs.size(seg.log_path) != seg.size:
            raise SwapAbortedError(
                f"{log.tp.topic}-{log.tp.partition}: compaction output {seg.source} holds "
                f"{log.fs.size(seg.log_path)} bytes, not the {seg.size} written; nothing was replaced"
            )
    for seg in fresh:
        seg.change_file_suffixes(CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    if log.fs.capabilities.fsync:
        log.fs.sync_dir(log.dir)
    for seg in old_segments:
        seg.change_file_suffixes("", DELETED_FILE_SUFFIX)
        for path in seg.files():
            if log.fs.exists(path):
                log.fs.touch(path)
    for seg in fresh:
        seg.change_file_suffixes(SWAP_FILE_SUFFIX, "")
    if log.fs.capabilities.fsync:
        log.fs.sync_dir(log.dir)
    log.swap_in_memory(fresh, old_segments)


def check_swap(seg: LogSegment) -> int:
    """The last offset of a `.swap` (or any finished) segment once all of it is checked: whole batches to
    its end, CRCs, and headers with offsets increasing inside [base offset, base offset + 2^31). Raises
    CorruptRecordError naming the file and position. A swap is a hint like any leftover: it replaces
    nothing until this holds."""
    last = None
    try:
        for chunk in seg.iter_chunks(0, tail_ok=False):
            last = check_headers(chunk, prev_last=last, base_offset=seg.base_offset)
            bad = crc_failures(chunk.buf, chunk.scan)
            if bad.size:
                h = chunk.scan.header(int(bad[0]), chunk.base_position)
                raise CorruptRecordError(
                    f"CRC mismatch in batch {h.base_offset}..{h.last_offset}", source=seg.source, position=h.position
                )
    finally:
        seg.release_readers()
    if last is None:
        raise CorruptRecordError("the swap segment holds no batch", source=seg.source, position=0)
    return last


@dataclass
class LocalSwapPlan:
    """What the `.swap` files of a partition directory mean (see plan_local_swaps)."""

    installs: list = field(default_factory=list)  # (swap base, its last offset, live bases it replaces)
    damaged: list = field(default_factory=list)  # (swap base, the error): set aside, never installed
    restores: list = field(default_factory=list)  # bases of `.deleted` originals a damaged swap had moved

    def replaced(self) -> set[int]:
        return {b for _, _, covered in self.installs for b in covered}


def plan_local_swaps(fs: LogFileSystem, dir: str, files, segment_kwargs: dict) -> LocalSwapPlan:
    """Check every `<base>.log.swap` of a directory (check_swap) and decide what it replaces: exactly the
    live segments that begin inside its own [base, last offset], never a later one. A damaged swap
    replaces nothing; the originals it had already renamed to `.deleted` (a crash in the middle of the
    swap) are brought back, when they hold whole batches that overlap no live segment."""
    names = {f.name: f.size for f in files if not f.is_dir}
    live: dict[int, int] = {}
    swaps, deleted = [], []
    for name, size in names.items():
        p = parse_segment_file(name)
        if p is None or p.suffix != LOG_FILE_SUFFIX:
            continue
        if not p.extra:
            live[p.base_offset] = size
        elif p.extra == SWAP_FILE_SUFFIX:
            swaps.append(p.base_offset)
        elif p.extra == DELETED_FILE_SUFFIX:
            deleted.append(p.base_offset)
    plan = LocalSwapPlan()
    ranges: dict[int, tuple[int, int]] = {}  # base -> (base, last) of live segments, read on demand

    def live_range(b: int) -> tuple[int, int]:
        if b not in ranges:
            seg = LogSegment(fs, dir, b, log_size=live[b], **segment_kwargs)
            try:
                nxt, err = seg.scan_tail()
            finally:
                seg.release_readers()
            if err is not None:
                raise err
            ranges[b] = (b, nxt - 1)
        return ranges[b]

    for b in sorted(swaps):
        seg = LogSegment(
            fs,
            dir,
            b,
            file_suffix=SWAP_FILE_SUFFIX,
            log_size=names[segment_file_name(b, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX)],
            index_size=0,
            time_index_size=0,
            **segment_kwargs,
        )
        try:
            last = check_swap(seg)
            # a cleaned group may end before the last offset of its last source (its tail was compacted
            # away): the sources are the live segments that begin inside the swap's range
            plan.installs.append((b, last, sorted(x for x in live if b <= x <= last)))
        except CorruptRecordError as e:
            plan.damaged.append((b, e))
    if plan.damaged:
        taken = [live_range(x) for x in live if x not in plan.replaced()]
        taken += [(b, last) for b, last, _ in plan.installs]
        first_damaged = min(b for b, _ in plan.damaged)
        for b in sorted(deleted):
            if b < first_damaged or b in live:
                continue
            seg = LogSegment(
                fs,
                dir,
                b,
                file_suffix=DELETED_FILE_SUFFIX,
                index_size=0,
                time_index_size=0,
                log_size=names[segment_file_name(b, LOG_FILE_SUFFIX, DELETED_FILE_SUFFIX)],
                **segment_kwargs,
            )
            try:
                last = check_swap(seg)
            except CorruptRecordError:
                continue  # not a whole segment: not one to bring back
            if any(lo <= last and b <= hi for lo, hi in taken):
                continue  # overlaps what is live: a leftover of an earlier, completed swap
            taken.append((b, last))
            plan.restores.append(b)
    return plan


# ---------------------------------------------------------------- object stores


def copy_if_present(fs: LogFileSystem, src: str, dst: str) -> bool:
    """Copy src to dst (server-side on object stores); False when src is gone."""
    try:
        fs.copy(src, dst)
        return True
    except FileNotFoundError:
        return False


def list_names(fs: LogFileSystem, dir: str) -> dict[str, int]:
    """{name: size} of the files in a partition directory, from a fresh listing."""
    fs.invalidate_listings(dir)
    return {f.name: f.size for f in fs.listdir(dir) if not f.is_dir}


def settled_bound(log, *, now_ms: int, min_age_ms: int) -> int:
    """The offset below which segments may be rewritten: never the last segment object (the log end is
    read from it), and not the trailing segments created less than min_age_ms ago (a sink commit writes
    its writer-state hint right after its segment; min_age_ms must exceed that gap, see settle_hint)."""
    objs = [s for s in log.segments if s.size]
    if not objs:
        return log.log_start_offset
    bound = objs[-1].base_offset
    if min_age_ms > 0 and len(objs) > 1:
        mt = log.fs.modified_times(log.dir, [log.fs.basename(s.log_path) for s in objs[:-1]])
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
    return min(bound, mgr.as_of)  # never past an open transaction (the hint's asOf stops at it)


def swap_path(fs: LogFileSystem, dir: str, base: int, suffix: str = LOG_FILE_SUFFIX) -> str:
    return fs.join(dir, segment_file_name(base, suffix, SWAP_FILE_SUFFIX))


def live_path(fs: LogFileSystem, dir: str, base: int, suffix: str = LOG_FILE_SUFFIX) -> str:
    return fs.join(dir, segment_file_name(base, suffix))


def publish_swap(
    fs: LogFileSystem,
    dir: str,
    base: int,
    log_bytes,
    off_rows: np.ndarray,
    time_rows: np.ndarray,
    *,
    next_offset: int,
    txn_rows: np.ndarray | None = None,
    check: Callable[[], None] | None = None,
) -> None:
    """Make a finished output segment replace the live segments in [base, next_offset) (steps 1-4 of the
    module docstring); `txn_rows`: its `.txnindex` entries (ABORTED_TXN_DTYPE rows; None or empty: none).
    Raises SwapAbortedError, with nothing changed, if it cannot be committed."""
    if check is not None:
        check()  # the maintenance lease, right before the commit point
    fs.write_atomic(swap_path(fs, dir, base, INDEX_FILE_SUFFIX), off_rows.tobytes(), durable=False)
    fs.write_atomic(swap_path(fs, dir, base, TIME_INDEX_FILE_SUFFIX), time_rows.tobytes(), durable=False)
    txn_swap = swap_path(fs, dir, base, TXN_INDEX_FILE_SUFFIX)
    if txn_rows is not None and len(txn_rows):
        fs.write_atomic(txn_swap, txn_rows.tobytes(), durable=False)
    else:  # an earlier job's, left by a crash before its commit point: it must not be taken for this output's
        fs.delete_many([txn_swap])
    log_swap = swap_path(fs, dir, base)
    if not fs.create_exclusive(log_swap, log_bytes):
        raise SwapAbortedError(
            f"{fs.url(log_swap)} exists already: another maintenance job is swapping segments "
            f"of this partition; giving up this group"
        )
    others = [
        n for n in list_names(fs, dir) if n.endswith(LOG_FILE_SUFFIX + SWAP_FILE_SUFFIX) and n != fs.basename(log_swap)
    ]
    if others:  # another job's swap: nobody completes a young swap but its creator, so ours can go back
        fs.delete_many([log_swap])
        fs.delete_many([swap_path(fs, dir, base, s) for s in INDEX_SWAP_SUFFIXES])
        raise SwapAbortedError(
            f"{fs.url(fs.join(dir, others[0]))} appeared while swapping segments at offset "
            f"{base}: another maintenance job works on this partition; rolled back ours"
        )
    complete_swap(fs, dir, base, next_offset=next_offset, off_rows=off_rows, time_rows=time_rows, fresh=True)


def object_swap_last_offset(fs: LogFileSystem, dir: str, base: int, size: int, config) -> int:
    """The last offset of an object store's `<base>.log.swap`, once the whole object is checked
    (check_swap); raises CorruptRecordError for a damaged one, FileNotFoundError if it is gone."""
    seg = LogSegment(
        fs,
        dir,
        base,
        file_suffix=SWAP_FILE_SUFFIX,
        log_size=size,
        index_size=0,
        time_index_size=0,
        **segment_settings(config),
    )
    return check_swap(seg)


def set_aside_object_swap(fs: LogFileSystem, dir: str, base: int, error: Exception) -> None:
    """A damaged object swap replaces nothing: its `.log.swap` is copied to `.log.swap.damaged` and the
    swap objects are deleted; the segments it would have replaced are left as they are."""
    log_swap = swap_path(fs, dir, base)
    logger.warning(
        "%s: set aside as %s.damaged; the segments it would have replaced stay: %s",
        fs.url(log_swap),
        fs.basename(log_swap),
        error,
    )
    copy_if_present(fs, log_swap, log_swap + ".damaged")
    fs.delete_many([log_swap] + [swap_path(fs, dir, base, s) for s in INDEX_SWAP_SUFFIXES])


def complete_swap(
    fs: LogFileSystem,
    dir: str,
    base: int,
    *,
    next_offset: int | None = None,
    config=None,
    off_rows: np.ndarray | None = None,
    time_rows: np.ndarray | None = None,
    fresh: bool = False,
) -> bool:
    """Finish the swap committed by `<base>.log.swap` (step 4); every step may be repeated. `fresh`: the
    caller just committed it, so `<base>.log` still holds the old bytes. False if the swap is gone."""
    names = list_names(fs, dir)
    swap_name = segment_file_name(base, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX)
    if swap_name not in names:
        return False
    if next_offset is None:
        try:
            next_offset = object_swap_last_offset(fs, dir, base, names[swap_name], config) + 1
        except FileNotFoundError:
            return False  # completed by another job since the listing
        except CorruptRecordError as e:
            twins = [
                p
                for p in map(parse_segment_file, names)
                if p is not None
                and p.extra == DELETED_FILE_SUFFIX
                and p.suffix == LOG_FILE_SUFFIX
                and p.base_offset >= base
            ]
            if twins:  # sources are never merged again while they have twins: these are this swap's
                raise CorruptRecordError(
                    f"{e}; its completion had begun (segments from offset {base} on have "
                    f".deleted copies): nothing more is changed; restore from the .deleted "
                    f"copies by hand"
                ) from None
            set_aside_object_swap(fs, dir, base, e)
            return False
    log_swap, head = fs.join(dir, swap_name), live_path(fs, dir, base)
    swapped = False if fresh else (segment_file_name(base, LOG_FILE_SUFFIX) in names and fs.same_object(head, log_swap))
    doomed: dict[str, list[str]] = {s: [] for s in SEGMENT_SUFFIXES}
    for name in sorted(names):
        p = parse_segment_file(name)
        if p is None or p.extra or p.suffix not in SEGMENT_SUFFIXES or not base <= p.base_offset < next_offset:
            continue
        if p.base_offset == base and swapped:
            continue  # its old bytes were kept as .deleted before the .log was replaced
        copy_if_present(fs, fs.join(dir, name), fs.join(dir, name + DELETED_FILE_SUFFIX))
        if p.base_offset != base:
            doomed[p.suffix].append(fs.join(dir, name))
    fs.delete_many(doomed[LOG_FILE_SUFFIX])  # .log objects first: a listing never shows an index without one
    fs.delete_many(doomed[INDEX_FILE_SUFFIX] + doomed[TIME_INDEX_FILE_SUFFIX] + doomed[TXN_INDEX_FILE_SUFFIX])
    if not swapped and not copy_if_present(fs, log_swap, head):
        return False  # completed (and its .swap deleted) by another job meanwhile
    if off_rows is None or time_rows is None:
        off_rows, time_rows = _swap_indexes(fs, dir, base, config)
    fs.write_atomic(live_path(fs, dir, base, INDEX_FILE_SUFFIX), off_rows.tobytes(), durable=False)
    fs.write_atomic(live_path(fs, dir, base, TIME_INDEX_FILE_SUFFIX), time_rows.tobytes(), durable=False)
    # the output's aborted transactions, written before the commit point (its own: publish_swap deletes a stale
    # one first), or none: then the head's old `.txnindex` goes (its twin keeps it for readers in flight)
    txn_swap, txn_head = (
        swap_path(fs, dir, base, TXN_INDEX_FILE_SUFFIX),
        live_path(fs, dir, base, TXN_INDEX_FILE_SUFFIX),
    )
    has_txns = fs.basename(txn_swap) in names and copy_if_present(fs, txn_swap, txn_head)
    if not has_txns and fs.basename(txn_head) in names:
        fs.delete_many([txn_head])
    fs.delete_many([log_swap])
    fs.delete_many([swap_path(fs, dir, base, s) for s in INDEX_SWAP_SUFFIXES])
    return True


def _swap_indexes(fs: LogFileSystem, dir: str, base: int, config) -> tuple[np.ndarray, np.ndarray]:
    """The indexes of a completed swap's `<base>.log`, rebuilt from its bytes (a crashed swap's index
    objects are not trusted: they may be another attempt's)."""
    seg = LogSegment(fs, dir, base, index_size=0, time_index_size=0, **segment_settings(config))
    seg.mark_needs_rebuild()
    rebuild_indexes(seg, write=False)
    return seg.offset_index.entry_array(0).copy(), seg.time_index.entry_array(0).copy()


def complete_pending_swaps(fs: LogFileSystem, dir: str, config, *, now_ms: int, abandoned_after_ms: int) -> list[int]:
    """Complete the `.swap`s of a partition older than abandoned_after_ms (their job is gone), and remove
    prepared index swaps left without a `.log.swap` as old. Returns the completed base offsets."""
    names = list_names(fs, dir)
    swaps = [p for p in (parse_segment_file(n) for n in names) if p is not None and p.extra == SWAP_FILE_SUFFIX]
    if not swaps:
        return []
    mt = fs.modified_times(dir, [n for n in names if n.endswith(SWAP_FILE_SUFFIX)])
    old = {n for n, t in mt.items() if now_ms - t >= abandoned_after_ms}
    done = []
    log_swaps = sorted(p.base_offset for p in swaps if p.suffix == LOG_FILE_SUFFIX)
    for base in log_swaps:
        if segment_file_name(base, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX) in old:
            if complete_swap(fs, dir, base, config=config):
                done.append(base)
    stray = [
        fs.join(dir, segment_file_name(p.base_offset, p.suffix, SWAP_FILE_SUFFIX))
        for p in swaps
        if p.suffix != LOG_FILE_SUFFIX
        and p.base_offset not in log_swaps
        and segment_file_name(p.base_offset, p.suffix, SWAP_FILE_SUFFIX) in old
    ]
    fs.delete_many(stray)
    return done


def replace_in_memory(log, base: int, size: int, old_segments: list[LogSegment], off_rows=None, time_rows=None) -> None:
    """After an object swap: put the new segment in place of the old ones in a Log's segment list."""
    seg = LogSegment(log.fs, log.dir, base, log_size=size, index_size=0, time_index_size=0, **log.segment_kwargs())
    if off_rows is not None:
        seg.install_indexes(off_rows, time_rows)
    for s in old_segments:
        s.release_readers()
    log.swap_in_memory([seg], old_segments)
