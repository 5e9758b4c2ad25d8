"""The maintenance job: the background work of Kafka's LogManager and LogCleaner, run on demand.

Per partition: retention (log start offset, retention.bytes, retention.ms), compaction when
cleanup.policy has `compact`, removal of `.deleted` files past file.delete.delay.ms, and the abort of sink
transactions left open past their timeout. Per root: removal of deleted topics' `-delete` directories, of
the sink's transaction decisions no partition needs any more, of the staging directories of writers gone for
longer than transactional.id.expiration.ms (storage/staging/staging_expiry.py), and the recovery-point and
log-start-offset checkpoints (the cleaner keeps cleaner-offset-checkpoint as it goes). Locks are taken only around
a delete or a swap, so the job runs beside live writers and readers.

On object stores (no locks) the job also merges small segments (storage/cleaner/segment_merger.py), every
rewrite is a create-only swap or an idempotent copy-and-delete, and one job per log dir runs at a
time, by a create-only lease (storage/objects/maintenance_lease.py).

A pass runs its partitions here, or hands them to a `distribute` function that runs slices of them
elsewhere (kafkalog_ds.maintenance: as Spark tasks), each slice by maintain_partitions. The command
is `kafkalog maintain` (kafkalog_ds/cli.py).

Before the partitions, a pass keeps each topic's Iceberg table (table.mode, storage/tables): one
materialization per table, its data files written here or by `distribute_writes` (Spark tasks), one catalog
commit per table. It comes first so that retention, which waits for the table, can free what it just took.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

from .cleaner.clean_progress import CleanProgress
from .cleaner.cleaner_config import CleanerConfig
from .cleaner.log_cleaner_manager import LogCleanerManager
from .cleaner.segment_merger import merge_small_segments
from .common.time import SYSTEM_TIME, Time
from .errors import InvalidConfigError, KafkaLogError, MaintenanceLeaseError, UnknownTopicOrPartitionError
from .log_config import parse_option
from .log_manager import LogManager
from .log_retention import delete_old_segment_objects
from .objects.maintenance_lease import MaintenanceLease, attach_lease
from .objects.object_snapshots import delete_snapshots_below_start, snapshot_merged_segments
from .segment_swap import complete_pending_swaps
from .staging.staging_expiry import (
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
    TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG,
    StagingExpiry,
    expire_staging,
)
from .tables.table_config import TableConfig, require_pyiceberg
from .tables.table_report import TableReport
from .topic_partition import TopicPartition
from .transactions.producer_state_manager import ProducerStateManager
from .transactions.transaction_coordinator import (
    ABORT,
    ABORT_DECISION_RETENTION_MS,
    delete_decision,
    list_decisions,
)
from .transactions.writer_state import find_marker


@dataclass
class PartitionReport:
    """What one pass did to one partition."""

    topic: str
    partition: int
    bytes_before: int = 0
    bytes_after: int = 0
    segments_deleted: int = 0  # by retention
    log_start_offset: int = 0
    recovery_point: int = 0
    cleaned: bool = False
    keys_kept: int = 0
    records_dropped: int = 0  # data records (aborted ones included)
    markers_dropped: int = 0  # transaction markers past their delete horizon
    tombstones_dropped: int = 0
    segments_merged: int = 0  # segments the cleaner replaced, less the ones it wrote
    merged_groups: int = 0  # object stores: small segments merged, groups written
    merged_segments: int = 0  # ... and the segments they replaced
    swaps_completed: int = 0  # object stores: abandoned swaps of an earlier job completed
    files_removed: int = 0  # .deleted files past their delay
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    skipped: bool = False  # no partition directory yet: nothing to maintain
    transactions_resolved: list[str] = field(default_factory=list)  # sink transactions ended (timed out)
    txn_files_removed: int = 0  # object stores: dead writers' transaction files removed
    snapshots_written: int = 0  # object stores: producer snapshots at merged segments' bases

    def line(self) -> str:
        if self.skipped:
            return f"{self.topic}-{self.partition}: nothing to do (no data written yet)"
        what = [f"{self.bytes_before}->{self.bytes_after} bytes"]
        if self.segments_deleted:
            what.append(f"{self.segments_deleted} segment(s) deleted by retention")
        if self.cleaned:
            what.append(
                f"compacted: {self.keys_kept} keys kept, {self.records_dropped} records dropped "
                f"({self.tombstones_dropped} tombstones)"
                + (f", {self.markers_dropped} transaction markers dropped" if self.markers_dropped else "")
                + f", {self.segments_merged} fewer segments"
            )
        if self.merged_groups:
            what.append(f"merged {self.merged_segments} small segments into {self.merged_groups}")
        if self.swaps_completed:
            what.append(f"{self.swaps_completed} interrupted swap(s) completed")
        if self.files_removed:
            what.append(f"{self.files_removed} .deleted file(s) removed")
        if self.txn_files_removed:
            what.append(f"{self.txn_files_removed} dead writer transaction file(s) removed")
        if self.snapshots_written:
            what.append(f"{self.snapshots_written} producer snapshot(s) written")
        what.append(f"log start {self.log_start_offset}")
        status = "FAILED: " + "; ".join(self.errors) if self.errors else "ok"
        return f"{self.topic}-{self.partition}: {status}; " + ", ".join(what) + f" ({self.duration_s:.2f}s)"


class PassReports(list):
    """A pass's PartitionReports (a list, as before tables), with `tables`: its TableReports, and `staging`:
    the abandoned staging directories it removed (StagingExpiry; None when that step failed)."""

    def __init__(self, reports=(), tables=(), staging: StagingExpiry | None = None):
        super().__init__(reports)
        self.tables: list[TableReport] = list(tables)
        self.staging = staging

    @property
    def failed(self) -> bool:
        return any(r.errors for r in self) or any(t.error for t in self.tables)


#: Runs a pass's partitions elsewhere: called with the partitions and the arguments that follow the slice
#: in maintain_partitions (root, now, storage options, cleaner settings, the lease held, fs); it runs
#: maintain_partitions(slice, *args) on slices of them and returns every report.
Distribute = Callable[[list[TopicPartition], tuple], list[PartitionReport]]


def _record_cleaning(c, rep) -> None:
    """Copy a compaction's outcome into the partition's report."""
    if c.error:
        rep.errors.append(f"compaction: {c.error}")
    elif c.groups:
        rep.cleaned = True
        rep.keys_kept, rep.records_dropped, rep.tombstones_dropped = c.keys, c.records_dropped, c.tombstones_dropped
        rep.markers_dropped = c.markers_dropped
        rep.segments_merged = c.segments_before - c.segments_after


def _record_after(lm, tp, rep) -> None:
    """Fill the report's after-state from a fresh reader of the partition."""
    try:
        with lm.open_log(tp) as log:
            rep.bytes_after, rep.log_start_offset = log.size, log.log_start_offset
            rep.recovery_point = max(log.log_start_offset, min(log.recovery_point, log.log_end_offset))
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"reopen: {type(e).__name__}: {e}")


