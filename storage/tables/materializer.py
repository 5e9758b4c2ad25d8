"""One materialization pass of one topic's table: the records committed since the table's offsets become rows,
in one Iceberg commit that also carries the new offsets.

The pass, and what a crash at each step leaves:
1. open: the catalog, the table (created on the first pass) and, with a JSON value format, the errors table;
   each checked to be this topic's (table_schema.check_table). The table's offsets are read from its
   snapshots (table_offsets); a pass that never committed left files naming its pass id, removed now.
2. plan: per partition [the table's next offset, the last stable offset): read_committed, so never a record
   of an aborted or open transaction. Offsets the log no longer holds (delete-records, a paused table) are
   recorded as a gap. ROOT's table state names the pass before any file is written; a later pass removes
   the files of one that never committed once it is ORPHAN_MIN_AGE_MS old (it may still be running).
3. write: data files (data_files.DataFileWriter), here or in Spark tasks (`distribute`). A crash leaves
   files no snapshot references: readers never see them.
4. commit: the errors table first, then the table, each one optimistic commit that pyiceberg makes only if the
   table's current snapshot is still the one the pass read (AssertRefSnapshotId). A pass that loses to
   another materializer deletes its files and commits nothing; when only an engine's own commit came
   between (no kafkalog offsets moved), an append is retried and an upsert re-plans its rewrites. A crash
   around the catalog's commit leaves the old snapshot or the new one; either way the offsets in the table
   say where the next pass starts, so no row is lost or written twice.
5. record: ROOT's table state (offsets, metadata location) is written after the commit; a crash before it
   leaves it behind the table, which only makes retention wait longer.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa

from ..common.time import SYSTEM_TIME
from ..errors import KafkaLogError, TableCatalogError, TableConflictError, TableError
from ..topic_partition import TopicPartition
from ..transactions.isolation import READ_COMMITTED
from .catalog import open_catalog
from .data_files import DataFileWriter, WriteContext, table_rows
from .table_config import TableConfig
from .table_offsets import PASS_ID, committed_offsets, summary_properties
from .table_report import TableReport
from .table_schema import (
    arrow_schema,
    check_table,
    errors_schema,
    partition_spec,
    sort_order,
    table_properties,
    table_schema,
)
from .table_state import ORPHAN_MIN_AGE_MS, TableState, read_state, update_state
from .upsert import latest_per_key, rewrite_files

#: An upsert pass holds the records of its range to find each key's latest: it takes at most this many
#: offsets per partition per round, and runs rounds (each its own commit) until it has caught up.
UPSERT_ROUND_OFFSETS = 2_000_000
COMMIT_ATTEMPTS = 4  # an engine's own commits between ours: retries before the pass gives up


@dataclass(frozen=True)
class PartitionRange:
    partition: int
    start: int
    end: int  # the partition's last stable offset when the pass planned


@dataclass
class WriteResult:
    """What writing a set of partition ranges produced (returned by Spark tasks too: picklable)."""

    data_files: list = field(default_factory=list)
    error_files: list = field(default_factory=list)
    paths: list = field(default_factory=list)  # every table file written, for an abort
    error_paths: list = field(default_factory=list)  # every errors table file written
    rows: int = 0
    error_rows: int = 0
    max_timestamps: dict = field(default_factory=dict)
    changed: bytes | None = None  # upsert: the (partition, key) identities touched, Arrow IPC


@dataclass
class WriteJob:
    """One task's share of a pass: partition ranges of one topic and what it needs to write them."""

    root: str
    storage_options: dict | None
    topic: str
    task: str
    ranges: list[PartitionRange]
    table: WriteContext
    errors: WriteContext | None
    error_floor: dict  # partition -> first offset the errors table does not hold yet
    mode: str
    value_schema: str


#: Runs a pass's write jobs elsewhere (kafkalog_ds.maintenance: Spark tasks) and returns their results.
DistributeWrites = Callable[[list[WriteJob]], list[WriteResult]]


