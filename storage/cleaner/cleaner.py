"""Cleaner: compact one log by key, as Kafka's LogCleaner does (cleanup.policy=compact).

Pass 1 counts the keys of the dirty range [first dirty, first uncleanable) (HyperLogLog) to size
one SkimpyOffsetMap table, then maps key -> latest offset over the range into it; if the keys do
not all fit, only the prefix of batches that fit is mapped and the rest stays dirty. Pass 2
rewrites every segment from the log's first up to the mapped end, in groups of adjacent segments
that fit segment.bytes and the index limits, keeping a record iff no newer offset is mapped for its
key. Tombstones keep a delete horizon (KIP-534): the first cleaning that
keeps one stamps its batch (attributes bit 6, baseTimestamp = now + delete.retention.ms); a later
cleaning past the horizon drops it. Records without a key are kept (Kafka rejects them on compacted
topics at produce time and its cleaner discards them; this engine accepts them, so it keeps them).

A kept batch keeps its baseOffset, lastOffsetDelta, producer fields and codec; records are filtered
at byte level (their offsetDelta stays valid) and recompressed with compression.py. Each group's
output is written as `<base>.log.cleaned` and swapped in under the partition lock (segment_swap.py)
after checking that the segments it replaces are unchanged. Transactions follow Kafka's rules
(transaction_metadata.py): both passes walk the aborted transactions of the segments' `.txnindex`
files; aborted batches are not mapped and are removed, committed transactional records compact like
any other, and a COMMIT/ABORT marker stays whole while its transaction has a batch in the log, then
gets a delete horizon as a tombstone does and goes past it. Each output's `.txnindex` holds the
aborts whose ABORT marker it keeps for their data.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from dataclasses import dataclass, field

import numpy as np

from ..common.constants import INT32_MAX, INT64_MAX
from ..common.time import SYSTEM_TIME, Time
from ..errors import CleaningAbortedError, KafkaStorageError, LogLockedError
from ..fs.local import LocalFileSystem
from ..index import OffsetIndex, TimeIndex
from ..index_planner import plan_index_entries
from ..log import Log
from ..log_loader import LOCK_FILE
from ..log_segment import LogSegment
from ..records import record_batch as rb
from ..records.record_batch import as_uint8, scan_batches, validate_batches
from ..segment_swap import cleaner_output_lock, publish_swap, replace_in_memory, replace_segments
from ..topic_partition import CLEANED_FILE_SUFFIX, SWAP_FILE_SUFFIX, parse_segment_file
from ..transactions.transaction_index import ABORTED_TXN_DTYPE, ABORTED_TXN_VERSION, TransactionIndex
from . import _cleaner_kernels as K
from .clean_progress import NO_METER, CleanProgress, Meter
from .cleaner_batches import (
    bounded_chunks,
    control_types,
    empty_batch,
    framing_error,
    record_areas,
    rewritten_batches,
)
from .cleaner_config import CleanerConfig
from .offset_map import (
    MAX_RELATIVE_OFFSET,
    KeyCounter,
    SkimpyOffsetMap,
)
from .throttler import Throttler
from .transaction_metadata import CleanedTransactionMetadata

logger = logging.getLogger(__name__)


@dataclass
class CleanResult:
    """What one cleaning of one partition did (error set, and nothing else trusted, if it failed)."""

    topic: str
    partition: int
    first_dirty_offset: int
    first_uncleanable_offset: int
    end_offset: int = -1  # the next first dirty offset (cleaner-offset-checkpoint), -1 if not cleaned
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    keys: int = 0  # distinct keys in the offset map
    records_read: int = 0  # by pass 2
    records_dropped: int = 0  # data records; markers are markers_dropped
    tombstones_dropped: int = 0
    aborted_dropped: int = 0  # records of aborted transactions removed (counted in records_dropped too)
    markers_dropped: int = 0  # transaction markers removed past their delete horizon
    keyless_kept: int = 0
    bytes_read: int = 0  # by all passes (key count, map, filter)
    bytes_written: int = 0
    map_bytes: int = 0  # the offset map's table
    map_peak_bytes: int = 0  # the most the map (and its key counter) held at once
    map_full: bool = False  # the dirty range had more keys than fit: only a prefix was cleaned
    groups: list = field(default_factory=list)  # (new base offset, replaced base offsets) per swap
    duration_s: float = 0.0
    error: str | None = None
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class _SourceStats:
    seg: LogSegment
    emitted: int = 0  # batches written to the output
    verbatim: bool = True  # every batch kept unchanged
    last_header: np.ndarray | None = None  # the source's last batch header (HEADER_DTYPE, 1 row)
    records_read: int = 0
    records_dropped: int = 0
    tombstones_dropped: int = 0
    aborted_dropped: int = 0
    markers_dropped: int = 0
    keyless_kept: int = 0
    bytes_written: int = 0


@contextlib.contextmanager
def _scratch_dir(log: Log):
    """(filesystem, dir) for outputs when the log's store cannot append (None elsewhere)."""
    if not log.immutable:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="kafkalog-clean-") as tmp:
        yield LocalFileSystem(), tmp


