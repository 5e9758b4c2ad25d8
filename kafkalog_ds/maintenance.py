"""The maintenance job: the background work of Kafka's LogManager and LogCleaner, run on demand.

Per partition: retention (log start offset, retention.bytes, retention.ms), compaction when
cleanup.policy has `compact`, and removal of `.deleted` files past file.delete.delay.ms. Per root:
removal of deleted topics' `-delete` directories and the recovery-point and log-start-offset
checkpoints (the cleaner keeps cleaner-offset-checkpoint as it goes). Locks are taken only around
a delete or a swap, so the job runs beside live writers and readers.

On object stores (no locks) the job also merges small segments (storage/cleaner/segment_merger.py), every
rewrite is a create-only swap or an idempotent copy-and-delete, and one job per log dir runs at a
time, by a create-only lease (storage/objects/maintenance_lease.py).

    kafkalog maintain ROOT --once          one pass (cron, Airflow)
    kafkalog maintain ROOT                 a pass every log.retention.check.interval.ms
    python -m kafkalog_ds.maintenance ROOT [--fs k=v] [--spark [--master URL]]
                                           one pass (with --spark, partitions spread over executors)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from storage.cleaner.cleaner import CleanerConfig
from storage.cleaner.log_cleaner_manager import LogCleanerManager
from storage.cleaner.segment_merger import merge_small_segments
from storage.common.time import SYSTEM_TIME
from storage.errors import KafkaLogError, MaintenanceLeaseError, UnknownTopicOrPartitionError
from storage.fs.storage_options import storage_options_from_cli
from storage.log_manager import LogManager
from storage.log_retention import delete_old_segment_objects
from storage.objects.maintenance_lease import MaintenanceLease, attach_lease
from storage.segment_swap import complete_pending_swaps
from storage.topic_partition import TopicPartition

DEFAULT_CHECK_INTERVAL_MS = 300_000  # Kafka's log.retention.check.interval.ms
TASKS_PER_CORE = 4  # --spark: partitions go to this many tasks per core, each with one LogManager snapshot


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
    records_dropped: int = 0
    tombstones_dropped: int = 0
    segments_merged: int = 0  # segments the cleaner replaced, less the ones it wrote
    merged_groups: int = 0  # object stores: small segments merged, groups written
    merged_segments: int = 0  # ... and the segments they replaced
    swaps_completed: int = 0  # object stores: abandoned swaps of an earlier job completed
    files_removed: int = 0  # .deleted files past their delay
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    skipped: bool = False  # no partition directory yet: nothing to maintain

    def line(self) -> str:
        if self.skipped:
            return f"{self.topic}-{self.partition}: nothing to do (no data written yet)"
        what = [f"{self.bytes_before}->{self.bytes_after} bytes"]
        if self.segments_deleted:
            what.append(f"{self.segments_deleted} segment(s) deleted by retention")
        if self.cleaned:
            what.append(
                f"compacted: {self.keys_kept} keys kept, {self.records_dropped} records dropped "
                f"({self.tombstones_dropped} tombstones), {self.segments_merged} fewer segments"
            )
        if self.merged_groups:
            what.append(f"merged {self.merged_segments} small segments into {self.merged_groups}")
        if self.swaps_completed:
            what.append(f"{self.swaps_completed} interrupted swap(s) completed")
        if self.files_removed:
            what.append(f"{self.files_removed} .deleted file(s) removed")
        what.append(f"log start {self.log_start_offset}")
        status = "FAILED: " + "; ".join(self.errors) if self.errors else "ok"
        return f"{self.topic}-{self.partition}: {status}; " + ", ".join(what) + f" ({self.duration_s:.2f}s)"


def _record_cleaning(c, rep) -> None:
    """Copy a compaction's outcome into the partition's report."""
    if c.error:
        rep.errors.append(f"compaction: {c.error}")
    elif c.groups:
        rep.cleaned = True
        rep.keys_kept, rep.records_dropped, rep.tombstones_dropped = c.keys, c.records_dropped, c.tombstones_dropped
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
) -> PartitionReport:
    """Retention, compaction and delayed deletes for one partition (on object stores also the merge of
    small segments, under `lease`, the job's MaintenanceLease). Failures are reported, not raised, so one
    bad partition does not stop the others; the next pass retries it. A pass gives its LogManager (`lm`),
    inside its snapshot(), so that topic and checkpoint files are read once per pass, not per partition."""
    t0 = time.monotonic()
    now = SYSTEM_TIME.milliseconds() if now_ms is None else int(now_ms)
    rep = PartitionReport(tp.topic, tp.partition)
    lm = lm if lm is not None else LogManager(root, storage_options, fs=fs)
    if not lm.fs.capabilities.locks:
        try:
            _maintain_objects(lm, tp, rep, now, CleanerConfig.from_dict(cleaner_settings or {}), lease)
        except MaintenanceLeaseError as e:
            rep.errors.append(f"lease: {e}")
        rep.duration_s = time.monotonic() - t0
        return rep
    try:
        with lm.open_log(tp) as log:
            rep.bytes_before = rep.bytes_after = log.size
            compact = log.config.compact
    except UnknownTopicOrPartitionError:  # not written yet (or its topic was just deleted): nothing to do
        rep.skipped = True
        rep.duration_s = time.monotonic() - t0
        return rep
    except Exception as e:  # noqa: BLE001 - reported per partition
        rep.errors.append(f"open: {type(e).__name__}: {e}")
        rep.duration_s = time.monotonic() - t0
        return rep
    try:
        r = lm.apply_retention(tp, now_ms=now)
        rep.segments_deleted = r.segments_deleted
        if r.skipped:
            rep.errors.append(f"retention: {r.skipped}")
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"retention: {type(e).__name__}: {e}")
    if compact:
        c = LogCleanerManager(lm, CleanerConfig.from_dict(cleaner_settings or {})).clean_partition(tp, now)
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
    try:
        rep.files_removed = len(lm.remove_expired_deleted_files(tp, now_ms=now))
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"delayed deletes: {type(e).__name__}: {e}")
    try:
        r = delete_old_segment_objects(log, lambda lg: lm.update_checkpoints({}, {tp: lg.log_start_offset}), now_ms=now)
        rep.segments_deleted = r.segments_deleted
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"retention: {type(e).__name__}: {e}")
    finally:
        log.close()
    if meta.config.compact:
        c = LogCleanerManager(lm, cc, merge_min_age_ms=cc.merge_min_age_ms, check=lease.check).clean_partition(tp, now)
        if isinstance(c.exception, MaintenanceLeaseError):
            raise c.exception
        _record_cleaning(c, rep)
    try:
        with lm.open_log(tp) as log:
            m = merge_small_segments(log, now_ms=now, min_age_ms=cc.merge_min_age_ms, check=lease.check)
        rep.merged_groups = len(m.groups)
        rep.merged_segments = sum(len(g[1]) for g in m.groups)
    except MaintenanceLeaseError:
        raise
    except Exception as e:  # noqa: BLE001
        rep.errors.append(f"merge: {type(e).__name__}: {e}")
    _record_after(lm, tp, rep)


class _Progress:
    """A progress bar on a terminal, plain lines otherwise; one line per partition either way."""

    def __init__(self, out: TextIO, total: int):
        self.out, self.total, self.done = out, total, 0
        self.tty = hasattr(out, "isatty") and out.isatty()

    def report(self, rep: PartitionReport) -> None:
        self.done += 1
        if self.tty:
            self.out.write("\r\033[K")
        self.out.write(rep.line() + "\n")
        if self.tty and self.done < self.total:
            width = 30
            filled = width * self.done // max(1, self.total)
            self.out.write(f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} partitions")
        self.out.flush()


def run_once(
    root: str,
    *,
    topics: list[str] | None = None,
    now_ms: int | None = None,
    storage_options: dict | None = None,
    cleaner_settings: dict | None = None,
    out: TextIO | None = None,
    spark=None,
    fs=None,
    clock=None,
) -> list[PartitionReport]:
    """One pass over every partition (of `topics`, if given), then the root's duties. With `spark`,
    partitions are spread over its executors, one task each. `clock` (ms) is what the object-store
    lease runs on: by default now_ms plus the time the pass has taken (tests give a clock of their own)."""
    now = SYSTEM_TIME.milliseconds() if now_ms is None else int(now_ms)
    cc = CleanerConfig.from_dict(cleaner_settings or {})  # bad settings fail before any work
    lm = LogManager(root, storage_options, fs=fs)
    lease = None
    if not lm.fs.capabilities.locks:  # object store: one job per log dir, by a create-only lease
        if clock is None:
            started = time.monotonic()
            clock = lambda: now + int((time.monotonic() - started) * 1000)
        lease = MaintenanceLease(lm.fs, lm.root, ttl_ms=cc.lease_ttl_ms, clock=clock).acquire()
    try:
        with lease.keep_alive() if lease is not None else contextlib.nullcontext():
            reports = _pass(lm, root, topics, now, storage_options, cleaner_settings, out, spark, lease, fs)
    finally:
        if lease is not None:
            lease.release()
    if out is not None:
        failed = sum(1 for r in reports if r.errors)
        out.write(
            f"maintenance pass: {len(reports)} partition(s), {failed} failed, "
            f"{sum(r.bytes_before - r.bytes_after for r in reports)} bytes freed\n"
        )
    return reports


def _pass(lm, root, topics, now, storage_options, cleaner_settings, out, spark, lease, fs) -> list[PartitionReport]:
    with lm.snapshot():
        names = topics if topics is not None else lm.topics()
        tps = [tp for t in names for tp in lm.partitions(t)]
    progress = _Progress(out, len(tps)) if out is not None else None
    if spark is not None and tps:
        held = None if lease is None else (lease.holder, lease.generation, lease.expires_ms, lease.ttl_ms, now)
        args = (root, now, storage_options, cleaner_settings, held, fs)
        sc = spark.sparkContext
        slices = min(len(tps), max(1, sc.defaultParallelism) * TASKS_PER_CORE)
        rdd = sc.parallelize([tuple(tp) for tp in tps], slices)
        reports = rdd.mapPartitions(lambda part: _maintain_task(list(part), *args)).collect()
        for rep in reports:
            if progress:
                progress.report(rep)
    else:
        reports = []
        with lm.snapshot():
            for tp in tps:
                rep = maintain_partition(
                    root,
                    tp,
                    now_ms=now,
                    storage_options=storage_options,
                    cleaner_settings=cleaner_settings,
                    lease=lease,
                    fs=fs,
                    lm=lm,
                )
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
    return reports


def _maintain_task(
    tps: list[tuple], root: str, now: int, storage_options, cleaner_settings, held=None, fs=None
) -> list[PartitionReport]:
    """One Spark task: a slice of the partitions, one LogManager snapshot for all of them."""
    lease = None
    lm = LogManager(root, storage_options, fs=fs)
    if held is not None:  # the driver's lease, checked (not taken) by the task
        started = time.monotonic()
        lease = attach_lease(lm.fs, lm.root, *held[:4])
        lease.clock = lambda: held[4] + int((time.monotonic() - started) * 1000)
    with lm.snapshot():
        return [
            maintain_partition(
                root,
                TopicPartition(*tp),
                now_ms=now,
                storage_options=storage_options,
                cleaner_settings=cleaner_settings,
                lease=lease,
                fs=fs,
                lm=lm,
            )
            for tp in tps
        ]


def run_forever(
    root: str, *, interval_ms: int = DEFAULT_CHECK_INTERVAL_MS, out: TextIO | None = None, **kwargs
) -> None:
    """A pass every interval_ms (Kafka's log.retention.check.interval.ms), until interrupted.

    Ctrl-C (KeyboardInterrupt) ends the wait between passes at once, or the pass in progress: every
    step of a pass is crash-safe (a compaction swap is finished or discarded when the partition is next
    opened), so stopping one mid-way is no worse than a crash. The progress bar is cleared first, so
    the caller's last line stands alone."""
    try:
        while True:
            started = time.monotonic()
            run_once(root, out=out, **kwargs)
            time.sleep(max(0.0, interval_ms / 1000 - (time.monotonic() - started)))
    except KeyboardInterrupt:
        if out is not None and hasattr(out, "isatty") and out.isatty():
            out.write("\r\033[K")
            out.flush()
        raise


def main(argv: list[str] | None = None) -> int:
    """`python -m kafkalog_ds.maintenance ROOT --spark`: one pass as a Spark job (spark-submit works too)."""
    p = argparse.ArgumentParser(prog="python -m kafkalog_ds.maintenance", description=__doc__.splitlines()[0])
    p.add_argument("root", metavar="ROOT")
    p.add_argument("--topic", action="append")
    p.add_argument(
        "--once", action="store_true", help="one pass, then exit (the only mode here; as `kafkalog maintain`)"
    )
    p.add_argument("--spark", action="store_true", help="spread partitions over Spark executors")
    p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    p.add_argument(
        "--fs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option for ROOT, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable)",
    )
    p.add_argument(
        "--cleaner-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="log.cleaner.* settings, kafkalog.segment.merge.min.age.ms, kafkalog.maintenance.lease.ttl.ms",
    )
    args = p.parse_args(argv)
    settings = {}
    for pair in args.cleaner_config:
        key, sep, value = pair.partition("=")
        if not sep:
            p.error(f"--cleaner-config takes KEY=VALUE, got {pair!r}")
        settings[key.strip()] = value.strip()
    spark = None
    if args.spark:
        import os

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName("kafkalog-maintenance").master(args.master).getOrCreate()
    try:
        reports = run_once(
            args.root,
            topics=args.topic,
            out=sys.stdout,
            spark=spark,
            storage_options=storage_options_from_cli(args.fs),
            cleaner_settings=settings,
        )
    except KafkaLogError as e:  # e.g. another job holds an object store's maintenance lease
        print(f"kafkalog maintain: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()
    return 1 if any(r.errors for r in reports) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