def maintain_partition(
    root: str,
    tp: TopicPartition,
    *,
    now_ms: int | None = None,
    storage_options: dict | None = None,
    cleaner_settings: dict | None = None,
    lease: MaintenanceLease | None = None,
    fs=None,
    lm: LogManager | None = None,
    progress: CleanProgress | None = None,
) -> PartitionReport:
    """Retention, compaction and delayed deletes for one partition (on object stores also the merge of
    small segments, under `lease`, the job's MaintenanceLease). Failures are reported, not raised, so one
    bad partition does not stop the others; the next pass retries it. A pass gives its LogManager (`lm`),
    inside its snapshot(), so that topic and checkpoint files are read once per pass, not per partition.
    `progress(bytes done, bytes total)` is told how far the compaction is as it reads (Cleaner.clean)."""
    t0 = time.monotonic()
    now = SYSTEM_TIME.milliseconds() if now_ms is None else int(now_ms)
    rep = PartitionReport(tp.topic, tp.partition)
    lm = lm if lm is not None else LogManager(root, storage_options, fs=fs)
    if not lm.fs.capabilities.locks:
        try:
            _maintain_objects(lm, tp, rep, now, CleanerConfig.from_dict(cleaner_settings or {}), lease, progress)
        except MaintenanceLeaseError as e:
            rep.errors.append(f"lease: {e}")
        rep.duration_s = time.monotonic() - t0
        return rep
    try:
        with lm.open_log(tp) as log:
            rep.bytes_before = rep.bytes_after = log.size
            compact = log.config.compact
            pdir = log.dir
    except UnknownTopicOrPartitionError:  # not written yet (or its topic was just deleted): nothing to do
        rep.skipped = True
        rep.duration_s = time.monotonic() - t0
        return rep
    except Exception as e:  # noqa: BLE001 - reported per partition
        rep.errors.append(f"open: {type(e).__name__}: {e}")
        rep.duration_s = time.monotonic() - t0
        return rep
    try:  # sink transactions left open past their timeout are aborted (so they stop holding the LSO)
        if ProducerStateManager(lm.fs, pdir).first_unstable_offset() is not None:
            with lm.open_log(tp, writable=True) as wlog:
                rep.transactions_resolved = wlog.producer_state.resolve_pending(wlog, now_ms=now)
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"transactions: {type(e).__name__}: {e}")
    try:
        r = lm.apply_retention(tp, now_ms=now)
        rep.segments_deleted = r.segments_deleted
        if r.skipped:
            rep.errors.append(f"retention: {r.skipped}")
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"retention: {type(e).__name__}: {e}")
    if compact:
        cleaner = LogCleanerManager(lm, CleanerConfig.from_dict(cleaner_settings or {}))
        c = cleaner.clean_partition(tp, now, progress=progress)
        _record_cleaning(c, rep)
    try:
        rep.files_removed = len(lm.remove_expired_deleted_files(tp, now_ms=now))
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"delayed deletes: {type(e).__name__}: {e}")
    _record_after(lm, tp, rep)
    rep.duration_s = time.monotonic() - t0
    return rep


