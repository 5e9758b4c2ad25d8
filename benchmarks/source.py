"""spark.read.format("kafkalog") beside spark.read.parquet and a Python floor, in one run.

Run:  python benchmarks/source.py [ROWS [ROUNDS]]
The same records (16-byte key, 100-byte value, a timestamp) are written once into a kafkalog topic
(4 partitions, 1 GiB segments, uncompressed) and once as parquet with the Kafka source's columns.
Each read materializes every column through Spark's noop sink. Four reads: kafkalog; kafkalog with
`.schema("value binary")` (a narrow read: a Python source ships every column it yields, a narrow one
ships less); parquet; and the Python floor, a Python data source whose tasks hand Spark the same
columns already in Arrow (pyarrow reads each task's parquet file: no decoding of ours), which is the
most any Python source can do. After a warm-up, R rounds run both
reads in turn (so a burst of load elsewhere hits both); a figure is the best of its R runs. "cpu s"
is the CPU time of Spark's JVM and Python workers during the best run, steadier than wall time on a
shared machine; "others" is the CPU every other process took meanwhile (rerun when it is not ~0).
The bytes read by one startingTimestamp lookup are measured by benchmarks/timestamp_lookup.py.

With --s3 (python benchmarks/source.py --s3 [ROWS]) the topic is written to s3://… on moto's S3 server
started in this process (tools/s3_server.py; Spark's workers reach it through `fs.*` options) and the
figures are the server's: requests and bytes of a whole read and of a startingTimestamp read, and
whether any .log object was fetched whole. No parquet, no timing.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sink import machine_busy_seconds, tree_cpu_seconds  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from storage.records.builder import build_records  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402

PARTITIONS = 4
CHUNK = 250_000


def floor_source():
    """A Python data source yielding each parquet file's Arrow batches as they are (the floor)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Part(InputPartition):
        def __init__(self, path):
            self.path = path

    class Reader(DataSourceReader):
        def __init__(self, directory):
            self.directory = directory

        def partitions(self):
            return [Part(os.path.join(self.directory, f)) for f in sorted(os.listdir(self.directory))]

        def read(self, partition):
            yield from pq.read_table(partition.path).to_batches()

    class Floor(DataSource):
        @classmethod
        def name(cls):
            return "python_floor"

        def schema(self):
            return (
                "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                "timestampType int"
            )

        def reader(self, schema):
            return Reader(self.options["path"])

    return Floor


def chunk(lo: int, hi: int) -> pa.Table:
    n = hi - lo
    rng = np.random.default_rng(lo)
    keys = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    values = rng.integers(97, 123, (n, 100), dtype=np.uint8)
    return pa.table(
        {
            "key": pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(np.arange(0, 16 * n + 1, 16, np.int32)), pa.py_buffer(keys)]
            ),
            "value": pa.Array.from_buffers(
                pa.binary(), n, [None, pa.py_buffer(np.arange(0, 100 * n + 1, 100, np.int32)), pa.py_buffer(values)]
            ),
            "timestamp": pa.array(1_700_000_000_000 + np.arange(lo, hi, dtype=np.int64)),
        }
    )


def write_inputs(root: str, pq_dir: str, rows: int) -> None:
    lm = LogManager(root)
    lm.create_topic("bench", PARTITIONS)
    per = rows // PARTITIONS
    os.makedirs(pq_dir)
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition("bench", p), writable=True) as log:
            for lo in range(0, per, CHUNK):
                t = chunk(p * per + lo, p * per + min(per, lo + CHUNK))
                info = log.append(build_records(t))
                n = t.num_rows
                pq.write_table(
                    pa.table(
                        {
                            "key": t["key"],
                            "value": t["value"],
                            "topic": pa.array(["bench"] * n),
                            "partition": pa.array(np.full(n, p, np.int32)),
                            "offset": pa.array(np.arange(info.first_offset, info.last_offset + 1, dtype=np.int64)),
                            "timestamp": pa.array(t["timestamp"].to_numpy() * 1000).cast(pa.timestamp("us", tz="UTC")),
                            "timestampType": pa.array(np.zeros(n, np.int32)),
                        }
                    ),
                    os.path.join(pq_dir, f"part-{p}-{lo}.parquet"),
                )


def timed(fn, jvm_pid: int) -> tuple[float, float, float]:
    """(wall s, Spark's cpu s, other processes' cpu s) of one call."""
    cpu0, busy0 = tree_cpu_seconds(jvm_pid), machine_busy_seconds()
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    cpu = tree_cpu_seconds(jvm_pid) - cpu0
    return wall, cpu, max(0.0, machine_busy_seconds() - busy0 - cpu)