def group_segments_by_size(
    segments: list[LogSegment], max_size: int, max_index_size: int, first_uncleanable_offset: int
) -> list[list[LogSegment]]:
    """Kafka's groupSegmentsBySize: runs of adjacent segments whose total log, offset index and time
    index bytes fit the limits and whose offsets fit an int32 relative to the run's base offset."""
    groups = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size = segments[i].size
        idx = segments[i].offset_index.entries * segments[i].offset_index.entry_size
        tidx = segments[i].time_index.entries * segments[i].time_index.entry_size
        i += 1
        while i < len(segments):
            s = segments[i]
            last = segments[i + 1].base_offset - 1 if i + 1 < len(segments) else first_uncleanable_offset - 1
            s_idx = s.offset_index.entries * s.offset_index.entry_size
            s_tidx = s.time_index.entries * s.time_index.entry_size
            if not (
                size + s.size <= max_size
                and idx + s_idx <= max_index_size
                and tidx + s_tidx <= max_index_size
                and (s.size == 0 or last - group[0].base_offset <= INT32_MAX)
            ):
                break
            group.append(s)
            size, idx, tidx = size + s.size, idx + s_idx, tidx + s_tidx
            i += 1
        groups.append(group)
    return groups


@dataclass
class _Round:
    """One cleaning of one log: what both passes and the swaps share."""

    log: Log
    omap: SkimpyOffsetMap
    end: int  # records at or past it are kept: the map does not cover them
    now: int
    horizon: int  # delete horizon stamped on batches that keep a tombstone and have none
    res: CleanResult
    mtimes: dict  # id(segment) -> .log mtime when the cleaning began
    txn: CleanedTransactionMetadata  # the transactions pass 2 walks through, across all groups