def _maintain_objects(
    lm: LogManager,
    tp: TopicPartition,
    rep: PartitionReport,
    now: int,
    cc: CleanerConfig,
    lease: MaintenanceLease | None,
    progress: CleanProgress | None = None,
) -> None:
    """One partition on an object store (no locks): the steps of maintain_partition, each a create-only
    swap or an idempotent copy-and-delete, under the job's lease (checked before every commit point)."""
    if lease is None:
        raise MaintenanceLeaseError(
            f"{lm.url()}: maintenance on an object store needs the maintenance lease (run_once takes it)"
        )
    lease.check()
    try:
        meta = lm.topic(tp.topic)
        dir = lm.partition_dir(tp)
        if not lm.fs.isdir(dir):
            raise UnknownTopicOrPartitionError(dir)
        rep.swaps_completed = len(
            complete_pending_swaps(lm.fs, dir, meta.config, now_ms=now, abandoned_after_ms=cc.lease_ttl_ms)
        )
        log = lm.open_log(tp)
    except UnknownTopicOrPartitionError:
        rep.skipped = True
        return
    except MaintenanceLeaseError:
        raise
    except Exception as e:  # noqa: BLE001 - reported per partition
        rep.errors.append(f"open: {type(e).__name__}: {e}")
        return
    rep.bytes_before = rep.bytes_after = log.size
    try:  # sink transactions left open past their timeout are aborted (so they stop holding the LSO), then the
        # transaction files of writers gone for good are removed
        with lm.open_log(tp, writable=True) as wlog:
            rep.transactions_resolved = wlog.producer_state.resolve_pending(wlog, now_ms=now)
            rep.txn_files_removed = len(wlog.producer_state.expire_transaction_files(now))
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"transactions: {type(e).__name__}: {e}")
    try:
        rep.files_removed = len(lm.remove_expired_deleted_files(tp, now_ms=now))
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"delayed deletes: {type(e).__name__}: {e}")
    try:
        r = delete_old_segment_objects(
            log, lambda lg: lm.update_checkpoints({}, {tp: lg.log_start_offset}), now_ms=now, hold=lm.table_hold(tp)
        )
        rep.segments_deleted = r.segments_deleted
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"retention: {type(e).__name__}: {e}")
    finally:
        log.close()
    if meta.config.compact:
        cleaner = LogCleanerManager(lm, cc, merge_min_age_ms=cc.merge_min_age_ms, check=lease.check)
        c = cleaner.clean_partition(tp, now, progress=progress)
        if isinstance(c.exception, MaintenanceLeaseError):
            raise c.exception
        _record_cleaning(c, rep)
    merged_bases: list[int] = []
    try:
        with lm.open_log(tp) as log:
            m = merge_small_segments(log, now_ms=now, min_age_ms=cc.merge_min_age_ms, check=lease.check)
        merged_bases = [g[0] for g in m.groups]
        rep.merged_groups = len(m.groups)
        rep.merged_segments = sum(len(g[1]) for g in m.groups)
    except MaintenanceLeaseError:
        raise
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"merge: {type(e).__name__}: {e}")
    try:  # producer snapshots, as Kafka's at each roll: a reader's transaction state starts from the latest
        with lm.open_log(tp) as log:  # (a fresh Log: the merge's has its transaction state of the old segments)
            rep.snapshots_written = len(snapshot_merged_segments(log, merged_bases))
            delete_snapshots_below_start(log)
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"producer snapshots: {type(e).__name__}: {e}")
    _record_after(lm, tp, rep)


