"""Spark sink throughput: writeStream.format("kafkalog") beside Spark's built-in parquet file sink.

Run: python benchmarks/sink.py [--rows N] [--input-partitions P] [--topic-partitions T] [--runs R]
                               [--compressed lz4:snappy] [--level L] [--source files --batches B]
One SparkSession (local[2]); every sink gets the same streaming input with trigger(availableNow=True):
the "rate-micro-batch" source (one micro-batch of N rows over P partitions; the plain "rate" source
reads nothing under availableNow), or with --source files, N rows staged once as P parquet files per
micro-batch, --batches micro-batches, streamed back with maxFilesPerTrigger=P. Rows: key
"key-%012d" (16 bytes), value 100 hex chars (half random: compresses about 2x), the source's
timestamp. "noop" (Spark's no-op sink) is the cost of the input alone; "python noop" is a Python
data source sink that drops the Arrow batches it gets: what any Python sink pays before writing a byte.

With --s3 only the kafkalog sink runs, once, into s3://… on moto's S3 server started in this process
(tools/s3_server.py; Spark's workers reach it over HTTP through `fs.*` options), and the figures are the
server's request counts per commit (one commit per micro-batch), not speed:
    python benchmarks/sink.py --s3 --source files --rows 200000 --batches 5 --input-partitions 2

Each sink runs once to warm up (Python workers, numba's cache, the JIT), then R rounds run every sink
in turn (so a burst of load elsewhere hits all of them); a figure is the best of its R runs, timed
from start() to awaitTermination(). "cpu s" is the CPU time of Spark's JVM and Python workers during
the run, steadier than wall time on a shared machine; "others" is the CPU time every other process
took meanwhile (near 0 on a quiet machine; rerun when it is not). kafkalog fsyncs; parquet does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # s3_lookup (the --s3 run's server)
# Spark's Python workers (the kafkalog writer runs in them) must run this interpreter.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

# key 16 bytes; value 100 hex chars: 50 random-looking (xxhash64s) and 50 zeros, like codec.py's values
ROW_EXPRS = (
    "concat('key-', lpad(cast(value AS STRING), 12, '0')) AS key",
    "concat(substr(concat(hex(xxhash64(value, 1)), hex(xxhash64(value, 2)), hex(xxhash64(value, 3)),"
    " hex(xxhash64(value, 4))), 1, 50), repeat('0', 50)) AS value",
    "timestamp",
)
INPUT_SCHEMA = "key STRING, value STRING, timestamp TIMESTAMP"
TOPIC = "bench"


def dir_bytes(path: str, suffix: str) -> int:
    """Total size of the files under path whose names end with suffix."""
    total = 0
    for dirpath, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files if f.endswith(suffix))
    return total


def data_records(root: str, topic: str, storage_options: dict | None = None) -> int:
    """The data records a topic holds, read_committed: the count a query's rows must equal (each transaction
    of the sink also takes an offset per partition for its COMMIT marker, so offsets would over-count)."""
    from storage.log_manager import LogManager
    from storage.transactions.isolation import READ_COMMITTED

    lm = LogManager(root, storage_options)
    n = 0
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            n += sum(b.num_rows for b in log.read_records(log.log_start_offset, isolation_level=READ_COMMITTED))
    return n


def tree_cpu_seconds(root_pid: int) -> float:
    """CPU seconds (user + system, with reaped children) of a process and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)  # fields[1] is the ppid
        times[pid] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    total, todo = 0, [root_pid]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all processes have been busy since boot (every core), from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds this process has used (user + system)."""
    t = os.times()
    return t.user + t.system


def register_python_noop(spark) -> None:
    """format("python_noop"): a Python streaming sink that reads every Arrow batch and keeps nothing."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

    class _Drop(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class PythonNoop(DataSource):
        @classmethod
        def name(cls):
            return "python_noop"

        def streamWriter(self, schema, overwrite):
            return _Drop()

    spark.dataSource.register(PythonNoop)


class Bench:
    def __init__(self, spark, args, work: str):
        self.spark = spark
        self.args = args
        self.work = work
        self.jvm_pid = spark.sparkContext._gateway.proc.pid
        register_python_noop(spark)
        self.files = None
        if args.source == "files":
            self.files = os.path.join(work, "input")
            (
                spark.range(0, args.rows, numPartitions=args.input_partitions * args.batches)
                .selectExpr("id AS value", "timestamp_millis(1700000000000 + id) AS timestamp")
                .selectExpr(*ROW_EXPRS)
                .write.parquet(self.files)
            )

    def stream(self):
        a = self.args
        if self.files is not None:
            return (
                self.spark.readStream.schema(INPUT_SCHEMA)
                .option("maxFilesPerTrigger", a.input_partitions)
                .parquet(self.files)
            )
        return (
            self.spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", a.rows)
            .option("numPartitions", a.input_partitions)
            .option("startTimestamp", 1700000000000)
            .load()
            .selectExpr(*ROW_EXPRS)
        )

    def run_once(self, sink: str, codec: str) -> tuple[float, float, float, int]:
        """(seconds, our cpu seconds, other processes' cpu seconds, output data bytes) of one availableNow
        query into fresh directories."""
        out = os.path.join(self.work, "out")
        ckpt = os.path.join(self.work, "ckpt")
        for d in (out, ckpt):
            shutil.rmtree(d, ignore_errors=True)
        w = self.stream().writeStream.option("checkpointLocation", ckpt).trigger(availableNow=True)
        if sink == "kafkalog":
            w = (
                w.format("kafkalog")
                .option("topic", TOPIC)
                .option("partitions", self.args.topic_partitions)
                .option("compression.type", codec)
            )
            if self.args.level is not None and codec in ("zstd", "gzip"):
                w = w.option(f"compression.{codec}.level", self.args.level)
        elif sink == "parquet":
            w = w.format("parquet").option("compression", codec)
        else:
            w = w.format("python_noop" if sink == "python" else "noop")
        cpu0, busy0 = tree_cpu_seconds(self.jvm_pid), machine_busy_seconds()
        t0 = time.perf_counter()
        q = w.start(out)
        q.awaitTermination()
        elapsed = time.perf_counter() - t0
        cpu = tree_cpu_seconds(self.jvm_pid) - cpu0
        others = max(0.0, machine_busy_seconds() - busy0 - cpu)
        if q.exception() is not None:
            raise RuntimeError(f"{sink} query failed: {q.exception()}")
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        if rows != self.args.rows:
            raise RuntimeError(f"{sink}: the query read {rows} rows, expected {self.args.rows}")
        if sink == "kafkalog":
            written = data_records(out, TOPIC)
            if written != rows:
                raise RuntimeError(f"kafkalog holds {written} records, the query read {rows} rows")
            size = dir_bytes(out, ".log")
        else:
            size = dir_bytes(out, ".parquet")
        return elapsed, cpu, others, size


def run_s3(spark, args, work: str) -> None:
    """The kafkalog sink into S3 (moto's server in this process): requests per commit, by kind."""
    from collections import Counter

    from s3_lookup import spark_fs_options, start_server, summary

    server, bucket = start_server()
    try:
        bench = Bench(spark, args, work)
        url = f"s3://{bucket}/sink"
        ckpt = os.path.join(work, "ckpt-s3")
        mark = server.log.mark()
        q = (
            bench.stream()
            .writeStream.format("kafkalog")
            .options(**spark_fs_options(server))
            .option("topic", TOPIC)
            .option("partitions", args.topic_partitions)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start(url)
        )
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"kafkalog on S3 failed: {q.exception()}")
        reqs = server.log.since(mark)
        commits = sum(1 for p in q.recentProgress if p["numInputRows"])
        written = data_records(url, TOPIC, server.storage_options)
        if written != args.rows:
            raise RuntimeError(f"kafkalog on S3 holds {written} records, the query read {args.rows} rows")
        staging = [r for r in reqs if "/.kafkalog-staged-" in r.path]
        rest = [r for r in reqs if "/.kafkalog-staged-" not in r.path]
        segments = [r for r in rest if r.method == "PUT" and r.path.endswith(".log") and r.status == 200]
        print(
            f"kafkalog on S3: {args.rows:,} rows, {commits} commit(s) (micro-batches) into {args.topic_partitions} "
            f"partition(s), {args.input_partitions} task(s) per micro-batch, {len(segments)} segment objects"
        )
        print(f"  all requests:          {summary(reqs)}")
        print(f"  staging objects:       {summary(staging)}")
        print(f"  commits and metadata:  {summary(rest)}")
        print(
            f"  per commit: {len(reqs) / commits:.1f} requests ({len(staging) / commits:.1f} for staging, "
            f"{len(rest) / commits:.1f} for the commit and metadata); per partition commit "
            f"{len(rest) / max(1, len(segments)):.1f}"
        )
        by_kind = Counter(
            (r.method, r.path.rsplit(".", 1)[-1] if "." in r.path.rsplit("/", 1)[-1] else "list") for r in rest
        )
        print(
            "  commit requests by method and object kind:",
            ", ".join(f"{m} {k}: {n}" for (m, k), n in sorted(by_kind.items())),
        )
    finally:
        server.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--input-partitions", type=int, default=2, help="Spark partitions (tasks) per micro-batch")
    parser.add_argument("--topic-partitions", type=int, default=2, help="partitions of the kafkalog topic")
    parser.add_argument("--source", choices=("rate", "files"), default="rate")
    parser.add_argument("--batches", type=int, default=4, help="micro-batches, with --source files")
    parser.add_argument("--runs", type=int, default=2, help="timed rounds (after one warm-up)")
    parser.add_argument(
        "--compressed",
        action="append",
        metavar="KAFKALOG:PARQUET",
        help="compressed pair(s) to compare (default zstd:snappy, parquet's default codec)",
    )
    parser.add_argument("--no-compressed", action="store_true", help="only the uncompressed pair")
    parser.add_argument(
        "--level",
        type=int,
        default=None,
        help="compression.<codec>.level of kafkalog's zstd or gzip runs (default: Kafka's)",
    )
    parser.add_argument("--dir", default=None, help="scratch directory (default: a fresh temp dir)")
    parser.add_argument(
        "--s3",
        action="store_true",
        help="only the kafkalog sink, into moto's S3 server in this process: requests per commit instead of speed",
    )
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafkalog-sink-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="kafkalog-sink-bench-", dir=args.dir)
    if args.s3:
        try:
            run_s3(spark, args, work)
        finally:
            spark.stop()
            shutil.rmtree(work, ignore_errors=True)
        return
    pairs = [("none", "uncompressed")]
    if not args.no_compressed:
        for pair in args.compressed or ["zstd:snappy"]:
            kl, _, pq = pair.partition(":")
            if not kl or not pq:
                parser.error(f"--compressed takes KAFKALOG:PARQUET codecs, e.g. lz4:snappy; got {pair!r}")
            pairs.append((kl, pq))
    compared = [s for kl, pq in pairs for s in (("parquet", pq), ("kafkalog", kl))]
    sinks = list(dict.fromkeys([("noop", ""), ("python", "noop")] + compared))
    try:
        bench = Bench(spark, args, work)
        batches = 1 if args.source == "rate" else args.batches
        print(
            f"{args.rows:,} rows (16-byte key, 100-byte value, timestamp) from {args.source}: {batches} "
            f"micro-batch(es) of {args.input_partitions} partitions; kafkalog topic of {args.topic_partitions} "
            f"partitions; local[2] on {os.cpu_count()} cores; best of {args.runs} after a warm-up"
        )
        load0 = os.getloadavg()[0]
        for sink, codec in sinks:
            bench.run_once(sink, codec)
        best: dict[tuple[str, str], tuple[float, float, float, int]] = {}
        for _ in range(args.runs):
            for key in sinks:
                run = bench.run_once(*key)
                if key not in best or run[0] < best[key][0]:
                    best[key] = run
        load1 = os.getloadavg()[0]
        print(f"{'sink':24}{'rows/s':>12}{'s':>8}{'cpu s':>8}{'others':>8}{'output bytes':>16}")
        for key in sinks:
            t, cpu, others, size = best[key]
            name = "noop (input only)" if key[0] == "noop" else " ".join(key)
            print(f"{name:24}{args.rows / t:>12,.0f}{t:8.2f}{cpu:8.2f}{others:8.2f}{size:>16,}")
        for kl, pq in pairs:
            ratio = best["parquet", pq][0] / best["kafkalog", kl][0]
            ceiling = best["parquet", pq][0] / best["python", "noop"][0]
            print(f"kafkalog {kl} / parquet {pq}: {ratio:.2f}x rows/s (python noop / parquet {pq}: {ceiling:.2f}x)")
        for kl, _ in pairs:
            floor = best["python", "noop"][0] / best["kafkalog", kl][0]
            extra = best["kafkalog", kl][1] - best["python", "noop"][1]
            print(f"kafkalog {kl} / python noop (the floor): {floor:.2f}x rows/s, {extra:+.2f} cpu s")
        print(f"load average (1 min) before/after: {load0:.2f} / {load1:.2f}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
