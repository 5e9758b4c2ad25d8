"""Topics as Iceberg tables (docs/tables.md): what a materialization pass costs and what the table buys readers.

Run:  python benchmarks/table.py [--rows N] [--rounds R] [--quick]
      (with pyspark 4.1 installed, for the Spark scan of the table through Iceberg's Spark runtime, which
      exists for Spark 4.1 only; on another pyspark that case says so and the rest runs)
One process, one SparkSession (local[2]; spark.jars = Iceberg's runtime from tools/iceberg/jars.py on pyspark
4.1). The input is vs_kafka.py's case 1 set: N records (default 4M) with a 16-byte key and a 100-byte value,
uncompressed, in 2 partitions, written here by the engine (timestamps 1 ms apart). Figures are the best of R
rounds after a warm-up round, the two sides of each ratio interleaved (the order reversed every other
round), with the CPU every other process took meanwhile ("others"; rerun when it is not near 0).

1 materialization: one `kafkalog table` pass (storage/tables/materializer.py, one process) of the whole
  topic into a new table, rows/s, beside `spark.read.format("kafkalog")` read_committed into Spark's noop sink
  on the same topic (goal: at least its rows/s). Floors in the same run: the engine's read_committed decode
  alone (read_records into nothing) and a pyarrow Parquet write of the same rows alone: a pass is both.
2 Spark scan: `spark.read.format("iceberg")` of the table's metadata.json into noop, the columns of kafkalog's
  default schema, beside `spark.read.format("kafkalog")` into noop (goal: at least 3x the rows/s); the same
  with headers on both sides (a list<struct> column turns Iceberg's vectorized Parquet read off); and the
  ceiling, Spark's own Parquet reader on the table's data files.
3 pruning: a topic spanning 10 days (--rows/10 records) in a day-partitioned table; how many data files
  pyiceberg's scan planning keeps for a one-day timestamp range, against all (goal: at most 1/5).
4 DuckDB (iceberg_scan of the metadata.json): count(*) and a group-by (rows and max offset per partition and
  day), timed.
5 upsert: a compacted topic of K keys (default 1M; --rows/4 with --quick) in an upsert table; then 10% of the
  keys change (1 in 10 of them deleted by a tombstone) and one pass runs: its time, split into the
  copy-on-write parts (finding the files that hold a changed key, rewriting them) and the rest. The
  rewrite's share is the most a merge-on-read design (equality deletes) could save per pass; pyiceberg
  cannot read equality deletes at all (its scan raises), which is why the tables are copy-on-write.
6 freshness: a writer appends B records per partition every 500 ms in a thread while a maintenance loop runs
  P passes, one every 2 s (storage.log_maintenance.run_once); after each pass the table's lag: offsets and
  time behind the log end (`describe`'s figures).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from sink import machine_busy_seconds, own_cpu_seconds, tree_cpu_seconds  # noqa: E402
from source import chunk  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from storage.records.builder import build_records  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402

PARTITIONS = 2
CHUNK = 250_000
DAY = 86_400_000


class Timer:
    """Wall s, this process tree's CPU s (the driver, Spark's JVM and workers) and other processes' CPU s."""

    def __init__(self, jvm_pid: int | None):
        self.jvm = jvm_pid

    def __call__(self, fn):
        cpu0 = own_cpu_seconds() + (tree_cpu_seconds(self.jvm) if self.jvm else 0.0)
        busy0 = machine_busy_seconds()
        t = time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t
        cpu = own_cpu_seconds() + (tree_cpu_seconds(self.jvm) if self.jvm else 0.0) - cpu0
        return wall, cpu, max(0.0, machine_busy_seconds() - busy0 - cpu), out