PROGRESS_TIME: Time = SYSTEM_TIME  # the clock _Progress throttles on (tests: a MockTime)


class _Progress:
    """A progress bar on a terminal, plain lines otherwise; one line per partition either way. Between them, the
    partition under way and how far its compaction is (`changelog-0: compacting 42% (17/40 MB), 12s`): in the
    bar, redrawn in place at most every REDRAW_S, or as a plain line at most every LINE_S (a pipe, a log file).
    tick(), every TICK_S from a thread while the partitions run (ticking()), shows it again when the work itself
    has said nothing for that long (a numba kernel compiling on its first call, a slow read): a long partition is
    never silent for much more than LINE_S."""

    REDRAW_S = 0.2
    LINE_S = 5.0
    TICK_S = 1.0
    WIDTH = 30

    def __init__(self, out: TextIO, total: int, time: Time | None = None):
        self.out, self.total, self.done = out, total, 0
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.time = PROGRESS_TIME if time is None else time
        self.lock = threading.Lock()  # tick() runs in another thread
        self.step: str | None = None  # what is under way, None between partitions
        self.started = self.shown = self.time.nanoseconds()  # its start; the last line or redraw

    def begin(self, step: str) -> None:
        """Something under way: a partition (`changelog-0: under way`), or the ones a `distribute` runs."""
        with self.lock:
            self.step, self.started = step, self.time.nanoseconds()
            if not self.tty:
                self.shown = self.started  # a plain line only once it has been LINE_S under way
            self._show()

    def compaction(self, tp: TopicPartition) -> CleanProgress:
        """The partition's compaction progress (Cleaner.clean's), shown as a fraction of the bytes to read."""

        def report(done: int, total: int) -> None:
            pct = 100 * done // total if total else 100
            with self.lock:
                self.step = f"{tp}: compacting {pct}% ({_amount(done, total)})"
                self._show()

        return report

    def tick(self) -> None:
        with self.lock:
            if self.step is not None:
                self._show()

    def _show(self) -> None:
        now = self.time.nanoseconds()
        if self.step is None or now - self.shown < (self.REDRAW_S if self.tty else self.LINE_S) * 1e9:
            return
        self.shown = now
        line = f"{self.step}, {(now - self.started) // 1_000_000_000}s"
        self.out.write(f"\r\033[K{self._bar()}; {line}" if self.tty else line + "\n")
        self.out.flush()

    def _bar(self) -> str:
        filled = self.WIDTH * self.done // max(1, self.total)
        return f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.done}/{self.total} partitions"

    def report(self, rep: PartitionReport) -> None:
        with self.lock:
            self.done += 1
            self.step = None
            if self.tty:
                self.out.write("\r\033[K")
            self.out.write(rep.line() + "\n")
            if self.tty and self.done < self.total:
                self.out.write(self._bar())
            self.out.flush()
            self.shown = self.time.nanoseconds()

    @contextlib.contextmanager
    def ticking(self) -> Iterator[None]:
        """tick() every TICK_S from a daemon thread (it never keeps the process up) until the block ends."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(self.TICK_S):
                self.tick()

        thread = threading.Thread(target=run, name="kafkalog-maintenance-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _amount(done: int, total: int) -> str:
    """`17/40 MB`, `0.4/1.5 MB`: two byte counts in the larger's unit, with a decimal below 10 of it."""
    for unit, name in ((1 << 30, "GB"), (1 << 20, "MB"), (1 << 10, "kB")):
        if total >= unit:
            if total < 10 * unit:  # (rounded down, as the percentage is)
                return f"{done * 10 // unit / 10}/{total * 10 // unit / 10} {name}"
            return f"{done // unit}/{total // unit} {name}"
    return f"{done}/{total} bytes"