class Cleaner:
    """Cleans one log at a time (LogCleanerManager picks which, and keeps the checkpoint)."""

    def __init__(
        self, config: CleanerConfig | None = None, *, throttler: Throttler | None = None, time: Time = SYSTEM_TIME
    ):
        self.config = config or CleanerConfig()
        self.time = time  # now (the delete horizon) when clean() is given no now_ms, and the duration
        self.throttler = throttler or Throttler(self.config.io_max_bytes_per_second)
        self.check = None  # immutable segments: re-checks the maintenance lease before each swap's commit point
        self._scratch = None  # immutable segments: a local temp dir for the outputs being written
        self._meter = NO_METER  # the cleaning under way's progress

    def clean(
        self,
        log: Log,
        first_dirty_offset: int,
        first_uncleanable_offset: int,
        *,
        now_ms: int | None = None,
        progress: CleanProgress | None = None,
    ) -> CleanResult:
        """Compact [log start, mapped end) of `log` (a reader's Log is fine: the partition lock is taken
        around each swap; a writable Log already holds it). Raises on failure; earlier groups may have
        been swapped in by then, which leaves a valid log. `progress(done, total)` is called as the passes
        read, chunk by chunk (Meter), ending at (total, total) when the cleaning succeeds."""
        try:
            return self._clean(log, first_dirty_offset, first_uncleanable_offset, now_ms, progress)
        finally:
            self._meter = NO_METER

    def _clean(self, log: Log, first_dirty_offset: int, first_uncleanable_offset: int, now_ms, progress) -> CleanResult:
        t0 = self.time.nanoseconds()
        now = self.time.milliseconds() if now_ms is None else int(now_ms)
        res = CleanResult(
            log.tp.topic,
            log.tp.partition,
            first_dirty_offset,
            first_uncleanable_offset,
            segments_before=len(log.segments),
            bytes_before=log.size,
        )
        self._check_no_swap(log)
        candidates = [
            s for s in log.segments if s.base_offset < first_uncleanable_offset and s is not log.active_segment
        ]
        try:
            mtimes = {id(s): log.fs.modified_ms(s.log_path) for s in candidates}
        except FileNotFoundError as e:  # retention or another job moved a segment since the log was opened
            raise CleaningAbortedError(
                f"{log.tp}: a segment changed while the cleaning began ({e}); giving up this round"
            ) from None
        if progress is not None:  # (pass 1's loops read these, and stop at the active segment)
            dirty = log.segments_in_range(first_dirty_offset, first_uncleanable_offset)
            dirty_bytes = sum(s.size for s in dirty if s is not log.active_segment)
            self._meter = Meter(progress, dirty_bytes, sum(s.size for s in candidates))
        omap = SkimpyOffsetMap(
            self.config.dedupe_buffer_size, self.config.io_buffer_load_factor, base_offset=first_dirty_offset
        )
        end, res.map_full = self._build_offset_map(log, omap, first_dirty_offset, first_uncleanable_offset, res)
        res.keys, res.map_bytes, res.map_peak_bytes = omap.size, omap.memory_bytes, omap.peak_bytes
        sources = [s for s in candidates if s.base_offset < end]
        after = [s.base_offset for s in log.segments if sources and s.base_offset > sources[-1].base_offset]
        txn = CleanedTransactionMetadata.for_range(
            log, sources[0].base_offset if sources else end, after[0] if after else log.log_end_offset
        )
        horizon = min(INT64_MAX, now + log.config.delete_retention_ms)
        rnd = _Round(log, omap, end, now, horizon, res, mtimes, txn)
        self._meter.begin(Meter.REWRITE, sum(s.size for s in sources))
        with self._output_lock(log), _scratch_dir(log) as self._scratch:
            for group in group_segments_by_size(
                sources, log.config.segment_bytes, log.config.segment_index_bytes, first_uncleanable_offset
            ):
                self._clean_group(rnd, group)
        res.end_offset = end
        self._meter.end()
        res.segments_after, res.bytes_after = len(log.segments), log.size
        res.duration_s = (self.time.nanoseconds() - t0) / 1e9
        return res

    # ------------------------------------------------------------------ pass 1
    def _build_offset_map(self, log: Log, omap: SkimpyOffsetMap, start: int, end: int, res: CleanResult):
        """Map the dirty range; returns (end of the mapped range, whether the map filled up first).
        The map's one table is sized from a HyperLogLog count of the range's keys first."""
        limit = start + MAX_RELATIVE_OFFSET
        self._meter.begin(Meter.KEYS)
        omap.reserve(self._estimate_keys(log, omap, start, end, res))
        self._meter.begin(Meter.MAP)
        txn = CleanedTransactionMetadata.for_range(log, start, end)
        for seg in log.segments_in_range(start, end):
            if seg is log.active_segment:
                break
            try:
                full = self._map_segment(log, seg, omap, start, end, limit, res, txn)
            finally:
                seg.release_readers()  # a log of many segments must not hold them all open
            if full:
                return omap.latest_offset + 1, True
        return end, False

    def _estimate_keys(self, log: Log, omap: SkimpyOffsetMap, start: int, end: int, res: CleanResult) -> int:
        """Distinct keys pass 1 would map (HyperLogLog: one more read and hash of the range); stops
        early once they pass what the dedupe buffer holds. Only sizes the map: a low count is safe."""
        counter = KeyCounter()
        omap.note_peak(counter.memory_bytes)
        limit = start + MAX_RELATIVE_OFFSET
        txn = CleanedTransactionMetadata.for_range(log, start, end)
        for seg in log.segments_in_range(start, end):
            if seg is log.active_segment:
                break
            try:
                for chunk, idx, fits, mappable in self._dirty_chunks(log, seg, start, end, limit, res, txn):
                    if fits.size:
                        h = chunk.scan.headers
                        src, a0, a1 = record_areas(chunk, fits, log.max_batch_size)
                        _, err, _, eb = K.hll_batches(
                            src,
                            a0,
                            a1,
                            h["record_count"][fits].astype(np.int64),
                            h["last_offset_delta"][fits].astype(np.int64),
                            h["base_offset"][fits].astype(np.int64),
                            mappable,
                            np.int64(start),
                            counter.registers,
                        )
                        if err:
                            raise framing_error(chunk, int(fits[eb]), err)
                    if fits.size < idx.size or counter.estimate() > omap.capacity:
                        return counter.estimate()
            finally:
                seg.release_readers()
        return counter.estimate()

    def _dirty_chunks(self, log, seg, start, end, limit, res, txn: CleanedTransactionMetadata):
        """(chunk, idx, fits, mappable) of a segment's validated chunks from `start`: idx its batches
        in [start, end), fits those whose offsets fit the map (below limit), mappable: fits' data
        batches outside aborted transactions (Kafka maps committed transactional data; `txn` is fed fits)."""
        found = seg.translate_offset(start) if seg.base_offset < start else (None, 0)
        if found is None:
            return
        for chunk in bounded_chunks(seg.iter_chunks(found[1]), log.max_batch_size):
            self._validate(chunk, res)
            scan = chunk.scan
            bases = scan.headers["base_offset"].astype(np.int64)
            lasts = scan.last_offsets
            idx = np.flatnonzero((lasts >= start) & (bases < end))
            fits = idx[lasts[idx] < limit]
            control = (scan.headers["attributes"][fits].astype(np.int64) & rb.CONTROL_FLAG_MASK) != 0
            aborted, _ = txn.read_batches(scan.headers, fits, control_types(chunk, fits[control], log.max_batch_size))
            yield chunk, idx, fits, ~control & ~aborted
            if len(bases) and bases[-1] >= end:
                break

    def _map_segment(self, log, seg, omap, start, end, limit, res, txn) -> bool:
        for chunk, idx, fits, mappable in self._dirty_chunks(log, seg, start, end, limit, res, txn):
            scan = chunk.scan
            bases = scan.headers["base_offset"].astype(np.int64)
            lasts = scan.last_offsets
            if fits.size:
                src, a0, a1 = record_areas(chunk, fits, log.max_batch_size)
                done, _, err, _, eb = omap.put_batches(
                    src,
                    a0,
                    a1,
                    scan.headers["record_count"][fits].astype(np.int64),
                    scan.headers["last_offset_delta"][fits].astype(np.int64),
                    bases[fits],
                    mappable,
                    start,
                )
                if done:
                    omap.update_latest_offset(int(lasts[fits[done - 1]]))
                if err and err != K.NEED_ROOM:
                    raise framing_error(chunk, int(fits[eb]), err)
                if err:
                    fits = fits[:done]
            if fits.size < idx.size:  # out of room (keys) or of offsets relative to the map's base
                if omap.latest_offset < start:
                    raise KafkaStorageError(
                        f"{log.tp}: log.cleaner.dedupe.buffer.size ({self.config.dedupe_buffer_size} bytes, "
                        f"{omap.capacity} keys) cannot hold the keys of the batch at offset "
                        f"{int(bases[idx[fits.size]])}; raise it to clean this log"
                    )
                return True
        return False

    # ------------------------------------------------------------------ pass 2
    def _clean_group(self, rnd: _Round, group: list[LogSegment]) -> None:
        """Clean a group into one output segment; if the output would pass a limit (re-framed records
        can grow), cut it before the source that overflows and start another output there."""
        out: LogSegment | None = None
        members: list[_SourceStats] = []
        try:
            for seg in group:
                if out is None:
                    out, members = self._new_output(rnd.log, seg.base_offset), []
                before, read = rnd.txn.snapshot(), self._meter.read
                st = self._clean_source(rnd, seg, out, may_overflow=not members)
                if st is None:
                    rnd.txn.restore(before)  # the source is read again, into the next output
                    self._meter.rewind(read)
                    out.truncate_to(seg.base_offset)
                    self._finish(rnd, out, members)
                    out, members = self._new_output(rnd.log, seg.base_offset), []
                    st = self._clean_source(rnd, seg, out, may_overflow=True)
                    assert st is not None  # a fresh output takes any one source (may_overflow)
                members.append(st)
            if out is not None:
                self._finish(rnd, out, members)
        except BaseException:
            if out is not None and out.file_suffix == CLEANED_FILE_SUFFIX:
                with contextlib.suppress(Exception):
                    out.delete()  # (a writer's open would remove it too)
            raise

    def _new_output(self, log: Log, base: int) -> LogSegment:
        if self._scratch is not None:  # object store: built on local disk, then published whole
            return LogSegment.create(
                self._scratch[0], self._scratch[1], base, file_suffix=CLEANED_FILE_SUFFIX, **log.segment_kwargs()
            )
        return LogSegment.create(log.fs, log.dir, base, file_suffix=CLEANED_FILE_SUFFIX, **log.segment_kwargs())

    def _clean_source(self, rnd: _Round, seg: LogSegment, out: LogSegment, *, may_overflow) -> _SourceStats | None:
        """Filter one source segment into `out`; None (nothing counted) if it would overflow `out`."""
        st = _SourceStats(seg)
        self._check_unchanged(rnd.log, seg, rnd.mtimes)
        try:
            for chunk in bounded_chunks(seg.iter_chunks(0), rnd.log.max_batch_size):
                self._validate(chunk, rnd.res)
                st.last_header = chunk.scan.headers[-1:].copy()
                buf, scan = self._filter_chunk(rnd, chunk, st)
                if not len(scan):
                    continue
                if not may_overflow and self._overflows(rnd.log, out, scan):
                    return None
                out.append(buf, scan)
                st.emitted += len(scan)
                st.bytes_written += len(buf)
                self.throttler.maybe_throttle(len(buf))
        finally:
            seg.release_readers()
        for name in (
            "records_read",
            "records_dropped",
            "tombstones_dropped",
            "aborted_dropped",
            "markers_dropped",
            "keyless_kept",
            "bytes_written",
        ):
            setattr(rnd.res, name, getattr(rnd.res, name) + getattr(st, name))
        return st

    def _overflows(self, log: Log, out: LogSegment, scan) -> bool:
        cfg = log.config
        if out.size + scan.end > cfg.segment_bytes or int(scan.last_offsets[-1]) - out.base_offset > INT32_MAX:
            return True
        plan = plan_index_entries(
            scan.positions + out.size,
            scan.sizes,
            scan.last_offsets,
            scan.headers["max_timestamp"].astype(np.int64),
            cfg.index_interval_bytes,
            out.index_state(),
        )
        return (
            out.offset_index.entries + len(plan.offset_entries[0]) > out.offset_index.max_entries
            or out.time_index.entries + len(plan.time_entries[0]) > out.time_index.max_entries - 1
        )

    def _filter_chunk(self, rnd: _Round, chunk, st: _SourceStats):
        """The chunk's batches as they survive: (bytes, scan). Aborted transactions' batches go; a marker
        stays whole until its transaction's data is gone and then its delete horizon has passed."""
        scan = chunk.scan
        h = scan.headers
        status = np.full(len(scan), K.VERBATIM, np.int8)
        attrs = h["attributes"].astype(np.int64)
        control = (attrs & rb.CONTROL_FLAG_MASK) != 0
        everything = np.arange(len(scan))
        aborted, discard = rnd.txn.read_batches(
            h, everything, control_types(chunk, np.flatnonzero(control), rnd.log.max_batch_size)
        )
        counts = h["record_count"].astype(np.int64)
        st.records_read += int(counts[~control].sum())
        has_h = (attrs & rb.DELETE_HORIZON_FLAG_MASK) != 0
        expired = control & discard & has_h & (rnd.now >= h["base_timestamp"].astype(np.int64))
        status[aborted | expired] = K.DROP
        st.aborted_dropped += int(counts[aborted].sum())
        st.markers_dropped += int(counts[expired].sum())
        st.records_dropped += int(counts[aborted].sum())  # data records: markers are counted apart
        work = np.flatnonzero(~aborted & ~expired)
        heads, areas = {}, {}
        if work.size:
            keep_all, stamp_all = control[work], (control & discard)[work]
            src, a0, a1 = record_areas(chunk, work, rnd.log.max_batch_size)
            sts, heads, areas, stats = self._filter(
                rnd, chunk, work, src, a0, a1, np.ones(work.size, bool), keep_all, stamp_all
            )
            grown = [
                i
                for i, j in enumerate(work.tolist())
                if sts[i] == K.REWRITE_STAMPED
                and len(heads[j]) + memoryview(areas[j]).nbytes > max(rnd.log.max_batch_size, int(scan.sizes[j]))
            ]
            if grown:  # stamping would pass max.message.bytes, which readers enforce: leave those unstamped
                logger.warning(
                    "%s: batch at offset %s would exceed max.message.bytes with its delete horizon; its "
                    "tombstones or marker stay until it shrinks",
                    rnd.log.tp,
                    int(h["base_offset"][work[grown[0]]]),
                )
                again = np.ones(work.size, bool)
                again[grown] = False
                sts, heads, areas, stats = self._filter(rnd, chunk, work, src, a0, a1, again, keep_all, stamp_all)
            status[work] = sts
            st.records_dropped += int(stats[0])
            st.tombstones_dropped += int(stats[1])
            st.keyless_kept += int(stats[2])
        if (status == K.VERBATIM).all():
            return chunk.buf[: scan.end], scan
        st.verbatim = False
        view = as_uint8(chunk.buf).data
        pieces = []
        for i in np.flatnonzero(status != K.DROP).tolist():  # per batch
            if status[i] == K.VERBATIM:
                p = int(scan.positions[i])
                pieces.append(view[p : p + int(scan.sizes[i])])
            else:
                pieces.append(heads[i])
                pieces.append(areas[i])
        buf = b"".join(pieces)
        return buf, scan_batches(buf)

    def _filter(self, rnd: _Round, chunk, data, src, a0, a1, may_stamp, keep_all, stamp_all):
        """Run the record filter over batches `data` of a chunk; the rewritten ones' headers and areas.
        keep_all: markers (every record kept); stamp_all: markers to stamp with a delete horizon."""
        h = chunk.scan.headers
        counts = h["record_count"][data].astype(np.int64)
        base_ts = h["base_timestamp"][data].astype(np.int64)
        has_h = (h["attributes"][data].astype(np.int64) & rb.DELETE_HORIZON_FLAG_MASK) != 0
        out = np.empty(int((a1 - a0).sum() + K.MAX_REFRAME_GROWTH * counts.sum()), np.uint8)
        tags, offs, slots = rnd.omap.tables
        sts, o0, o1, kept, mts, nbase, stats, err, _, eb = K.filter_batches(
            src,
            a0,
            a1,
            counts,
            h["last_offset_delta"][data].astype(np.int64),
            h["base_offset"][data].astype(np.int64),
            base_ts,
            has_h,
            base_ts,
            may_stamp,
            keep_all,
            stamp_all,
            tags,
            offs,
            slots,
            np.int64(rnd.omap.base_offset),
            np.int64(rnd.end),
            np.int64(rnd.now),
            np.int64(rnd.horizon),
            out,
        )
        if err:
            raise framing_error(chunk, int(data[eb]), err)
        rew = np.flatnonzero(sts >= K.REWRITE)
        heads, areas = {}, {}
        if rew.size:
            heads, areas = rewritten_batches(
                h[data[rew]], data[rew], sts[rew], o0[rew], o1[rew], kept[rew], mts[rew], nbase[rew], out
            )
        return sts, heads, areas, stats

    def _validate(self, chunk, res: CleanResult) -> None:
        validate_batches(chunk.buf, chunk.scan, source=chunk.source, base_position=chunk.base_position)
        res.bytes_read += chunk.scan.end
        self._meter.add(chunk.scan.end)
        self.throttler.maybe_throttle(chunk.scan.end)

    # ------------------------------------------------------------------ swap
    def _finish(self, rnd: _Round, out: LogSegment, members: list[_SourceStats]) -> None:
        """Close an output and swap it in for its sources (or drop it if it would change nothing)."""
        log = rnd.log
        entries = rnd.txn.take_cleaned_entries()  # aborted transactions whose ABORT marker stays in `out`
        last = members[-1] if members else None
        if last is not None and not last.emitted and last.last_header is not None:
            # the loader completes a crashed swap over [base, the output's next offset): keep the last
            # source's offsets in the output so that range covers every source it replaces
            empty = empty_batch(last.last_header)
            out.append(empty, scan_batches(empty))
        sources = [m.seg for m in members]
        if out.size == 0 or (self._unchanged(log, out, members) and self._same_txns(log, sources[0], entries)):
            out.delete()
            return
        if entries and self._scratch is None:  # (object stores: publish_swap writes them)
            index = TransactionIndex(out.fs, out.txn_index_path, out.base_offset)
            for txn in entries:
                index.append(txn)
            index.flush()
            index.close()
        out.on_become_inactive()
        out.close()
        if self._scratch is not None:
            self._verify_unchanged(log, sources, rnd.mtimes)
            self._publish(log, out, sources, entries)
        else:
            with self._partition_lock(log):
                self._verify_unchanged(log, sources, rnd.mtimes)
                replace_segments(log, [out], sources)
        rnd.res.groups.append((out.base_offset, tuple(s.base_offset for s in sources)))

    def _publish(self, log: Log, out: LogSegment, sources: list[LogSegment], entries: list) -> None:
        """Object store: the create-only swap of storage/segment_swap.py instead of renames under a lock, with
        the output's `.txnindex` entries (`entries`, AbortedTxn)."""
        data = out.fs.read(out.log_path)
        off_rows = np.frombuffer(out.fs.read(out.offset_index.path), OffsetIndex.entry_dtype).copy()
        time_rows = np.frombuffer(out.fs.read(out.time_index.path), TimeIndex.entry_dtype).copy()
        nxt = int(scan_batches(data).last_offsets[-1]) + 1
        out.delete()
        txn_rows = np.array([(ABORTED_TXN_VERSION, *t) for t in entries], ABORTED_TXN_DTYPE)
        publish_swap(
            log.fs,
            log.dir,
            out.base_offset,
            data,
            off_rows,
            time_rows,
            next_offset=nxt,
            txn_rows=txn_rows,
            check=self.check,
        )
        replace_in_memory(log, out.base_offset, len(data), sources, off_rows, time_rows)

    @staticmethod
    def _unchanged(log: Log, out: LogSegment, members: list[_SourceStats]) -> bool:
        """One source rewritten to the same bytes (nothing dropped, or only its empty last batch,
        which came back): swapping it would only churn files."""
        if len(members) != 1 or out.size != members[0].seg.size:
            return False
        if members[0].verbatim:
            return True
        out.flush(fsync=False)
        return out.fs.read(out.log_path) == log.fs.read(members[0].seg.log_path)

    def _same_txns(self, log: Log, seg: LogSegment, entries: list) -> bool:
        """The source's `.txnindex` holds exactly the entries its output would."""
        return TransactionIndex(log.fs, seg.txn_index_path, seg.base_offset).all_aborted_txns() == entries

    @staticmethod
    @contextlib.contextmanager
    def _output_lock(log: Log):
        """Held while this cleaner's `.cleaned` files exist, so a writer opening the log leaves them be."""
        held = contextlib.ExitStack()
        try:
            held.enter_context(cleaner_output_lock(log.fs, log.dir, timeout=0))
        except LogLockedError:
            raise CleaningAbortedError(
                f"{log.tp}: another cleaner is compacting this partition now; giving up this round"
            ) from None
        with held:
            yield

    def _partition_lock(self, log: Log):
        if log.writable:
            return contextlib.nullcontext()
        return log.fs.lock(log.fs.join(log.dir, LOCK_FILE), timeout=self.config.lock_timeout_ms / 1000)

    def _check_no_swap(self, log: Log) -> None:
        for f in log.fs.listdir(log.dir):
            parsed = parse_segment_file(f.name)
            if parsed is not None and parsed.extra == SWAP_FILE_SUFFIX:
                raise CleaningAbortedError(
                    f"{log.tp}: {log.fs.url(log.fs.join(log.dir, f.name))} is left from an "
                    f"interrupted swap; opening the log for writing completes it"
                )

    def _verify_unchanged(self, log: Log, sources: list[LogSegment], mtimes: dict) -> None:
        """Under the lock: no swap is pending and every source is as it was when the cleaning began."""
        self._check_no_swap(log)
        for s in sources:
            self._check_unchanged(log, s, mtimes)

    @staticmethod
    def _check_unchanged(log: Log, seg: LogSegment, mtimes: dict) -> None:
        """The segment's .log still has the size and mtime it had (retention, a writer's recovery or
        another cleaner did not act on it)."""
        try:
            same = log.fs.size(seg.log_path) == seg.size and log.fs.modified_ms(seg.log_path) == mtimes.get(id(seg))
        except FileNotFoundError:
            same = False
        if not same:
            raise CleaningAbortedError(
                f"{log.tp}: segment {log.fs.url(seg.log_path)} changed or disappeared "
                f"while it was being cleaned; giving up this round"
            )
