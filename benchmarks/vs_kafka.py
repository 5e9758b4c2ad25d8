"""kafkalog beside what a user would otherwise run: Spark's Kafka connector and a Kafka broker.

Run: python benchmarks/vs_kafka.py [--rows N] [--rounds R] [--quick] [--cases 1,2,3,4]
One process, one SparkSession (local[2], `spark.jars` = Spark's Kafka connector, spark-sql-kafka-0-10, as
tools/realkafka/jars.py resolves it) and one local Kafka 4.4.0 broker that this script starts (KRaft, one
node, in a temp dir) and stops at exit. Every topic on both sides has 2 partitions; the broker keeps Kafka's
defaults (topic compression.type=producer, 1 GiB segments, no flush.messages / flush.ms) and runs with the
JVM options of kafka-server-start.sh (1 GiB heap, G1, full JIT), not the tests' quick-start ones. Kafka does
not fsync per write by default (it leaves flushing to the OS, durability to replication), while kafkalog
fsyncs each commit (docs/spark.md, Guarantees): the broker path does less work for durability here. The
connector's producer keeps its defaults too (its kafka-clients 3.9: acks=all, batch.size 16 KiB, linger.ms 0);
--kafka-option KEY=VALUE sets `kafka.KEY` on the connector's sink (e.g. batch.size=1048576), and
--kafka-source-option KEY=VALUE on its readers (e.g. fetch.max.wait.ms=10: a consumer reused by the next
micro-batch can first wait out the fetch it left pending at the end of the log: up to 500 ms by default).

Cases (the kafka path and the kafkalog path of each run in turn, the order reversed every other round):
 1 sink throughput: N rows in one micro-batch (trigger(availableNow=True) over sink.py's rate-micro-batch
   input: 16-byte key, 100-byte value, 2 tasks) into a fresh topic, uncompressed and zstd (the connector's
   kafka.compression.type, kafkalog's compression.type; both at zstd level 3). rows/s from start() to
   awaitTermination(). Floors, as in sink.py: Spark's noop sink (the input alone: what any sink pays) and
   a Python sink that drops its Arrow batches (what any Python sink pays). kafkalog runs twice: with its default,
   one transaction per micro-batch, and with transactional=false, to show what the transaction costs.
 2 sink trigger: the median triggerExecution after the first two of B micro-batches of M rows (latency.py's
   parquet file-stream input, 2 tasks each) into a fresh topic; floor: latency.py's Python floor sink.
 3 source: a batch read of the N rows case 1 wrote (the kafka sink into the broker, the kafkalog sink into
   ROOT, written once before the rounds), into Spark's noop sink (every column materialized), rows/s; floor:
   source.py's Python source handing Spark the same records as Arrow from parquet. And the readStream median
   trigger (after the first two) of B micro-batches of M records (maxOffsetsPerTrigger=M, availableNow) into
   noop, over the same records on each side (latency.py's topic, and its records produced into the broker
   with their partitions); floor: latency.py's in-memory Python stream source.
 4 end to end: a writing query (trigger every --e2e-interval-ms, --e2e-batches micro-batches of
   --e2e-rows-per-batch rows) stamps each row's value with the wall clock (ms) when its task produces it; a
   reading query (default trigger, started first and idle when the writer starts) stamps each row when its
   task produces it; latency = arrival - creation, per row, p50 and p99 over the run's rows. kafka path:
   kafka sink -> broker -> kafka source; kafkalog path: kafkalog sink -> ROOT -> kafkalog readStream.
   Both clocks are the one JVM's (local mode); the figure leaves out the writer's planning before its tasks
   and the reader's commit after them.

A figure is the best of its R runs (after one warm-up round), with the range of the R runs. Columns:
"s" the run's wall time; "spark cpu" the CPU seconds of this process tree (this driver, Spark's JVM, its
Python workers) minus the broker's; "broker cpu" the broker JVM's (utime+stime deltas of its /proc/PID/stat);
"others" the CPU every other process on the machine took meanwhile (2 cores give 2 CPU seconds per second;
near 0 on a quiet machine, as in sink.py: rerun when it is not); "load" the 1-minute load average. Ratios:
kafkalog / kafka (above 1: kafkalog has more rows/s or takes longer per trigger), and beside each, the same
ratio for the floor, the most any Python sink or source could reach against the connector.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)  # sink, source, latency: inputs, floors, CPU accounting
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from latency import (  # noqa: E402
    SINK_INPUT_SCHEMA,
    median_after_two,
    register_floors,
    write_inputs,
)

# The floors are classes of those modules (defined inside their functions) that call module functions
# (latency.rows): Spark's Python workers get them by value, as when each script runs them as __main__.
from pyspark import cloudpickle  # noqa: E402
from sink import Bench, data_records, machine_busy_seconds, tree_cpu_seconds  # noqa: E402
from source import floor_source  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from tools.realkafka import jars  # noqa: E402  (the tests' real Kafka: jars from Maven, a KRaft broker)
from tools.realkafka.broker import KafkaBroker, tool_classes  # noqa: E402

for _module in ("latency", "sink", "source"):
    cloudpickle.register_pickle_by_value(sys.modules[_module])

TOPIC = "bench"
PARTITIONS = 2
# kafka-server-start.sh / kafka-run-class.sh defaults (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS)
BROKER_JVM = [
    "-Xmx1G",
    "-Xms1G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
# the harness's test settings put back to Kafka's defaults: background work as often as a user's broker does it
BROKER_CONFIGS = {
    "log.cleaner.backoff.ms": "15000",
    "log.retention.check.interval.ms": "300000",
    "log.initial.task.delay.ms": "30000",
    "log.retention.ms": str(7 * 24 * 3600 * 1000),
}
NOW_MS = "CAST(java_method('java.lang.System', 'currentTimeMillis') AS BIGINT)"  # per row, when evaluated
HANG_S = 600.0  # a guard against a hang only


class UserBroker(KafkaBroker):
    """The tests' broker started as kafka-server-start.sh starts one (the tests trade heap, GC and the JIT's
    second tier for a quick start; a user's broker has them)."""

    def _java(self, main: str, *args: str, log4j: bool = True) -> list[str]:
        cmd = super()._java(main, *args, log4j=log4j)
        if main != "kafka.Kafka":
            return cmd
        quick = {f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"}
        return [cmd[0], *BROKER_JVM, *(c for c in cmd[1:] if c not in quick)]


class Progress:
    """Rows per streaming query, from a listener (polling recentProgress would cost the queries measured)."""

    def __init__(self, spark):
        from pyspark.sql.streaming import StreamingQueryListener

        counts = self.rows = {}

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event):
                pass

            def onQueryProgress(self, event):
                key = str(event.progress.id)
                counts[key] = counts.get(key, 0) + event.progress.numInputRows

            def onQueryIdle(self, event):
                pass

            def onQueryTerminated(self, event):
                pass

        spark.streams.addListener(Listener())

    def of(self, q) -> int:
        return self.rows.get(str(q.id), 0)