def write_ranges(
    job: WriteJob, progress: Callable[[int, int], None] | None = None, *, lm=None, logs: dict | None = None
) -> WriteResult:
    """Read each range at read_committed and write its rows (append), or its latest rows per key (upsert).
    `lm`: the caller's LogManager of job.root (a Spark task makes its own); `logs`: partition -> a Log the
    caller opened already (its transaction state, a scan of the log, is then not made again)."""
    if lm is None:
        from ..log_manager import LogManager

        lm = LogManager(job.root, job.storage_options)
    value_schema = None
    if job.value_schema:
        from .value_schema import parse_value_schema

        value_schema = parse_value_schema(job.value_schema)
    # each attempt names its files apart (a Spark retry, or a speculative duplicate, must never overwrite or
    # delete the files of the attempt whose results the driver commits); all start with the pass id
    attempt = f"{job.task}-{uuid.uuid4().hex[:8]}"
    writer = DataFileWriter(job.table, attempt)
    err_writer = DataFileWriter(job.errors, attempt) if job.errors is not None else None
    out = WriteResult()
    pending: list[pa.RecordBatch] = []  # upsert: the rows of the ranges, to find each key's latest
    try:
        for r in job.ranges:
            if r.start >= r.end:
                continue
            floor = job.error_floor.get(r.partition, 0)
            given = (logs or {}).get(r.partition)
            opened = given if given is not None else lm.open_log(TopicPartition(job.topic, r.partition))
            with contextlib.nullcontext(opened) if given is not None else opened as log:
                for chunk in log.read_records(r.start, r.end, isolation_level=READ_COMMITTED):
                    rows, errors = table_rows(chunk, job.topic, r.partition, value_schema)
                    if rows.num_rows:
                        ts = chunk.column("timestamp").to_numpy()
                        out.max_timestamps[r.partition] = max(out.max_timestamps.get(r.partition, -1), int(ts.max()))
                    if job.mode == "upsert":
                        pending.append(rows)
                    else:
                        writer.write(rows)
                        out.rows += rows.num_rows
                    if errors is not None and err_writer is not None:
                        errors = errors.filter(pa.compute.greater_equal(errors.column("offset"), floor))
                        err_writer.write(errors)
                        out.error_rows += errors.num_rows
                    if progress is not None and chunk.num_rows:
                        progress(r.partition, int(chunk.column("offset")[-1].as_py()) + 1)
        if job.mode == "upsert":
            rows_table = pa.Table.from_batches(pending, schema=arrow_schema(_value_arrow(value_schema)))
            pending = []
            latest, changed = latest_per_key(rows_table)
            for batch in latest.to_batches():
                writer.write(batch)
            out.rows = latest.num_rows
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, changed.schema) as w:
                w.write_table(changed)
            out.changed = sink.getvalue().to_pybytes()
        out.data_files = writer.close()
        out.error_files = err_writer.close() if err_writer is not None else []
    except BaseException:
        writer.abort()
        if err_writer is not None:
            err_writer.abort()
        raise
    out.paths, out.error_paths = writer.paths, (err_writer.paths if err_writer is not None else [])
    return out


def _value_arrow(value_schema):
    return value_schema.arrow_schema() if value_schema is not None else None