def write_topic(lm: LogManager, topic: str, rows: int, config: dict, *, spread_ms: int = 1) -> None:
    lm.create_topic(topic, PARTITIONS, config)
    per = rows // PARTITIONS
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition(topic, p), writable=True) as log:
            for lo in range(0, per, CHUNK):
                t = chunk(p * per + lo, p * per + min(per, lo + CHUNK))
                if spread_ms != 1:
                    ts = 1_700_000_000_000 + (np.arange(lo, lo + t.num_rows, dtype=np.int64) * spread_ms)
                    t = t.set_column(2, "timestamp", pa.array(ts))
                log.append(build_records(t))


def fresh_table(lm: LogManager, topic: str) -> None:
    """Forget the topic's table and drop it, so that the next pass materializes the whole topic again."""
    from storage.tables.catalog import open_catalog
    from storage.tables.table_config import TableConfig
    from storage.tables.table_state import forget_state

    cfg = TableConfig.of(topic, lm.topic(topic).config)
    assert cfg is not None
    catalog = open_catalog(lm, cfg)
    if catalog.table_exists(cfg.identifier):
        catalog.purge_table(cfg.identifier)
    forget_state(lm.fs, lm.root, topic)


def best_of(results: list) -> tuple:
    return min(results, key=lambda r: r[0])


def fmt(name: str, rows: int, run) -> str:
    wall, cpu, others = run[:3]
    return f"  {name:44} {rows / wall:>12,.0f} rows/s  ({wall:6.2f} s, cpu {cpu:6.2f} s, others {others:5.2f} s)"


def spark_session(with_iceberg: bool):
    from kafkalog_ds.local_spark import session  # Spark's console kept to errors

    conf = {"spark.sql.session.timeZone": "UTC"}
    if with_iceberg:
        from tools.iceberg import jars

        conf["spark.jars"] = ",".join(jars.spark_runtime_jars())
    return session("kafkalog-table-bench", conf=conf, prog="benchmarks/table.py")


def case_materialize_and_scan(spark, iceberg_ok: bool, lm, root: str, rows: int, rounds: int) -> None:
    from storage.tables.materializer import materialize_topic
    from storage.transactions.isolation import READ_COMMITTED

    jvm = spark.sparkContext._gateway.proc.pid
    timer = Timer(jvm)
    kl = lambda: (  # noqa: E731
        spark.read.format("kafkalog")
        .option("subscribe", "bench")
        .option("kafka.isolation.level", "read_committed")
        .load(root)
        .write.format("noop")
        .mode("overwrite")
        .save()
    )

    def materialize():
        fresh_table(lm, "bench")
        rep = materialize_topic(lm, "bench")
        assert rep.error is None and rep.rows == rows, rep.line()
        return rep

    def decode_only():
        n = 0
        for p in range(PARTITIONS):
            with lm.open_log(TopicPartition("bench", p)) as log:
                for b in log.read_records(log.log_start_offset, isolation_level=READ_COMMITTED):
                    n += b.num_rows
        assert n == rows

    from storage.tables.data_files import table_rows

    sample = []
    with lm.open_log(TopicPartition("bench", 0)) as log:
        for b in log.read_records(0, isolation_level=READ_COMMITTED):
            sample.append(table_rows(b, "bench", 0)[0])
    parquet_rows = pa.Table.from_batches(sample * PARTITIONS)
    tmp_pq = os.path.join(os.path.dirname(root), "floor.parquet")

    def parquet_only():
        pq.write_table(parquet_rows, tmp_pq, compression="zstd")

    runs: dict[str, list] = {"mat": [], "kl": [], "dec": [], "pqw": []}
    metadata = None
    for rnd in range(rounds + 1):
        order = [("mat", materialize), ("kl", kl), ("dec", decode_only), ("pqw", parquet_only)]
        if rnd % 2:
            order.reverse()
        for name, fn in order:
            run = timer(fn)
            if name == "mat":
                metadata = run[3].metadata_location
            if rnd:
                runs[name].append(run)
        if iceberg_ok and metadata:
            scans = iceberg_scans(spark, root, metadata)
            for name, fn in scans:
                run = timer(fn)
                if rnd:
                    runs.setdefault(name, []).append(run)
    mat, klr, dec, pqw = (best_of(runs[k]) for k in ("mat", "kl", "dec", "pqw"))
    print(f"\n1 materialization of {rows:,} records ({PARTITIONS} partitions, uncompressed), best of {rounds}:")
    for name, run in (
        ("kafkalog table pass (one process)", mat),
        ('spark.read.format("kafkalog") -> noop', klr),
        ("floor: engine read_committed decode alone", dec),
        ("floor: pyarrow parquet write (zstd) alone", pqw),
    ):
        print(fmt(name, rows, run))
    print(
        f"  ratio pass / spark.read kafkalog: {klr[0] / mat[0]:.2f}x rows/s (goal >= 1); "
        f"pass / (decode + parquet write): {(dec[0] + pqw[0]) / mat[0]:.2f}x"
    )
    print(f"\n2 Spark scan of the table, best of {rounds}:")
    if "ice" not in runs:
        print("  skipped: Iceberg's Spark runtime exists for Spark 4.1 only; run with pyspark 4.1 for this case")
        return
    ice, ice_all, klh, pqr = (best_of(runs[k]) for k in ("ice", "ice_all", "kl_headers", "pq_read"))
    for name, run in (
        ("iceberg, kafkalog's default columns -> noop", ice),
        ('spark.read.format("kafkalog") -> noop', klr),
        ("iceberg, all columns (headers too) -> noop", ice_all),
        ("kafkalog, includeHeaders=true -> noop", klh),
        ("floor: spark.read.parquet of its data files", pqr),
    ):
        print(fmt(name, rows, run))
    print(
        f"  ratio table scan / kafkalog read: {klr[0] / ice[0]:.2f}x rows/s (goal >= 3), with headers "
        f"{klh[0] / ice_all[0]:.2f}x; Spark's own Parquet read of the same files / kafkalog read: "
        f"{klr[0] / pqr[0]:.2f}x (the most an Iceberg scan can reach)"
    )