def run_once(
    root: str,
    *,
    topics: list[str] | None = None,
    now_ms: int | None = None,
    storage_options: dict | None = None,
    cleaner_settings: dict | None = None,
    out: TextIO | None = None,
    distribute: Distribute | None = None,
    fs=None,
    clock=None,
    distribute_writes=None,
) -> PassReports:
    """One pass over every table and partition (of `topics`, if given), then the root's duties. With
    `distribute`, the partitions are maintained by it (see Distribute) instead of here, one after another,
    and with `distribute_writes` the tables' data files are written by it (materializer.DistributeWrites).
    `clock` (ms) is what the object-store lease runs on: by default now_ms plus the time the pass has taken
    (tests give a clock of their own). cleaner_settings also takes transactional.id.expiration.ms, the pass's
    own: how long a writer may show no sign of life before its staging directories are removed."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else int(now_ms)
    cleaner_settings, expiration_ms = _split_settings(cleaner_settings)
    cc = CleanerConfig.from_dict(cleaner_settings)  # bad settings fail before any work
    lm = LogManager(root, storage_options, fs=fs)
    lease = None
    if not lm.fs.capabilities.locks:  # object store: one job per log dir, by a create-only lease
        lease_clock = clock if clock is not None else _clock_from(now)
        lease = MaintenanceLease(lm.fs, lm.root, ttl_ms=cc.lease_ttl_ms, clock=lease_clock).acquire()
    try:
        with lease.keep_alive() if lease is not None else contextlib.nullcontext():
            tables = table_passes(lm, topics, now, storage_options, out, distribute_writes)
            reports = _pass(lm, root, topics, now, storage_options, cleaner_settings, out, distribute, lease, fs)
        staging = _expire_staging(lm, now, expiration_ms, out)
    finally:
        if lease is not None:
            lease.release()
    if out is not None:
        failed = sum(1 for r in reports if r.errors)
        tables_line = ""
        if tables:
            tables_line = f", {len(tables)} table(s) ({sum(1 for t in tables if t.error)} failed)"
        out.write(
            f"maintenance pass: {len(reports)} partition(s), {failed} failed, "
            f"{sum(r.bytes_before - r.bytes_after for r in reports)} bytes freed{tables_line}\n"
        )
    return PassReports(reports, tables, staging)


def _split_settings(settings: dict | None) -> tuple[dict, int]:
    """The cleaner's settings, and transactional.id.expiration.ms (an int, at least 1, as Kafka's) taken out
    of them; an unknown key is an error naming every key the pass takes."""
    rest = dict(settings or {})
    raw = rest.pop(TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG, DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS)
    unknown = [k for k in rest if k not in CleanerConfig.SETTINGS]
    if unknown:
        known = ", ".join([*CleanerConfig.SETTINGS, TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG])
        raise InvalidConfigError(f"unknown cleaner setting {unknown[0]!r}; known: {known}")
    return rest, parse_option(TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG, raw, "int", at_least=1)


def _expire_staging(lm: LogManager, now: int, expiration_ms: int, out: TextIO | None) -> StagingExpiry | None:
    """The root duty that removes abandoned staging directories (staging_expiry.expire_staging), reported in
    lines of its own; a failure is reported, never raised (the next pass retries)."""
    try:
        staging = expire_staging(lm, now_ms=now, expiration_ms=expiration_ms)
    except Exception as e:  # noqa: BLE001 - a root duty: reported, retried by the next pass
        if out is not None:
            out.write(f"staging: {type(e).__name__}: {e}\n")
        return None
    if out is not None:
        for line in staging.lines():
            out.write(line + "\n")
    return staging


def table_passes(lm, topics, now, storage_options, out, distribute_writes=None) -> list[TableReport]:
    """One materialization pass per topic with a table config (table.mode append or upsert), in topic order.
    A failure is reported and the pass goes on; the log is never touched by one."""
    reports = []
    with lm.snapshot():
        names = topics if topics is not None else lm.topics()
        configs = [(t, TableConfig.of(t, lm.topic(t).config)) for t in names]
    for topic, cfg in configs:
        if cfg is None:
            continue
        try:
            require_pyiceberg(topic)
        except KafkaLogError as e:
            rep = TableReport(topic, cfg.display_name, cfg.mode, error=str(e))
        else:
            from .tables.materializer import materialize_topic  # pyiceberg: only where a table is configured

            rep = materialize_topic(
                lm, topic, storage_options=storage_options, now_ms=now, distribute=distribute_writes
            )
        reports.append(rep)
        if out is not None:
            out.write(rep.line() + "\n")
            out.flush()
    return reports


def _pass(
    lm, root, topics, now, storage_options, cleaner_settings, out, distribute, lease, fs
) -> list[PartitionReport]:
    with lm.snapshot():
        names = topics if topics is not None else lm.topics()
        tps = [tp for t in names for tp in lm.partitions(t)]
    progress = _Progress(out, len(tps)) if out is not None else None
    with progress.ticking() if progress else contextlib.nullcontext():
        if distribute is not None and tps:
            held = None if lease is None else (lease.holder, lease.generation, lease.expires_ms, lease.ttl_ms, now)
            if progress:  # (their tasks report nothing until they are done)
                progress.begin(f"{len(tps)} partition(s) under way in distributed tasks")
            reports = distribute(tps, (root, now, storage_options, cleaner_settings, held, fs))
            for rep in reports:
                if progress:
                    progress.report(rep)
        else:
            reports = []
            for rep in _maintain_each(lm, root, tps, now, storage_options, cleaner_settings, lease, fs, progress):
                reports.append(rep)
                if progress:
                    progress.report(rep)
    ok = [r for r in reports if not r.skipped and not any(e.startswith(("open", "reopen", "lease")) for e in r.errors)]
    recovery = {} if lease is not None else {(r.topic, r.partition): r.recovery_point for r in ok}
    lm.update_checkpoints(recovery, {(r.topic, r.partition): r.log_start_offset for r in ok})
    removed = lm.remove_deleted_topic_dirs(now_ms=now)
    if out is not None:
        for d in removed:
            out.write(f"removed deleted topic directory {d}\n")
    try:
        gone = expire_transaction_decisions(lm, now)
        if out is not None and gone:
            out.write(f"removed {len(gone)} finished transaction decision(s)\n")
    except Exception as e:  # noqa: BLE001 - a root duty: reported, retried by the next pass
        if out is not None:
            out.write(f"transaction decisions: {type(e).__name__}: {e}\n")
    return reports


def expire_transaction_decisions(lm: LogManager, now: int) -> list[str]:
    """Delete the sink's decision files that no partition needs any more: a commit once every partition it
    names holds that writer's marker after the transaction's first offset (or no longer holds its data), an
    abort once older than ABORT_DECISION_RETENTION_MS (an abort names no partitions; a writer never commits a
    transaction older than COMMIT_HORIZON_MS, so a deleted abort cannot let a late commit win). Returns them."""
    gone = []
    for d in list_decisions(lm.fs, lm.root):
        if d.outcome == ABORT:
            done = now - d.modified_ms > ABORT_DECISION_RETENTION_MS
        else:
            done = all(_marker_written(lm, TopicPartition(t, p), d.writer_id, first) for t, p, first in d.partitions)
        if done:
            delete_decision(lm.fs, d.path)
            gone.append(d.path)
    return gone


def _marker_written(lm: LogManager, tp: TopicPartition, writer_id: int, first: int) -> bool:
    """Whether the partition holds writer_id's marker after `first`, or no longer holds that data."""
    try:
        with lm.open_log(tp) as log:
            if first < log.log_start_offset:
                return True
            return find_marker(log, writer_id, first) is not None
    except UnknownTopicOrPartitionError:
        return True


