"""LogLoader: open a partition directory the way Kafka's LogLoader does.

Writers (holding the partition lock) clean leftovers and recover: `.cleaned` and temp files go;
`.swap` files finish their swap; `.deleted` files past file.delete.delay.ms go; missing or corrupt
indexes are rebuilt; batches from the recovery point on are validated and a torn tail is cut.
Readers only look: they never change a file, and stop quietly at a tail still being written.

On a filesystem without append or locks (immutable segments, see storage/objects/immutable_segment.py)
there is no lock, nothing to recover (every segment object is whole) and nothing is cleaned up: a
committed `.log.swap` of the maintenance job is read in place of the segments it replaces (the job
completes it, storage/segment_swap.py); a segment whose index objects are missing gets them rebuilt
in memory, and written when the log is opened for writing.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from .common.time import SYSTEM_TIME
from .errors import (
    CorruptIndexError,
    CorruptRecordError,
    KafkaStorageError,
    LogLockedError,
    UnknownTopicOrPartitionError,
)
from .fs.filesystem import FileInfo, LogFileSystem
from .log import Log
from .log_config import LogConfig
from .log_segment import LogSegment, segment_settings
from .objects.immutable_segment import (
    check_exclusive_create,
    immutable_segments,
    next_offset_of,
    rebuild_indexes,
)
from .objects.object_producer_state import ObjectProducerStateManager
from .segment_swap import LocalSwapPlan, cleaner_output_lock, object_swap_last_offset, plan_local_swaps
from .topic_partition import (
    CLEANED_FILE_SUFFIX,
    DELETED_FILE_SUFFIX,
    INDEX_FILE_SUFFIX,
    LOG_FILE_SUFFIX,
    SWAP_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
    TopicPartition,
    parse_segment_file,
    segment_file_name,
)
from .transactions.producer_state_manager import ProducerStateManager
from .transactions.writer_state import WriterState

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


def producer_state_for(wlog: Log) -> WriterState:
    """The writer state of a writable log: the lock-protected state file, or, for immutable segments
    (no append or no locks), the state the committed batches carry."""
    if wlog.immutable:
        return ObjectProducerStateManager(wlog)
    return ProducerStateManager(wlog.fs, wlog.dir)


@dataclass
class LoadReport:
    """What loading did, for the CLI and the maintenance job to print."""

    removed: list[str] = field(default_factory=list)
    swapped_in: list[int] = field(default_factory=list)
    rebuilt_indexes: list[int] = field(default_factory=list)
    recovered_segments: list[int] = field(default_factory=list)
    truncated: list[tuple[str, int, str]] = field(default_factory=list)  # (file, bytes cut, reason)
    resolved_commits: list[str] = field(default_factory=list)  # pending sink commits finished or rolled back


class LogLoader:
    def __init__(
        self,
        fs: LogFileSystem,
        dir: str,
        tp: TopicPartition,
        config: LogConfig,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        writable: bool = False,
        lock_timeout: float | None = 30.0,
        now_ms: int | None = None,
        create_dir: bool = True,
    ):
        self.fs = fs
        self.create_dir = create_dir  # False: the caller made sure the directory exists (LogManager)
        self.dir = dir
        self.tp = tp
        self.config = config
        self.recovery_point = recovery_point
        self.log_start_offset = log_start_offset
        self.writable = writable
        self.lock_timeout = lock_timeout
        self.now_ms = SYSTEM_TIME.milliseconds() if now_ms is None else now_ms
        self.report = LoadReport()
        self.dir_changed = False  # a file made, renamed or removed here: the writer's next flush syncs the dir

    def _kwargs(self) -> dict:
        return segment_settings(self.config)

    def load(self) -> Log:
        immutable = immutable_segments(self.fs)
        lock = None
        if self.writable:
            if immutable:
                check_exclusive_create(self.fs, f"cannot open {self.tp.topic}-{self.tp.partition} for writing")
            if self.create_dir:
                self.fs.mkdirs(self.dir)
            lock = contextlib.ExitStack()
            if self.fs.capabilities.locks:
                try:
                    lock.enter_context(self.fs.lock(self.fs.join(self.dir, LOCK_FILE), timeout=self.lock_timeout))
                except FileNotFoundError:
                    raise self._gone() from None
        try:
            if self.writable and not immutable and not self.fs.isdir(self.dir):
                # renamed away (topic deletion) while we waited for its lock: the lock we hold is not this dir's
                raise self._gone()
            if self.writable and immutable:
                self.fs.invalidate_listings(self.dir)  # a writer starts from every segment committed so far
            files = self.fs.listdir(self.dir)
            if self.writable and not immutable:
                files = self._clean_leftovers(files)
            segments = self._load_segments(files, immutable)
            if self.writable and not immutable:
                segments = self._recover(segments)
            elif immutable:
                for seg in segments:
                    if seg.needs_rebuild:
                        rebuild_indexes(seg, write=self.writable)
                        self.report.rebuilt_indexes.append(seg.base_offset)
            start = self.log_start_offset
            if segments:
                start = max(start, segments[0].base_offset)
            if not segments:
                if self.writable and not immutable:
                    segments = [LogSegment.create(self.fs, self.dir, start, **self._kwargs())]
                    self.dir_changed = True
                else:  # immutable: the empty active segment exists only in memory until an append creates it
                    segments = [
                        LogSegment(
                            self.fs, self.dir, start, log_size=0, index_size=0, time_index_size=0, **self._kwargs()
                        )
                    ]
            last = segments[-1]
            tail_error = None
            if immutable:
                next_offset = next_offset_of(last)
            else:
                next_offset, tail_error = last.scan_tail()
                if tail_error is not None and self.writable:
                    raise tail_error  # below the recovery point, so not recovered: flushed data is damaged
            next_offset = max(next_offset, start)
            if immutable and segments[-1].size == 0 and segments[-1].base_offset != next_offset:
                segments[-1] = LogSegment(
                    self.fs, self.dir, next_offset, log_size=0, index_size=0, time_index_size=0, **self._kwargs()
                )
            elif self.writable and segments[-1].size == 0 and segments[-1].base_offset != next_offset:
                # an empty active segment below the log start offset: start afresh at it
                segments[-1].delete()
                segments[-1] = LogSegment.create(self.fs, self.dir, next_offset, **self._kwargs())
                self.dir_changed = True
            recovery_point = min(max(self.recovery_point, start), next_offset) if not self.writable else next_offset
            log = Log(
                self.fs,
                self.dir,
                self.tp,
                self.config,
                segments,
                log_start_offset=start,
                recovery_point=recovery_point,
                next_offset=next_offset,
                writable=self.writable,
                lock=lock,
                tail_error=tail_error,
                dir_changed=self.dir_changed,
            )
            if self.writable:
                log.attach_producer_state(producer_state_for(log))
                self.report.resolved_commits = log.producer_state.resolve_pending(log)
            return log
        except BaseException:
            if lock is not None:
                lock.close()
            raise

    def _gone(self) -> UnknownTopicOrPartitionError:
        return UnknownTopicOrPartitionError(
            f"partition {self.tp.topic}-{self.tp.partition}: directory {self.fs.url(self.dir)} no longer exists "
            f"(the topic was deleted)"
        )

    # ------------------------------------------------------------------ leftovers
    def _clean_leftovers(self, files: list[FileInfo]) -> list[FileInfo]:
        """Finish or set aside `.swap` files first (their originals may be `.deleted` files that must not
        go yet), then remove `.cleaned` and temp files, index swaps, and `.deleted` files past their delay."""
        if any(
            p is not None and p.extra == SWAP_FILE_SUFFIX and p.suffix == LOG_FILE_SUFFIX
            for p in (parse_segment_file(f.name) for f in files if not f.is_dir)
        ):
            self._apply_swap_plan(plan_local_swaps(self.fs, self.dir, files, self._kwargs()))
            files = self.fs.listdir(self.dir)
        keep: list[FileInfo] = []
        with contextlib.ExitStack() as cleaner_gone:
            live_cleaner = self._live_cleaner(files, cleaner_gone)
            for f in files:
                if f.is_dir:
                    continue
                if live_cleaner and CLEANED_FILE_SUFFIX in f.name:
                    continue  # a cleaner in another process is writing it (it holds .cleaner.lock)
                self._clean_leftover(f, keep)
        return keep

    def _live_cleaner(self, files: list[FileInfo], stack: contextlib.ExitStack) -> bool:
        """Whether a cleaner is writing `.cleaned` output here now; if not, its lock is held (in `stack`)
        while the leftovers go, so that none starts meanwhile."""
        if not any(CLEANED_FILE_SUFFIX in f.name for f in files):
            return False
        try:
            stack.enter_context(cleaner_output_lock(self.fs, self.dir, timeout=0))
        except LogLockedError:
            return True
        return False

    def _clean_leftover(self, f: FileInfo, keep: list[FileInfo]) -> None:
        """Remove f if it is a leftover (temp file, `.cleaned`, index `.swap`, `.deleted` past its delay);
        else keep it for loading."""
        path = self.fs.join(self.dir, f.name)
        parsed = parse_segment_file(f.name)
        if f.name.endswith(".tmp") or (parsed is not None and parsed.extra == CLEANED_FILE_SUFFIX):
            self._remove(path)
        elif parsed is not None and parsed.extra == DELETED_FILE_SUFFIX:
            try:
                due = self.now_ms - self.fs.modified_ms(path) >= self.config.file_delete_delay_ms
            except FileNotFoundError:  # removed by a maintenance pass since the listing
                return
            if due:
                self._remove(path)
        elif parsed is not None and parsed.extra == SWAP_FILE_SUFFIX:
            self._remove(path)  # index swaps: the indexes of swapped-in segments are rebuilt
        else:
            keep.append(f)

    def _remove(self, path: str) -> None:
        self.fs.delete(path)
        self.dir_changed = True
        self.report.removed.append(self.fs.basename(path))

    def _apply_swap_plan(self, plan: LocalSwapPlan) -> None:
        """A writer acts on the checked plan: damaged swaps are set aside (renamed to `.swap.damaged`, which
        no loader reads) and the originals they had moved come back; good swaps replace exactly the
        segments they cover. Each step is a rename or a delete that a crash may interrupt: the next
        load plans again from what is there."""
        fs, d = self.fs, self.dir
        self.dir_changed = True
        for b, error in plan.damaged:
            src = fs.join(d, segment_file_name(b, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX))
            log.warning(
                "%s: set aside as %s.damaged; the segments it would have replaced stay: %s",
                fs.url(src),
                fs.basename(src),
                error,
            )
            fs.rename(src, src + ".damaged")
            self.report.removed.append(fs.basename(src))
        for b in plan.restores:
            for suffix in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX):  # the .log last
                src = fs.join(d, segment_file_name(b, suffix, DELETED_FILE_SUFFIX))
                if fs.exists(src):
                    fs.rename(src, src[: -len(DELETED_FILE_SUFFIX)])
            log.warning(
                "%s: brought back from %s (the swap that moved it is damaged)",
                fs.url(fs.join(d, segment_file_name(b, LOG_FILE_SUFFIX))),
                DELETED_FILE_SUFFIX,
            )
        for b, _, covered in plan.installs:
            for x in covered:
                for suffix in (LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
                    if x == b and suffix == LOG_FILE_SUFFIX:
                        continue  # replaced by the rename below, in one step
                    path = fs.join(d, segment_file_name(x, suffix))
                    if fs.exists(path):
                        self._remove(path)
            swap = fs.join(d, segment_file_name(b, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX))
            fs.rename(swap, swap[: -len(SWAP_FILE_SUFFIX)])
            self.report.swapped_in.append(b)
        if fs.capabilities.fsync:
            fs.sync_dir(d)

    # ------------------------------------------------------------------ segments
    def _load_segments(self, files: list[FileInfo], immutable: bool = False) -> list[LogSegment]:
        logs: dict[int, int] = {}
        indexes: dict[tuple[int, str], int] = {}
        for f in files:
            parsed = parse_segment_file(f.name)
            if parsed is None or parsed.extra or f.is_dir:
                continue
            if parsed.suffix == LOG_FILE_SUFFIX:
                if immutable and f.size == 0:
                    continue  # holds nothing; never deleted here: without locks that could race a writer
                logs[parsed.base_offset] = f.size
            elif parsed.suffix in (INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX):
                indexes[(parsed.base_offset, parsed.suffix)] = f.size
        if self.writable and not immutable:  # immutable: an index may precede its .log in a listing mid-delete
            for base, suffix in list(indexes):
                if base not in logs:  # Kafka: an orphaned index file is deleted
                    self._remove(self.fs.join(self.dir, f"{base:020d}{suffix}"))
        if immutable:
            swap_view, ranges = self._object_swap_view(files)
        else:
            swap_view, ranges = self._reader_swap_view(files) if not self.writable else ({}, [])
        if swap_view:
            logs = {b: size for b, size in logs.items() if not any(lo_ <= b < hi_ for lo_, hi_ in ranges)}
        segments = []
        for base in sorted(set(logs) | set(swap_view)):
            if base in swap_view:
                segments.append(swap_view[base])
                continue
            idx = indexes.get((base, INDEX_FILE_SUFFIX))
            tidx = indexes.get((base, TIME_INDEX_FILE_SUFFIX))
            seg = LogSegment(
                self.fs,
                self.dir,
                base,
                log_size=logs[base],
                index_size=idx or 0,
                time_index_size=tidx or 0,
                **self._kwargs(),
            )
            if idx is None or tidx is None:
                seg.mark_needs_rebuild()
            # readers fall back to a scan on a bad index instead; so do immutable logs, where checking
            # every segment's index would cost a request each (their indexes are written whole)
            if not seg.needs_rebuild and self.writable and not immutable:
                try:
                    seg.offset_index.sanity_check(logs[base])
                    seg.time_index.sanity_check()
                except CorruptIndexError as e:
                    log.warning("%s; rebuilding the indexes of %s", e, seg.source)
                    seg.mark_needs_rebuild()
            segments.append(seg)
        return segments

    def _reader_swap_view(self, files: list[FileInfo]) -> tuple[dict[int, LogSegment], list[tuple[int, int]]]:
        """A reader listing mid-swap (or after a crashed one) reads a finished, checked `.swap` in place of
        the segments it covers, whose files may already be `.deleted`; only a writer renames it. A
        damaged swap is passed over, and the originals it had moved are read from their `.deleted` files."""
        if not any(
            p is not None and p.extra == SWAP_FILE_SUFFIX and p.suffix == LOG_FILE_SUFFIX
            for p in (parse_segment_file(f.name) for f in files if not f.is_dir)
        ):
            return {}, []
        plan = plan_local_swaps(self.fs, self.dir, files, self._kwargs())
        sizes = {f.name: f.size for f in files}
        view, ranges = {}, []
        for b, last, _ in plan.installs:
            view[b] = self._scanned_segment(b, SWAP_FILE_SUFFIX, sizes)
            ranges.append((b, last + 1))
        for b, error in plan.damaged:
            log.warning(
                "%s is damaged and is not read in place of the segments it would replace: %s",
                self.fs.url(self.fs.join(self.dir, segment_file_name(b, LOG_FILE_SUFFIX, SWAP_FILE_SUFFIX))),
                error,
            )
        for b in plan.restores:
            view[b] = self._scanned_segment(b, DELETED_FILE_SUFFIX, sizes)
        return view, ranges

    def _scanned_segment(self, base: int, suffix: str, sizes: dict[str, int]) -> LogSegment:
        """A segment read from its `.log<suffix>` file alone: no index is trusted, reads scan it."""
        seg = LogSegment(
            self.fs,
            self.dir,
            base,
            file_suffix=suffix,
            index_size=0,
            time_index_size=0,
            log_size=sizes[segment_file_name(base, LOG_FILE_SUFFIX, suffix)],
            **self._kwargs(),
        )
        seg.mark_needs_rebuild()
        return seg

    def _object_swap_view(self, files: list[FileInfo]) -> tuple[dict[int, LogSegment], list[tuple[int, int]]]:
        """Immutable segments: a committed `<base>.log.swap` (storage/segment_swap.py) replaces the live
        segments in [base, its next offset) for every loader, readers and writers alike, until the
        maintenance job completes it; nothing is changed here. Two overlapping swaps mean two
        maintenance jobs at work: that is reported, not guessed at."""
        sizes = {f.name: f.size for f in files if not f.is_dir}
        view: dict[int, LogSegment] = {}
        ranges = []
        for name, size in sizes.items():
            parsed = parse_segment_file(name)
            if parsed is None or parsed.extra != SWAP_FILE_SUFFIX or parsed.suffix != LOG_FILE_SUFFIX or not size:
                continue
            base = parsed.base_offset
            try:
                nxt = object_swap_last_offset(self.fs, self.dir, base, size, self.config) + 1
            except FileNotFoundError:
                continue  # completed since the listing
            except CorruptRecordError as e:
                log.warning(
                    "%s is damaged and is not read in place of the segments it would replace (the "
                    "maintenance job sets it aside): %s",
                    self.fs.url(self.fs.join(self.dir, name)),
                    e,
                )
                continue
            seg = LogSegment(
                self.fs,
                self.dir,
                base,
                file_suffix=SWAP_FILE_SUFFIX,
                log_size=size,
                index_size=0,
                time_index_size=0,
                **self._kwargs(),
            )
            view[base] = seg  # no index entries: reads scan it (it is short-lived)
            ranges.append((base, nxt))
        ranges.sort()
        for (b1, n1), (b2, _) in zip(ranges, ranges[1:], strict=False):
            if b2 < n1:
                raise KafkaStorageError(
                    f"partition {self.tp.topic}-{self.tp.partition}: segment swaps at offsets {b1} and {b2} overlap in "
                    f"{self.fs.url(self.dir)}: two maintenance jobs are at work on it; read again later"
                )
        return view, ranges

    def _recover(self, segments: list[LogSegment]) -> list[LogSegment]:
        """Rebuild indexes where needed and validate everything from the recovery point on. Only the
        last segment may have a torn tail cut (LogSegment._recover_range); damage anywhere else raises."""
        rp = self.recovery_point
        for i, seg in enumerate(segments):
            is_last = i + 1 == len(segments)
            nxt = None if is_last else segments[i + 1].base_offset
            if seg.needs_rebuild or seg.base_offset >= rp:
                (self.report.rebuilt_indexes if seg.needs_rebuild else self.report.recovered_segments).append(
                    seg.base_offset
                )
                result = seg.recover(tail_ok=is_last, upper=nxt)  # rebuilds the indexes too
            elif nxt is None or nxt > rp:
                result = seg.recover_from(rp, tail_ok=is_last, upper=nxt)
                self.report.recovered_segments.append(seg.base_offset)
            else:
                continue
            if result.truncated_bytes:
                log.warning(
                    "truncated %d bytes of %s at position %d: %s",
                    result.truncated_bytes,
                    seg.source,
                    result.valid_bytes,
                    result.error,
                )
                self.report.truncated.append((seg.source, result.truncated_bytes, result.error or ""))
        return segments