def iceberg_scans(spark, root: str, metadata: str) -> list:
    """Case 2's readers, each into noop: the table through Iceberg's Spark runtime (kafkalog's default columns,
    and all of them), kafkalog with headers, and Spark's plain Parquet reader on the table's data files."""
    from pyiceberg.table import StaticTable

    noop = lambda df: df.write.format("noop").mode("overwrite").save()  # noqa: E731
    default = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    files = [t.file.file_path for t in StaticTable.from_metadata(metadata).scan().plan_files()]
    kl = spark.read.format("kafkalog").option("subscribe", "bench").option("kafka.isolation.level", "read_committed")
    return [
        ("ice", lambda: noop(spark.read.format("iceberg").load(metadata).select(*default))),
        ("ice_all", lambda: noop(spark.read.format("iceberg").load(metadata))),
        ("kl_headers", lambda: noop(kl.option("includeHeaders", "true").load(root))),
        ("pq_read", lambda: noop(spark.read.parquet(*files).select(*default))),
    ]


def case_pruning(lm, rows: int) -> None:
    from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

    from storage.tables.materializer import materialize_topic

    n = max(20_000, rows // 10)
    spread = max(1, (10 * DAY) // (n // PARTITIONS))
    write_topic(lm, "days", n, {"table.mode": "append"}, spread_ms=spread)
    rep = materialize_topic(lm, "days")
    assert rep.error is None, rep.line()
    from pyiceberg.table import StaticTable

    t = StaticTable.from_metadata(rep.metadata_location)
    all_files = len(list(t.scan().plan_files()))
    lo = (1_700_000_000_000 // DAY + 3) * DAY  # a whole UTC day: one partition value
    day = And(GreaterThanOrEqual("timestamp", lo * 1000), LessThan("timestamp", (lo + DAY) * 1000))
    t0 = time.perf_counter()
    one = len(list(t.scan(row_filter=day).plan_files()))
    plan_s = time.perf_counter() - t0
    rows_day = t.scan(row_filter=day).to_arrow().num_rows
    print(f"\n3 pruning: {n:,} records over 10 days, day-partitioned table:")
    print(
        f"  a one-day range plans {one} of {all_files} data files ({one / all_files:.2f}; goal <= 0.20), "
        f"{rows_day:,} rows, planned in {plan_s * 1000:.0f} ms"
    )


def case_duckdb(metadata: str, rows: int, rounds: int) -> None:
    from storage.tables.readers import duckdb_connection

    con = duckdb_connection()
    count = f"SELECT count(*) FROM iceberg_scan('{metadata}')"
    group = (
        f'SELECT "partition", date_trunc(\'day\', "timestamp") AS day, count(*), max("offset") '
        f"FROM iceberg_scan('{metadata}') GROUP BY 1, 2 ORDER BY 1, 2"
    )
    timer = Timer(None)
    res = {}
    for name, q in (("count(*)", count), ("group by partition, day", group)):
        runs = [timer(lambda q=q: con.execute(q).fetchall()) for _ in range(rounds + 1)][1:]
        res[name] = best_of(runs)
    assert res["count(*)"][3][0][0] == rows
    print(f"\n4 DuckDB {__import__('duckdb').__version__} on the {rows:,}-row table, best of {rounds}:")
    for name, run in res.items():
        print(f"  {name:28} {run[0] * 1000:8.0f} ms (cpu {run[1]:.2f} s, others {run[2]:.2f} s)")


def case_upsert(lm, keys: int) -> None:
    from storage.tables import upsert
    from storage.tables.materializer import materialize_topic

    lm.create_topic("kv", PARTITIONS, {"table.mode": "upsert", "cleanup.policy": "compact"})
    rng = np.random.default_rng(7)
    per = keys // PARTITIONS

    def put(p: int, ids: np.ndarray, tomb: np.ndarray | None = None) -> None:
        keys_b = [b"key-%010d" % i for i in ids]
        values = [None if tomb is not None and tomb[j] else b"v" * 100 for j in range(len(ids))]
        with lm.open_log(TopicPartition("kv", p), writable=True) as log:
            for lo in range(0, len(ids), CHUNK):
                t = pa.table(
                    {
                        "key": pa.array(keys_b[lo : lo + CHUNK], pa.binary()),
                        "value": pa.array(values[lo : lo + CHUNK], pa.binary()),
                        "timestamp": pa.array(np.full(min(CHUNK, len(ids) - lo), 1_700_000_000_000, np.int64)),
                    }
                )
                log.append(build_records(t))

    for p in range(PARTITIONS):
        put(p, np.arange(p * per, (p + 1) * per))
    first = Timer(None)(lambda: materialize_topic(lm, "kv"))
    assert first[3].error is None, first[3].line()
    for p in range(PARTITIONS):
        changed = rng.choice(np.arange(p * per, (p + 1) * per), per // 10, replace=False)
        put(p, changed, rng.random(len(changed)) < 0.1)
    spent = {"find": 0.0, "rewrite": 0.0}
    real_hits, real_rewrite = upsert._hits, upsert.rewrite_files

    def timed_hits(*a):
        t = time.perf_counter()
        try:
            return real_hits(*a)
        finally:
            spent["find"] += time.perf_counter() - t

    def timed_rewrite(*a):
        t = time.perf_counter()
        try:
            return real_rewrite(*a)
        finally:
            spent["rewrite"] += time.perf_counter() - t

    upsert._hits, upsert.rewrite_files = timed_hits, timed_rewrite
    import storage.tables.materializer as m

    m.rewrite_files = timed_rewrite
    try:
        second = Timer(None)(lambda: materialize_topic(lm, "kv"))
    finally:
        upsert._hits, upsert.rewrite_files = real_hits, real_rewrite
        m.rewrite_files = real_rewrite
    rep = second[3]
    assert rep.error is None, rep.line()
    print(f"\n5 upsert: {keys:,} keys in {PARTITIONS} partitions, then 10% of them changed (1 in 10 deleted):")
    print(f"  first pass (every key new): {first[0]:.2f} s (cpu {first[1]:.2f} s, others {first[2]:.2f} s)")
    print(
        f"  pass after the change: {second[0]:.2f} s (cpu {second[1]:.2f} s, others {second[2]:.2f} s): "
        f"{rep.rows:,} rows added, {rep.rows_deleted:,} replaced or deleted, {rep.files_removed} files rewritten"
    )
    rewrite_only = spent["rewrite"] - spent["find"]
    print(
        f"  copy-on-write parts: finding the files with a changed key {spent['find']:.2f} s, rewriting them "
        f"{rewrite_only:.2f} s ({rewrite_only / second[0]:.0%} of the pass: the most equality deletes could save)"
    )


def case_freshness(root: str, passes: int, batch: int, interval_ms: int, pass_every_ms: int) -> None:
    from storage.log_maintenance import run_once

    lm = LogManager(root)
    lm.create_topic("live", PARTITIONS, {"table.mode": "append"})
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            for p in range(PARTITIONS):
                with lm.open_log(TopicPartition("live", p), writable=True) as log:
                    t = chunk(i, i + batch)
                    now = int(time.time() * 1000)
                    t = t.set_column(2, "timestamp", pa.array(np.full(batch, now, np.int64)))
                    log.append(build_records(t))
                i += batch
            stop.wait(interval_ms / 1000)

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    print(
        f"\n6 freshness: a writer appends {batch:,} records per partition every {interval_ms} ms; a pass every "
        f"{pass_every_ms} ms (the loop's log.retention.check.interval.ms):"
    )
    try:
        for k in range(passes):
            stop.wait(pass_every_ms / 1000)
            t = time.perf_counter()
            reps = run_once(root, topics=["live"])
            took = time.perf_counter() - t
            desc = LogManager(root).describe(["live"]).topics[0].table
            assert desc is not None
            rep = reps.tables[0]
            print(
                f"  pass {k + 1}: {took:5.2f} s, {rep.rows:>8,} rows; after it: {desc.offsets_behind:>7,} offsets "
                f"and {desc.time_behind_ms:>6,} ms behind the log end"
            )
    finally:
        stop.set()
        th.join()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keys", type=int, default=1_000_000, help="upsert case keys")
    ap.add_argument("--passes", type=int, default=5, help="freshness case passes")
    ap.add_argument("--quick", action="store_true", help="the smallest sizes (the test suite runs this)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.rounds, args.keys, args.passes = 40_000, 1, 20_000, 2
    import pyspark

    from tools.iceberg import jars

    iceberg_ok = pyspark.__version__.startswith(jars.SPARK_MINOR + ".")
    spark = spark_session(iceberg_ok)
    others0, t0 = machine_busy_seconds(), time.time()
    work = tempfile.mkdtemp(prefix="kafkalog-table-bench-")
    try:
        root = os.path.join(work, "logs")
        lm = LogManager(root)
        write_topic(lm, "bench", args.rows, {"table.mode": "append"})
        print(
            f"benchmarks/table.py: {args.rows:,} records, local[2], pyspark {pyspark.__version__}, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        case_materialize_and_scan(spark, iceberg_ok, lm, root, args.rows, args.rounds)
        from storage.tables.table_state import read_state

        state = read_state(lm.fs, lm.root, "bench")
        assert state is not None
        case_pruning(lm, args.rows)
        case_duckdb(state.metadata_location, args.rows, args.rounds)
        case_upsert(lm, args.keys)
        case_freshness(os.path.join(work, "live"), args.passes, max(1000, args.rows // 200), 500, 2000)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    busy = machine_busy_seconds() - others0
    print(f"\n(whole run: {time.time() - t0:.0f} s; the machine's busy CPU meanwhile {busy:.0f} s)")


if __name__ == "__main__":
    main()