def write_topic(lm: LogManager, rows: int) -> None:
    lm.create_topic("bench", PARTITIONS)
    per = rows // PARTITIONS
    for p in range(PARTITIONS):
        with lm.open_log(TopicPartition("bench", p), writable=True) as log:
            for lo in range(0, per, CHUNK):
                log.append(build_records(chunk(p * per + lo, p * per + min(per, lo + CHUNK))))


def main_s3(rows: int) -> None:
    """Requests and bytes of spark.read.format("kafkalog") on S3 (moto's server in this process)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from s3_lookup import object_sizes, spark_fs_options, start_server, summary, whole_object_gets

    server, bucket = start_server()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafkalog-source-bench-s3")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        url = f"s3://{bucket}/source"
        write_topic(LogManager(url, server.storage_options), rows)
        sizes = object_sizes(server, url)
        logs = [k for k in sizes if k.endswith(".log")]
        print(
            f"{rows:,} records in {PARTITIONS} partitions on S3: {len(logs)} segment objects, "
            f"{sum(sizes[k] for k in logs):,} bytes of .log"
        )

        def reader(**options):
            return (
                spark.read.format("kafkalog")
                .options(**spark_fs_options(server))
                .option("subscribe", "bench")
                .options(**options)
                .load(url)
            )

        ts = 1_700_000_000_000 + rows // 2 + rows // (2 * PARTITIONS)  # inside partition 2 (and before 3)
        for name, options in (
            ("whole topic", {}),
            ("startingTimestamp", {"startingTimestamp": str(ts), "startingOffsetsByTimestampStrategy": "latest"}),
        ):
            mark = server.log.mark()
            n = reader(**options).count()
            reqs = server.log.since(mark)
            log_gets = [r for r in reqs if r.method == "GET" and r.path.endswith(".log")]
            print(
                f"{name:18} {n:>10,} records: {summary(reqs)}; .log GETs {len(log_gets)} "
                f"({sum(r.body_bytes for r in log_gets):,} bytes), whole .log objects read: "
                f"{len(whole_object_gets(reqs, sizes))}"
            )
    finally:
        spark.stop()
        server.stop()


def main():
    if "--s3" in sys.argv[1:]:
        args = [a for a in sys.argv[1:] if a != "--s3"]
        main_s3(int(args[0]) if args else 400_000)
        return
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 4_000_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafkalog-source-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        root, pq_dir = os.path.join(tmp, "logs"), os.path.join(tmp, "parquet")
        write_inputs(root, pq_dir, rows)
        spark.dataSource.register(floor_source())
        kl = lambda: spark.read.format("kafkalog").option("subscribe", "bench").load(root)  # noqa: E731
        narrow = lambda: spark.read.schema("value binary").format("kafkalog").option("subscribe", "bench").load(root)  # noqa: E731
        pqf = lambda: spark.read.parquet(pq_dir)  # noqa: E731
        floor = lambda: spark.read.format("python_floor").load(pq_dir)  # noqa: E731
        assert kl().count() == pqf().count() == floor().count() == narrow().count() == rows
        reads = {"kafkalog": kl, "kafkalog value-only": narrow, "parquet": pqf, "python floor": floor}
        jvm = spark.sparkContext._gateway.proc.pid
        best: dict = {}
        for rnd in range(runs + 1):  # round 0 warms up: JIT, Python workers, file cache
            for name, df in reads.items():
                run = timed(lambda df=df: df().write.format("noop").mode("overwrite").save(), jvm)
                if rnd and (name not in best or run[0] < best[name][0]):
                    best[name] = run
        log_bytes = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs if f.endswith(".log")
        )
        pq_bytes = sum(os.path.getsize(os.path.join(pq_dir, f)) for f in os.listdir(pq_dir))
    print(
        f"{rows:,} records, {PARTITIONS} partitions, local[2], load {os.getloadavg()[0]:.1f}; "
        f"{log_bytes / 1e6:.0f} MB of .log, {pq_bytes / 1e6:.0f} MB of parquet"
    )
    for name, (t, cpu, oth) in best.items():
        print(f"{name:20} {rows / t:>12,.0f} rows/s  ({t:.2f} s, cpu {cpu:.2f} s, others {oth:.2f} s)")
    t_kl, t_pq, t_fl, t_nr = (best[n][0] for n in ("kafkalog", "parquet", "python floor", "kafkalog value-only"))
    print(
        f"ratio kafkalog/parquet: {t_pq / t_kl:.2f}x rows/s; kafkalog/python floor: {t_fl / t_kl:.2f}x; "
        f"python floor/parquet: {t_pq / t_fl:.2f}x (what any Python source can reach)"
    )
    print(
        f"narrow read: value-only {t_kl / t_nr:.2f}x the rows/s of the full read "
        f"(cpu {best['kafkalog value-only'][1]:.2f} s vs {best['kafkalog'][1]:.2f} s)"
    )
    spark.stop()


if __name__ == "__main__":
    main()