class TableMaterializer:
    """Passes over one topic's table (see the module doc). `lm` is the topic's LogManager."""

    def __init__(
        self,
        lm,
        topic: str,
        *,
        storage_options: dict | None = None,
        now_ms: int | None = None,
        distribute: DistributeWrites | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        """`progress(offsets read, offsets to read)` is called as the pass reads (not from Spark tasks)."""
        self.lm, self.topic = lm, topic
        self.storage_options = storage_options
        self.now = SYSTEM_TIME.milliseconds() if now_ms is None else int(now_ms)
        self.distribute = distribute
        self.progress = progress
        self._logs: dict = {}  # partition -> its Log, opened by the plan of the round under way
        meta = lm.topic(topic)
        self.topic_id = meta.topic_id
        self.partitions = meta.partitions
        cfg = TableConfig.of(topic, meta.config)
        if cfg is None:
            raise TableError(f"topic '{topic}' has no table: set table.mode=append or upsert (docs/tables.md)")
        self.cfg = cfg
        value_fields = None
        if cfg.value_schema:
            from .value_schema import parse_value_schema

            value_fields = parse_value_schema(cfg.value_schema).arrow_schema()
        self.schema = table_schema(value_fields)

    # ------------------------------------------------------------------ the pass
    def run(self) -> TableReport:
        """One pass (rounds of one, for upsert, until caught up); failures are reported, not raised."""
        t0 = time.monotonic()
        rep = TableReport(self.topic, self.cfg.display_name, self.cfg.mode)
        try:
            self._run(rep)
        except KafkaLogError as e:
            rep.error = " ".join(str(e).split())
        except Exception as e:  # noqa: BLE001 - a catalog or file system failure: one line, the log untouched
            rep.error = f"{type(e).__name__}: {' '.join(str(e).split())}"
        finally:
            self._close_logs()
        rep.duration_s = time.monotonic() - t0
        return rep

    def _run(self, rep: TableReport) -> None:
        state = read_state(self.lm.fs, self.lm.root, self.topic)
        if state is not None:
            changed = self.cfg.differences(state.shape)
            if changed:
                raise TableError(
                    f"topic '{self.topic}': its table configs changed since its table {state.table} was made "
                    f"({'; '.join(changed)}); set them back, or `kafkalog table ROOT --topic {self.topic} --forget`"
                )
        catalog = open_catalog(self.lm, self.cfg, self.storage_options)
        table = self._table(catalog, self.cfg.identifier, self.schema, "table", state)
        errors = None
        if self.cfg.errors_identifier is not None:
            errors = self._table(catalog, self.cfg.errors_identifier, errors_schema(), "errors", None)
        rep.metadata_location = table.metadata_location
        if state is None:
            state = TableState(
                self.topic,
                self.topic_id,
                self.cfg.display_name,
                self.cfg.catalog,
                str(table.metadata.table_uuid),
                self.cfg.shape(),
                table.metadata_location,
            )
        dead = [pid for pid, began in state.pending.items() if self.now - began >= ORPHAN_MIN_AGE_MS]
        for pid in dead:  # passes that began long ago and never committed, or did and were not cleaned after
            rep.orphans_removed += self._remove_orphans(pid, [t for t in (table, errors) if t is not None])
            state = update_state(self.lm.fs, self.lm.root, state, lambda s, pid=pid: s.ended(pid))
        while True:
            more = self._round(rep, table, errors, state)
            if not more:
                break
            table = _catalog_call(self.cfg, "load the table", lambda: catalog.load_table(self.cfg.identifier))
            if errors is not None:
                errors = _catalog_call(
                    self.cfg, "load the errors table", lambda: catalog.load_table(self.cfg.errors_identifier)
                )

    def _round(self, rep: TableReport, table, errors, state: TableState) -> bool:
        """Plan, write and commit one round; True when an upsert round left more to read."""
        base = committed_offsets(table)
        err_base = committed_offsets(errors) if errors is not None else None
        ranges, gaps, log_ends = self._plan(base.next_offsets)
        if self.cfg.mode == "upsert":
            ranges = [PartitionRange(r.partition, r.start, min(r.end, r.start + UPSERT_ROUND_OFFSETS)) for r in ranges]
        more = any(r.end < log_ends[r.partition][1] for r in ranges) and self.cfg.mode == "upsert"
        next_offsets = {r.partition: r.end for r in ranges}
        if all(r.start >= r.end for r in ranges) and not gaps:
            rep.offsets_behind = sum(max(0, log_ends[p][0] - o) for p, o in next_offsets.items())
            # nothing new: the state catches up with the table (a crash after a commit may have left it behind)
            update_state(
                self.lm.fs,
                self.lm.root,
                state,
                lambda s: s.ended("", next_offsets=base.next_offsets or {}, metadata_location=table.metadata_location),
            )
            return False
        pass_id = uuid.uuid4().hex
        update_state(self.lm.fs, self.lm.root, state, lambda s: s.begun(pass_id, self.now))  # before any file
        floor = {}
        if err_base is not None:
            floor = {p: max(o, (err_base.next_offsets or {}).get(p, 0)) for p, o in (base.next_offsets or {}).items()}
        job = WriteJob(
            _root_spec(self.lm),
            self.storage_options,
            self.topic,
            "t0",
            [r for r in ranges if r.start < r.end],
            WriteContext.of(table, pass_id),
            WriteContext.of(errors, pass_id) if errors is not None else None,
            floor,
            self.cfg.mode,
            self.cfg.value_schema,
        )
        results = self._write(job, self._tracker(job.ranges))
        # A commit that raises may still have landed (the catalog did it, its answer was lost): its files are
        # left for the next pass, which removes them only if no snapshot names this pass (state.pending).
        committed, errors_committed = self._commit(
            rep, table, errors, base, err_base, next_offsets, gaps, pass_id, results
        )
        if committed is None:  # refused: another materializer's commit came first, so these files are ours alone
            _delete_files(table.io, [p for r in results for p in r.paths])
            if not errors_committed:
                _delete_files(table.io, [p for r in results for p in r.error_paths])
            update_state(self.lm.fs, self.lm.root, state, lambda s: s.ended(pass_id))
            return False
        if self.distribute is not None:  # failed task attempts wrote files no snapshot holds
            rep.orphans_removed += self._remove_orphans(pass_id, [t for t in (committed, errors) if t is not None])
        max_ts: dict[int, int] = {}
        for r in results:
            for p, t in r.max_timestamps.items():
                max_ts[p] = max(max_ts.get(p, -1), t)
        update_state(
            self.lm.fs,
            self.lm.root,
            state,
            lambda s: s.ended(
                pass_id,
                metadata_location=committed.metadata_location,
                table_uuid=str(committed.metadata.table_uuid),
                next_offsets=next_offsets,
                max_timestamps=max_ts,
                committed_at_ms=self.now,
                gaps=tuple(s.gaps) + tuple(gaps),
            ),
        )
        rep.committed = True
        rep.metadata_location = committed.metadata_location
        rep.gaps += gaps
        rep.offsets_behind = sum(max(0, log_ends[p][0] - o) for p, o in next_offsets.items())
        return more

    def _plan(self, committed: dict[int, int] | None):
        """(ranges, gaps, {partition: (log end, last stable offset)}) from the table's offsets (None: new table).
        The partitions' Logs stay open in self._logs for a local write: their transaction state (a scan of
        the log where no producer snapshot is near its end) serves the read too."""
        ranges, gaps, ends = [], [], {}
        self._close_logs()
        with self.lm.snapshot():
            for p in range(self.partitions):
                log = self._logs[p] = self.lm.open_log(TopicPartition(self.topic, p))
                start_of_log, lso, end = log.log_start_offset, log.last_stable_offset, log.log_end_offset
                start = start_of_log if committed is None or p not in committed else committed[p]
                if start < start_of_log:
                    gaps.append((p, start, start_of_log))
                    start = start_of_log
                ranges.append(PartitionRange(p, start, max(start, lso)))
                ends[p] = (end, lso)
        return ranges, gaps, ends

    def _close_logs(self) -> None:
        for log in self._logs.values():
            log.close()
        self._logs = {}

    def _tracker(self, ranges: list[PartitionRange]):
        """The write's progress as (offsets read, offsets to read) for `self.progress`, or None."""
        if self.progress is None:
            return None
        report = self.progress
        total = sum(r.end - r.start for r in ranges)
        starts = {r.partition: r.start for r in ranges}
        reached = dict(starts)
        report(0, total)

        def advance(partition: int, offset: int) -> None:
            reached[partition] = offset
            report(sum(reached[p] - starts[p] for p in reached), total)

        return advance

    def _write(self, job: WriteJob, progress=None) -> list[WriteResult]:
        """The job's ranges written: by `distribute` (a Spark task per partition), else here, a thread per
        partition up to the cores (pyarrow's Parquet writer, most of a pass's work, runs without the GIL)."""
        if len(job.ranges) <= 1 and self.distribute is None:
            return [write_ranges(job, progress, lm=self.lm, logs=self._logs)]
        jobs = [
            WriteJob(
                job.root,
                job.storage_options,
                job.topic,
                f"p{r.partition}",
                [r],
                job.table,
                job.errors,
                job.error_floor,
                job.mode,
                job.value_schema,
            )
            for r in job.ranges
        ]
        if self.distribute is not None:
            return self.distribute(jobs)
        if self.lm.fs.protocol == "memory":  # one process's store: tasks share this LogManager's filesystem
            return [write_ranges(job, progress, lm=self.lm)]
        workers = min(len(jobs), os.cpu_count() or 1)
        results: list[WriteResult] = []
        failure: BaseException | None = None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kafkalog-table") as pool:
            futures = [pool.submit(write_ranges, j, progress, logs=self._logs) for j in jobs]
            for fut in futures:
                try:
                    results.append(fut.result())
                except BaseException as e:  # noqa: BLE001 - the first failure is raised once all are done
                    failure = failure or e
        if failure is not None:  # the failed job removed its own files; the others' are in no commit either
            for r in results:
                _delete_files(job.table.io, r.paths + r.error_paths)
            raise failure
        return results

    def _commit(self, rep, table, errors, base, err_base, next_offsets, gaps, pass_id, results):
        """The errors table's commit, then the table's: (the table as committed, or None when another
        materializer committed first; whether the errors table's commit was made)."""
        props = summary_properties(next_offsets, pass_id, gaps)
        errors_made = False
        error_files = [f for r in results for f in r.error_files]
        if errors is not None and error_files:
            if _commit_with_retries(self.cfg, errors, err_base, error_files, [], props) is None:
                rep.note = "another materializer committed first: nothing committed by this pass"
                return None, False
            errors_made = True
            rep.error_rows = sum(r.error_rows for r in results)
        data_files = [f for r in results for f in r.data_files]
        if self.cfg.mode == "upsert":
            changed = pa.concat_tables(
                [pa.ipc.open_stream(r.changed).read_all() for r in results if r.changed is not None]
                or [pa.table({"partition": pa.array([], pa.int32()), "key": pa.array([], pa.binary())})]
            )

            def rewrites(current):
                writer = DataFileWriter(WriteContext.of(current, pass_id), "r")
                try:
                    doomed, dropped = rewrite_files(current, changed, writer)
                    return doomed, writer.close(), dropped
                except BaseException:
                    writer.abort()
                    raise

            committed = _commit_with_retries(self.cfg, table, base, data_files, [], props, rewrites=rewrites, rep=rep)
        else:
            committed = _commit_with_retries(self.cfg, table, base, data_files, [], props, rep=rep)
        if committed is None:
            rep.note = "another materializer committed first: nothing committed by this pass"
            return None, errors_made
        rep.rows += sum(r.rows for r in results)
        rep.files_added += len(data_files)
        return committed, errors_made

    # ------------------------------------------------------------------ tables
    def _table(self, catalog, identifier, schema, role: str, state: TableState | None):
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

        name = ".".join(identifier)
        try:
            table = _catalog_call(self.cfg, f"load table {name}", lambda: catalog.load_table(identifier))
        except NoSuchTableError:
            if state is not None and role == "table":
                raise TableConflictError(
                    f"table {name} of topic '{self.topic}' was dropped from {self.cfg.catalog_display} (it held "
                    f"offsets {_offsets_text(state.next_offsets)}); `kafkalog table ROOT --topic {self.topic} "
                    f"--forget`, then a pass makes a new table from the log start"
                ) from None
            try:
                _catalog_call(self.cfg, "create the namespace", lambda: catalog.create_namespace(identifier[:-1]))
            except NamespaceAlreadyExistsError:
                pass
            spec = partition_spec(schema, self.cfg.partition_by) if role == "table" else None
            kwargs = {"partition_spec": spec, "sort_order": sort_order(schema)} if spec is not None else {}
            try:
                table = _catalog_call(
                    self.cfg,
                    f"create table {name}",
                    lambda: catalog.create_table(
                        identifier, schema=schema, properties=table_properties(self.cfg, self.topic_id, role), **kwargs
                    ),
                )
            except TableAlreadyExistsError:  # another pass made it first
                table = _catalog_call(self.cfg, f"load table {name}", lambda: catalog.load_table(identifier))
        check_table(table, self.cfg, self.topic_id, role, schema)
        if state is not None and role == "table" and state.table_uuid != str(table.metadata.table_uuid):
            raise TableConflictError(
                f"table {name} of topic '{self.topic}' was dropped and made again by someone else (its uuid is "
                f"{table.metadata.table_uuid}, kafkalog's was {state.table_uuid}); `kafkalog table ROOT --topic "
                f"{self.topic} --forget` to write to the new one from the log start"
            )
        return table

    def _remove_orphans(self, pass_id: str, tables) -> int:
        """Remove the files named by a pass (`<pass id>-...`) that no snapshot of their table holds: all of
        them for a pass that never committed there, the failed task attempts' for one that did. Returns
        how many went."""
        import fsspec

        n = 0
        for t in tables:
            keep = _files_added_by(t, pass_id)
            so = self.storage_options if self.lm.fs.protocol not in ("file", "memory") else None
            fs, path = fsspec.core.url_to_fs(t.metadata.location, **(so or {}))
            for f in fs.glob(f"{path.rstrip('/')}/data/**/{pass_id}-*.parquet"):
                if f.rsplit("/", 1)[-1] not in keep:
                    fs.rm(f)
                    n += 1
        return n


def _files_added_by(table, pass_id: str) -> set[str]:
    """Base names of the data files the snapshot made by `pass_id` added (empty when it made none)."""
    from pyiceberg.manifest import ManifestEntryStatus

    for s in table.metadata.snapshots:
        if s.summary is not None and s.summary.additional_properties.get(PASS_ID) == pass_id:
            names = set()
            for m in s.manifests(table.io):
                if m.added_snapshot_id != s.snapshot_id:
                    continue
                for e in m.fetch_manifest_entry(table.io, discard_deleted=True):
                    if e.status == ManifestEntryStatus.ADDED:
                        names.add(e.data_file.file_path.rsplit("/", 1)[-1])
            return names
    return set()


def _root_spec(lm) -> str:
    """The ROOT string a task's LogManager opens (several log dirs joined as log.dirs)."""
    return ",".join(lm.fs.url(d) for d in lm.log_dirs) if len(lm.log_dirs) > 1 else lm.fs.url(lm.root)


def _offsets_text(offsets: dict[int, int]) -> str:
    return ", ".join(f"partition {p}: {o}" for p, o in sorted(offsets.items())) or "none"


def _delete_files(io, paths) -> None:
    for p in paths:
        try:
            io.delete(p)
        except Exception:  # noqa: BLE001, S110 - gone already; a leftover is an orphan, removed later
            pass


def _catalog_call(cfg: TableConfig, what: str, fn):
    """fn(), with a failure to reach the catalog as one TableCatalogError line (pyiceberg's own exceptions,
    such as NoSuchTableError or CommitFailedException, pass through)."""
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError

    try:
        return fn()
    except (NoSuchTableError, TableAlreadyExistsError, CommitFailedException, KafkaLogError):
        raise
    except Exception as e:  # noqa: BLE001
        if type(e).__module__.startswith("pyiceberg.exceptions") and type(e).__name__ == "NamespaceAlreadyExistsError":
            raise
        raise TableCatalogError(
            f"topic '{cfg.topic}': {cfg.catalog_display} failed to {what}: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}"
        ) from e


def _commit_with_retries(cfg, table, base, added, deleted, props, *, rewrites=None, rep=None):
    """One optimistic commit of `added` data files (and, for upsert, the rewrites planned on the table it
    commits to). On a conflict the table is reloaded: if kafkalog's offsets moved, another materializer
    committed and None is returned; otherwise the commit is retried on the new snapshot."""
    from pyiceberg.exceptions import CommitFailedException

    current = table
    for _attempt in range(COMMIT_ATTEMPTS):
        doomed, rewritten, dropped = rewrites(current) if rewrites is not None else ([], [], 0)
        try:
            tx = current.transaction()
            producer = tx.update_snapshot(snapshot_properties=props)
            op = producer.overwrite() if doomed else producer.fast_append()
            with op as snap:
                for f in doomed:
                    snap.delete_data_file(f)
                for f in [*added, *rewritten]:
                    snap.append_data_file(f)
            _catalog_call(cfg, f"commit to table {'.'.join(current.name())}", tx.commit_transaction)
        except CommitFailedException:  # refused: the rewritten files are in no snapshot
            _delete_files(current.io, [f.file_path for f in rewritten])
            current = _catalog_call(cfg, "reload the table", current.refresh)
            now = committed_offsets(current)
            if now.next_offsets != base.next_offsets:
                return None
            continue
        if rep is not None:
            rep.rows_deleted += dropped
            rep.files_removed += len(doomed)
            rep.files_added += len(rewritten)
        return _catalog_call(cfg, "reload the table", current.refresh)
    raise TableConflictError(
        f"table {'.'.join(table.name())} of topic '{cfg.topic}' kept changing under the pass ({COMMIT_ATTEMPTS} "
        f"commits refused); nothing was committed"
    )


def materialize_topic(lm, topic: str, **kwargs) -> TableReport:
    """One pass over one topic's table (TableMaterializer(...).run()); a bad config is reported too."""
    try:
        m = TableMaterializer(lm, topic, **kwargs)
    except KafkaLogError as e:
        return TableReport(topic, error=" ".join(str(e).split()))
    return m.run()


__all__ = ["TableMaterializer", "TableReport", "materialize_topic", "write_ranges", "TableCatalogError"]