def _clock_from(now_ms: int) -> Callable[[], int]:
    """A lease clock (ms): now_ms, plus the time since this call."""
    started = time.monotonic()
    return lambda: now_ms + int((time.monotonic() - started) * 1000)


def maintain_partitions(
    tps: list[tuple], root: str, now: int, storage_options, cleaner_settings, held=None, fs=None
) -> list[PartitionReport]:
    """One slice of a pass's partitions, run where `distribute` sends it (a Spark task): one LogManager
    snapshot for all of them. `held` is the driver's object-store lease, checked here, never taken."""
    lease = None
    lm = LogManager(root, storage_options, fs=fs)
    if held is not None:
        lease = attach_lease(lm.fs, lm.root, *held[:4])
        lease.clock = _clock_from(held[4])
    return list(
        _maintain_each(lm, root, [TopicPartition(*tp) for tp in tps], now, storage_options, cleaner_settings, lease, fs)
    )


def _maintain_each(
    lm, root, tps, now, storage_options, cleaner_settings, lease, fs, progress: _Progress | None = None
) -> Iterator[PartitionReport]:
    """maintain_partition for each partition in turn, all under one snapshot of the manager's listings."""
    with lm.snapshot():
        for tp in tps:
            if progress is not None:
                progress.begin(f"{tp}: under way")
            yield maintain_partition(
                root,
                tp,
                now_ms=now,
                storage_options=storage_options,
                cleaner_settings=cleaner_settings,
                lease=lease,
                fs=fs,
                lm=lm,
                progress=progress.compaction(tp) if progress is not None else None,
            )