def wait_for(cond, q, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not cond():
        if q.exception() is not None:
            raise RuntimeError(f"{what}: the query failed: {q.exception()}")
        if not q.isActive:
            raise RuntimeError(f"{what}: the query stopped")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no sign of {what} after {HANG_S:.0f} s (a hang)")
        time.sleep(0.05)


class VsKafka:
    def __init__(self, spark, broker: KafkaBroker, args, work: str):
        self.spark, self.broker, self.args, self.work = spark, broker, args, work
        self.n = 0
        self.me = os.getpid()
        self.progress = Progress(spark)
        self.topics: list[str] = []  # broker topics created, fresh ones handed out by fresh_topic()
        self.used: dict[str, int] = {}  # broker topic -> records it must hold
        # case 1's input (sink.py's): one micro-batch of `rows` rows, 2 tasks; registers format("python_noop")
        self.rate = Bench(spark, argparse.Namespace(source="rate", rows=args.rows, input_partitions=2), work)
        # cases 2 and 3 (stream): latency.py's inputs; case 4's writer input the same way
        self.lat = os.path.join(work, "lat")
        write_inputs(self.lat, args.batches, args.rows_per_batch)
        self.e2e_dir = os.path.join(work, "e2e")
        write_inputs(self.e2e_dir, args.e2e_batches, args.e2e_rows_per_batch)
        register_floors(spark, args.batches, args.rows_per_batch)  # floor_sink, floor_source; registers kafkalog
        spark.dataSource.register(floor_source())  # python_floor (a batch source over parquet files)
        self.kafka_options = {"kafka.bootstrap.servers": broker.bootstrap}
        self.source_options = {
            **self.kafka_options,
            **dict(("kafka." + kv.partition("=")[0], kv.partition("=")[2]) for kv in args.kafka_source_option),
        }

    # ---- helpers ----
    def path(self, what: str) -> str:
        self.n += 1
        return os.path.join(self.work, "runs", f"{self.n}-{what}")

    def create_topics(self, names: list[str]) -> None:
        self.broker.tool(*({"op": "createTopic", "topic": t, "partitions": PARTITIONS} for t in names))
        self.topics.extend(names)

    def fresh_topic(self) -> str:
        free = [t for t in self.topics if t not in self.used and t.startswith("run-")]
        if not free:  # the pool was sized from the plan; more runs than planned make one more
            self.create_topics([f"run-{len(self.topics)}"])
            return self.fresh_topic()
        return free[0]

    def timed(self, fn):
        """(fn's result, {wall, spark, broker, others, load}) of one call."""
        bpid = self.broker.proc.pid
        b0, all0, busy0 = tree_cpu_seconds(bpid), tree_cpu_seconds(self.me), machine_busy_seconds()
        t0 = time.perf_counter()
        out = fn()
        wall = time.perf_counter() - t0
        b1, all1, busy1 = tree_cpu_seconds(bpid), tree_cpu_seconds(self.me), machine_busy_seconds()
        ours = all1 - all0  # the broker is this process's child: part of the tree
        return out, {
            "wall": wall,
            "spark": ours - (b1 - b0),
            "broker": b1 - b0,
            "others": max(0.0, busy1 - busy0 - ours),
            "load": os.getloadavg()[0],
        }

    def kafka_sink(self, w, topic: str, codec: str = "none"):
        w = w.format("kafka").options(**self.kafka_options).option("topic", topic)
        if codec != "none":
            w = w.option("kafka.compression.type", codec)
        for kv in self.args.kafka_option:
            k, _, v = kv.partition("=")
            w = w.option(f"kafka.{k}", v)
        return w

    @staticmethod
    def run_query(start) -> object:
        q = start()
        q.awaitTermination()
        if q.exception() is not None:
            raise RuntimeError(f"query failed: {q.exception()}")
        return q

    @staticmethod
    def log_records(root: str) -> int:
        """Data records, not offsets: each partition's COMMIT marker takes one (benchmarks/sink.py)."""
        return data_records(root, TOPIC)

    # ---- case 1: sink throughput ----
    def sink(self, path: str, codec: str, target: str | None = None) -> dict:
        """One micro-batch of `rows` rows into path: a fresh broker topic / ROOT, or `target` (kept)."""
        rows = self.args.rows
        out = self.path(f"sink-{path}-{codec}")
        w = self.rate.stream().writeStream.option("checkpointLocation", out + ".ckpt").trigger(availableNow=True)
        if path == "kafka":
            topic = target or self.fresh_topic()
            self.used[topic] = rows
            start = self.kafka_sink(w, topic, codec).start
        elif path in ("kafkalog", "kafkalog-ntx"):
            root = target or out
            w = (
                w.format("kafkalog")
                .option("topic", TOPIC)
                .option("partitions", PARTITIONS)
                .option("compression.type", codec)
                .option("transactional", str(path == "kafkalog").lower())
            )
            start = lambda: w.start(root)  # noqa: E731
        else:
            start = w.format("noop" if path == "noop" else "python_noop").start
        q, m = self.timed(lambda: self.run_query(start))
        got = sum(p["numInputRows"] for p in q.recentProgress)
        if got != rows:
            raise RuntimeError(f"sink {path}: the query read {got} rows, expected {rows}")
        if path in ("kafkalog", "kafkalog-ntx"):
            held = self.log_records(root)
            if held != rows:
                raise RuntimeError(f"kafkalog holds {held} records, the query wrote {rows}")
            if target is None:
                shutil.rmtree(root)
        shutil.rmtree(out + ".ckpt", ignore_errors=True)
        return {**m, "v": rows / m["wall"]}

    # ---- case 2: the sink's trigger ----
    def sink_trigger(self, path: str) -> dict:
        a = self.args
        out = self.path(f"trigger-{path}")
        df = (
            self.spark.readStream.schema(SINK_INPUT_SCHEMA)
            .option("maxFilesPerTrigger", 2)
            .parquet(os.path.join(self.lat, "sink_in"))
        )
        w = df.writeStream.option("checkpointLocation", out + ".ckpt").trigger(availableNow=True)
        if path == "kafka":
            topic = self.fresh_topic()
            self.used[topic] = a.batches * a.rows_per_batch
            start = self.kafka_sink(w, topic).start
        elif path == "kafkalog":
            w = w.format("kafkalog").option("topic", TOPIC).option("partitions", PARTITIONS)
            start = lambda: w.start(out)  # noqa: E731
        else:
            start = w.format("floor_sink").start
        q, m = self.timed(lambda: self.run_query(start))
        triggers = self.stream_triggers(q, f"sink trigger {path}")
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out + ".ckpt", ignore_errors=True)
        return {**m, "v": median_after_two(triggers)}

    def stream_triggers(self, q, what: str) -> list[int]:
        a = self.args
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        got = sum(p["numInputRows"] for p in progress)
        if got != a.batches * a.rows_per_batch or len(progress) != a.batches:
            raise RuntimeError(
                f"{what}: {len(progress)} micro-batches of {got} rows in all, expected "
                f"{a.batches} of {a.rows_per_batch}"
            )
        return [p["durationMs"]["triggerExecution"] for p in progress]

    # ---- case 3: the source ----
    def write_sources(self) -> None:
        """The records case 3 reads: case 1's write (uncompressed) kept on each side, a parquet copy for the
        floor, and latency.py's stream records produced into the broker with their partitions."""
        self.src_root = os.path.join(self.work, "src-root")
        self.sink("kafka", "none", target="src")
        self.sink("kafkalog", "none", target=self.src_root)
        self.src_pq = os.path.join(self.work, "src-parquet")
        # 2 tasks, 2 files: as many tasks as partitions; timestamps as pyarrow reads them, and only .parquet
        # files left for the floor (it reads every file in the directory)
        self.spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        self.read_df("kafkalog").write.parquet(self.src_pq)
        self.spark.conf.unset("spark.sql.parquet.outputTimestampType")
        for f in os.listdir(self.src_pq):
            if not f.endswith(".parquet"):
                os.remove(os.path.join(self.src_pq, f))
        (
            self.spark.read.parquet(os.path.join(self.lat, "src_pq"))
            .select("key", "value", "partition")
            .write.format("kafka")
            .options(**self.kafka_options)
            .option("topic", "lat-src")
            .mode("append")
            .save()
        )
        self.used["lat-src"] = self.args.batches * self.args.rows_per_batch
        for path in ("kafka", "kafkalog", "floor"):
            n = self.read_df(path).count()
            if n != self.args.rows:
                raise RuntimeError(f"a batch read of the {path} records counts {n}, expected {self.args.rows}")

    def read_df(self, path: str):
        r = self.spark.read
        if path == "kafka":
            return r.format("kafka").options(**self.source_options).option("subscribe", "src").load()
        if path == "kafkalog":
            return r.format("kafkalog").option("subscribe", TOPIC).load(self.src_root)
        return r.format("python_floor").load(self.src_pq)

    def read(self, path: str) -> dict:
        _, m = self.timed(lambda: self.read_df(path).write.format("noop").mode("overwrite").save())
        return {**m, "v": self.args.rows / m["wall"]}

    def read_trigger(self, path: str) -> dict:
        a = self.args
        out = self.path(f"read-trigger-{path}")
        r = self.spark.readStream
        if path == "kafka":
            df = (
                r.format("kafka")
                .options(**self.source_options)
                .option("subscribe", "lat-src")
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", a.rows_per_batch)
                .load()
            )
        elif path == "kafkalog":
            df = (
                r.format("kafkalog")
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .option("maxOffsetsPerTrigger", a.rows_per_batch)
                .load(os.path.join(self.lat, "src_kl"))
            )
        else:
            df = r.format("floor_source").load()
        w = df.writeStream.format("noop").option("checkpointLocation", out + ".ckpt").trigger(availableNow=True)
        q, m = self.timed(lambda: self.run_query(w.start))
        triggers = self.stream_triggers(q, f"readStream trigger {path}")
        shutil.rmtree(out + ".ckpt", ignore_errors=True)
        return {**m, "v": median_after_two(triggers)}

    # ---- case 4: end to end ----
    def e2e(self, path: str) -> dict:
        a = self.args
        total = a.e2e_batches * a.e2e_rows_per_batch
        out = self.path(f"e2e-{path}")
        name = f"e2e_{self.n}"
        r = self.spark.readStream
        if path == "kafka":
            topic = self.fresh_topic()
            self.used[topic] = total
            reader = (
                r.format("kafka")
                .options(**self.source_options)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .load()
            )
        else:
            LogManager(out).create_topic(TOPIC, PARTITIONS)
            reader = r.format("kafkalog").option("subscribe", TOPIC).option("startingOffsets", "earliest").load(out)
        rows = (
            self.spark.readStream.schema(SINK_INPUT_SCHEMA)
            .option("maxFilesPerTrigger", 2)
            .parquet(os.path.join(self.e2e_dir, "sink_in"))
            # 13 digits of ms, then the input value's last 87 characters: still 100 bytes
            .selectExpr("key", f"concat(CAST({NOW_MS} AS STRING), substr(value, 14)) AS value")
        )
        w = rows.writeStream.option("checkpointLocation", out + ".wckpt").trigger(
            processingTime=f"{a.e2e_interval_ms} milliseconds"
        )
        if path == "kafka":
            start_writer = self.kafka_sink(w, topic).start
        else:
            w = w.format("kafkalog").option("topic", TOPIC)
            start_writer = lambda: w.start(out)  # noqa: E731

        def run():
            rq = (
                reader.selectExpr(
                    "CAST(substr(CAST(value AS STRING), 1, 13) AS BIGINT) AS created", f"{NOW_MS} AS arrived"
                )
                .writeStream.format("memory")
                .queryName(name)
                .option("checkpointLocation", out + ".rckpt")
                .start()
            )
            try:
                wait_for(
                    lambda: rq.status["message"] == "Waiting for data to arrive",
                    rq,
                    f"e2e {path}: the reading query's first trigger",
                )
                wq = start_writer()
                queries.append(wq)
                try:
                    wait_for(lambda: self.progress.of(wq) >= total, wq, f"e2e {path}: the writer's {total} rows")
                finally:
                    wq.stop()
                wait_for(lambda: self.progress.of(rq) >= total, rq, f"e2e {path}: the reader's {total} rows")
            finally:
                rq.stop()
                queries.append(rq)

        queries: list = []
        _, m = self.timed(run)
        # the median triggerExecution of the writer's and the reader's micro-batches that carried rows
        w_trig, r_trig = (
            statistics.median([p["durationMs"]["triggerExecution"] for p in q.recentProgress if p["numInputRows"]])
            for q in queries
        )
        lat = [arr - cre for cre, arr in self.spark.table(name).collect()]
        self.spark.catalog.dropTempView(name)
        if len(lat) != total:
            raise RuntimeError(f"e2e {path}: the reader got {len(lat)} rows, the writer wrote {total}")
        lat.sort()
        shutil.rmtree(out, ignore_errors=True)
        for suffix in (".wckpt", ".rckpt"):
            shutil.rmtree(out + suffix, ignore_errors=True)
        return {
            **m,
            "v": lat[len(lat) // 2],
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "w_trig": w_trig,
            "r_trig": r_trig,
        }

    def check_topics(self) -> None:
        """Each broker topic written holds what was written (one tool run, outside every timing)."""
        names = sorted(self.used)
        offs = self.broker.tool(
            *({"op": "listOffsets", "topic": t, "partitions": list(range(PARTITIONS)), "spec": "latest"} for t in names)
        )
        for t, o in zip(names, offs, strict=False):
            held = sum(v["offset"] for v in o.values())
            if held != self.used[t]:
                raise RuntimeError(f"broker topic {t} holds {held} records, {self.used[t]} were written")


# ---- the plan and the report ----
CASES = {
    "1": [
        ("sink none", "sink", ("none",), ("kafka", "kafkalog", "kafkalog-ntx", "noop", "python")),
        ("sink zstd", "sink", ("zstd",), ("kafka", "kafkalog", "kafkalog-ntx")),
    ],
    "2": [("sink trigger", "sink_trigger", (), ("kafka", "kafkalog", "floor"))],
    "3": [
        ("read", "read", (), ("kafka", "kafkalog", "floor")),
        ("read trigger", "read_trigger", (), ("kafka", "kafkalog", "floor")),
    ],
    "4": [("e2e", "e2e", (), ("kafka", "kafkalog"))],
}
LABELS = {
    "sink none": "1. sink, {rows:,} rows in one micro-batch, uncompressed: rows/s",
    "sink zstd": "1. sink, {rows:,} rows in one micro-batch, zstd (level 3): rows/s",
    "sink trigger": "2. sink, median trigger ({batches} x {per:,} rows): ms",
    "read": "3. batch read of the {rows:,} rows into noop: rows/s",
    "read trigger": "3. readStream, median trigger ({batches} x {per:,} records) into noop: ms",
    "e2e": "4. end to end, row created in the writer -> row read by the reader ({e2e:,} rows, a writer trigger "
    "every {iv} ms): p50 ms",
}
PATHS = {
    "kafka": {"sink": "kafka sink -> broker", "read": "kafka source <- broker", "e2e": "kafka sink->broker->source"},
    "kafkalog": {"sink": "kafkalog sink -> ROOT", "read": "kafkalog <- ROOT", "e2e": "kafkalog sink->ROOT->readStream"},
    "kafkalog-ntx": {"sink": "kafkalog, transactional=false"},
    "noop": {"sink": "noop sink (input only)"},
    "python": {"sink": "python noop (floor)"},
    "floor": {"sink": "python floor sink", "read": "python floor source"},
}


def side(group: str) -> str:
    return "e2e" if group == "e2e" else ("read" if group.startswith("read") else "sink")


def report(results: dict, args) -> None:
    print(
        f"{'':34}{'best':>14}{'range of runs':>22}{'s':>7}{'spark cpu':>10}{'broker cpu':>11}{'others':>8}{'load':>6}"
    )
    for group, runs_by_path in results.items():
        rate = group in ("sink none", "sink zstd", "read")
        print(
            LABELS[group].format(
                rows=args.rows,
                batches=args.batches,
                per=args.rows_per_batch,
                e2e=args.e2e_batches * args.e2e_rows_per_batch,
                iv=args.e2e_interval_ms,
            )
        )
        best = {}
        for path, runs in runs_by_path.items():
            b = (max if rate else min)(runs, key=lambda r: r["v"])
            best[path] = b
            vals = [r["v"] for r in runs]
            if rate:
                fig, rng = f"{b['v']:,.0f}", f"{min(vals):,.0f}-{max(vals):,.0f}"
            elif group == "e2e":
                fig, rng = f"{b['v']:.0f} (p99 {b['p99']:.0f})", f"p50 {min(vals):.0f}-{max(vals):.0f}"
            else:
                fig, rng = f"{b['v']:.0f}", f"{min(vals):.0f}-{max(vals):.0f}"
            print(
                f"  {PATHS[path][side(group)]:32}{fig:>14}{rng:>22}{b['wall']:7.2f}{b['spark']:10.2f}"
                f"{b['broker']:11.2f}{b['others']:8.2f}{b['load']:6.1f}"
            )
        if "kafka" not in best or "kafkalog" not in best:
            continue
        k, kl = best["kafka"], best["kafkalog"]
        unit = "rows/s" if rate else "ms"
        line = f"  kafkalog / kafka: {kl['v'] / k['v']:.2f}x the {unit}"
        floor = next((p for p in ("python", "floor") if p in best), None)
        if floor:
            line += (
                f" (python floor / kafka: {best[floor]['v'] / k['v']:.2f}x; kafkalog / floor "
                f"{kl['v'] / best[floor]['v']:.2f}x)"
            )
        if "noop" in best:
            line += f"; kafka / noop: {k['v'] / best['noop']['v']:.2f}x"
        if group == "e2e":
            line += (
                f"; p99 kafkalog / kafka: {kl['p99'] / k['p99']:.2f}x; median writer / reader trigger: kafka "
                f"{k['w_trig']:.0f} / {k['r_trig']:.0f} ms, kafkalog {kl['w_trig']:.0f} / {kl['r_trig']:.0f} ms"
            )
        line += (
            f"; cpu s kafka {k['spark']:.2f} + broker {k['broker']:.2f} = {k['spark'] + k['broker']:.2f}, "
            f"kafkalog {kl['spark'] + kl['broker']:.2f}"
        )
        print(line)
        if "kafkalog-ntx" in best:
            n = best["kafkalog-ntx"]
            print(
                f"  transactional=false / kafka: {n['v'] / k['v']:.2f}x the {unit}; the transaction's cost: the "
                f"default has {kl['v'] / n['v']:.2f}x the rows/s of transactional=false (cpu s {kl['spark']:.2f} / "
                f"{n['spark']:.2f})"
            )


def session():
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafkalog-vs-kafka")
        .config("spark.jars", ",".join(jars.connector_jars()))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=None, help="rows of cases 1 and 3 (default 4,000,000)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds after a warm-up (default 2)")
    parser.add_argument("--batches", type=int, default=None, help="micro-batches of cases 2 and 3 (default 16)")
    parser.add_argument("--rows-per-batch", type=int, default=None, help="rows per micro-batch (default 2000)")
    parser.add_argument("--e2e-batches", type=int, default=None, help="case 4's writer micro-batches (default 20)")
    parser.add_argument("--e2e-rows-per-batch", type=int, default=None, help="(default 1000)")
    parser.add_argument("--e2e-interval-ms", type=int, default=500, help="case 4's writer trigger interval")
    parser.add_argument("--quick", action="store_true", help="small sizes and one round: a smoke run")
    parser.add_argument("--cases", default="1,2,3,4", help="which cases, e.g. 1,4")
    parser.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="kafka.KEY=VALUE on the connector's sink (a producer setting)",
    )
    parser.add_argument(
        "--kafka-source-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="kafka.KEY=VALUE on the connector's readers (a consumer setting)",
    )
    parser.add_argument("--dir", default=None, help="scratch directory (default: a fresh temp dir)")
    args = parser.parse_args(argv)
    sizes = {
        "rows": (4_000_000, 200_000),
        "rounds": (2, 1),
        "batches": (16, 6),
        "rows_per_batch": (2000, 2000),
        "e2e_batches": (20, 5),
        "e2e_rows_per_batch": (1000, 500),
    }
    for key, (full, quick) in sizes.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    for n in (args.rows_per_batch, args.e2e_rows_per_batch):
        if n % 2:
            parser.error("rows per batch must be even (2 tasks per micro-batch)")
    cases = [c.strip() for c in args.cases.split(",")]
    if any(c not in CASES for c in cases):
        parser.error(f"--cases takes some of {','.join(CASES)}")
    groups = [g for c in cases for g in CASES[c]]

    # `timeout` or kill: unwind through the finally below, which stops the broker (it runs in a session of its own)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start, load0 = time.perf_counter(), os.getloadavg()
    busy0, ours0 = machine_busy_seconds(), tree_cpu_seconds(os.getpid())
    tool_classes()
    work = tempfile.mkdtemp(prefix="kafkalog-vs-kafka-", dir=args.dir)
    broker = UserBroker(os.path.join(work, "broker"), BROKER_CONFIGS)
    spark = None
    try:
        broker.start()
        spark = session()
        bench = VsKafka(spark, broker, args, work)
        fresh_per_round = sum(
            1 for _, fn, _, paths in groups if "kafka" in paths and fn in ("sink", "sink_trigger", "e2e")
        )
        bench.create_topics(
            (["src", "lat-src"] if "3" in cases else [])
            + [f"run-{i}" for i in range(fresh_per_round * (args.rounds + 1))]
        )
        import pyspark

        print(
            f"kafkalog vs Spark's Kafka connector (spark-sql-kafka-0-10 {jars.connector_version(pyspark.__version__)}"
            f" on pyspark {pyspark.__version__}) and a local Kafka 4.4.0 broker (KRaft, one node, default "
            f"flush: no fsync per write); {PARTITIONS} partitions per topic; local[2] on {os.cpu_count()} cores; "
            f"best of {args.rounds} round(s) after a warm-up; load average {load0[0]:.1f} / {load0[1]:.1f} / "
            f"{load0[2]:.1f} at the start"
            + (f"; connector sink options: {args.kafka_option}" if args.kafka_option else "")
            + (f"; connector source options: {args.kafka_source_option}" if args.kafka_source_option else "")
        )
        if "3" in cases:
            bench.write_sources()
        results: dict = {g: {p: [] for p in paths} for g, _, _, paths in groups}
        for rnd in range(args.rounds + 1):  # round 0 warms up: JIT, Python workers, numba's cache, the broker
            for group, fn, extra, paths in groups:
                for path in paths if rnd % 2 == 0 else paths[::-1]:
                    run = getattr(bench, fn)(path, *extra)
                    if rnd:
                        results[group][path].append(run)
        bench.check_topics()
        report(results, args)
        load1 = os.getloadavg()
        wall = time.perf_counter() - t_start
        others = machine_busy_seconds() - busy0 - (tree_cpu_seconds(os.getpid()) - ours0)
        print(
            f"load average {load1[0]:.1f} / {load1[1]:.1f} / {load1[2]:.1f} at the end; whole run {wall:.0f} s, "
            f"in which other processes took about {max(0.0, others):.0f} CPU s ({max(0.0, others) / wall:.2f} "
            f"of {os.cpu_count()} cores)"
        )
    finally:
        try:
            if spark is not None:
                spark.stop()
        finally:
            try:
                broker.stop()
            finally:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
