"""Micro-batch latency: the kafkalog sink and readStream beside Spark's parquet file sink / file stream
source and beside the Python floors, per trigger, in one SparkSession (and in fresh ones).

Run: python benchmarks/latency.py [--rounds R] [--batches B] [--rows-per-batch N] [--breakdown]

Rows (the same for every peer): key 16 bytes ("key-%012d"), value 100 bytes (50 random hex chars and 50
zeros), a timestamp. Each query is trigger(availableNow=True) over B micro-batches of N rows in 2 tasks.
  sink    input: a parquet file stream (maxFilesPerTrigger=2, N/2 rows per file) into
          kafkalog (a 2-partition topic, uncompressed) | parquet (Spark's file sink) |
          floor (a Python DataSource whose DataSourceStreamArrowWriter drops its Arrow batches and
          whose commit does nothing: what any Python sink pays before it writes a byte)
  source  kafkalog readStream (2-partition topic, maxOffsetsPerTrigger=N) | parquet file stream source
          (the Kafka source's columns, maxFilesPerTrigger=2) | floor (a DataSourceStreamReader yielding
          the same columns from memory), each into Spark's noop sink.
Every figure is Spark's own query.recentProgress[i]["durationMs"]["triggerExecution"]:
  fresh       the first trigger of the very first query of a process (JVM, Python daemon and workers,
              imports: all cold). Each is its own subprocess (this script with --fresh).
  warm-up     the first trigger of a query run in a fresh process after a query of the floor (the floor
              sink for sinks, the floor source for sources): workers up, pyspark imported; the query's
              own modules, numba kernels and files are not.
  median      the median trigger after the first two, in one long-lived SparkSession where every kind
              runs once to warm up and then R interleaved rounds run every kind in turn.
A figure is the best of its R runs (the range is shown); "others" is the CPU seconds every other process
on the machine took during that run (the run's own process tree excluded; 2 cores give 2 CPU seconds per
second), "load" the 1-minute load average. On a shared machine, compare the ratios, not the milliseconds.

--breakdown runs one fresh process with instrumented subclasses of the kafkalog source and sink (defined
here: the package is not touched) that log, per Python process: the process's age when it first runs our
code (worker start + imports + unpickling), each write()/commit()/streamWriter()/reader call, fsyncs (with
the file), LogManager.open_log calls, lock waits and directory listings; then it times the imports
(python -X importtime) and drives RecordStager + commit_staged directly for one micro-batch into 2
partitions, counting fsyncs per step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)

from sink import machine_busy_seconds, tree_cpu_seconds  # noqa: E402

TOPIC = "bench"
SINK_INPUT_SCHEMA = "key STRING, value STRING, timestamp TIMESTAMP"
KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int"
)
KINDS = ("kafkalog", "parquet", "floor")


# ------------------------------------------------------------------------------------------- inputs
def rows(lo: int, hi: int):
    import numpy as np

    i = np.arange(lo, hi, dtype=np.uint64)
    keys = [b"key-%012d" % x for x in range(lo, hi)]
    h = (i * np.uint64(0x9E3779B97F4A7C15)) ^ (i >> np.uint64(7))
    hexes = [
        f"{int(a):016x}{int(a) * 3 % 2**64:016x}{int(a) * 7 % 2**64:016x}{int(a) % 256:02x}"[:50].encode() + b"0" * 50
        for a in h
    ]
    ts_ms = 1_700_000_000_000 + np.arange(lo, hi, dtype=np.int64)
    return keys, hexes, ts_ms


def write_inputs(data: str, batches: int, per_batch: int) -> None:
    """Sink input (parquet files of the string columns), source inputs (a kafkalog topic of 2 partitions
    and parquet files with the Kafka source's columns), all of the same rows, without Spark."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from storage.log_manager import LogManager
    from storage.records.builder import build_records
    from storage.topic_partition import TopicPartition

    half = per_batch // 2
    for d in ("sink_in", "src_pq"):
        os.makedirs(os.path.join(data, d))
    lm = LogManager(os.path.join(data, "src_kl"))
    lm.create_topic(TOPIC, 2)
    logs = [lm.open_log(TopicPartition(TOPIC, p), writable=True) for p in range(2)]
    try:
        for f in range(2 * batches):
            lo = f * half
            keys, values, ts = rows(lo, lo + half)
            pq.write_table(
                pa.table(
                    {
                        "key": pa.array([k.decode() for k in keys]),
                        "value": pa.array([v.decode() for v in values]),
                        "timestamp": pa.array(ts * 1000).cast(pa.timestamp("us")),
                    }
                ),
                os.path.join(data, "sink_in", f"part-{f:05d}.parquet"),
            )
            p = f % 2
            info = logs[p].append(
                build_records(
                    pa.table(
                        {
                            "key": pa.array(keys, pa.binary()),
                            "value": pa.array(values, pa.binary()),
                            "timestamp": pa.array(ts),
                        }
                    )
                )
            )
            pq.write_table(
                pa.table(
                    {
                        "key": pa.array(keys, pa.binary()),
                        "value": pa.array(values, pa.binary()),
                        "topic": pa.array([TOPIC] * half),
                        "partition": pa.array(np.full(half, p, np.int32)),
                        "offset": pa.array(np.arange(info.first_offset, info.last_offset + 1, dtype=np.int64)),
                        "timestamp": pa.array(ts * 1000).cast(pa.timestamp("us", tz="UTC")),
                        "timestampType": pa.array(np.zeros(half, np.int32)),
                    }
                ),
                os.path.join(data, "src_pq", f"part-{f:05d}.parquet"),
            )
            t = time.time() - 1000 + f  # the file source takes files oldest first
            for d in ("sink_in", "src_pq"):
                os.utime(os.path.join(data, d, f"part-{f:05d}.parquet"), (t, t))
    finally:
        for log in logs:
            log.close()


# ------------------------------------------------------------------------------------------- floors
def register_floors(spark, batches: int, per_batch: int) -> None:
    """format("floor_sink"): drops its Arrow batches, commit() does nothing. format("floor_source"): the
    Kafka source's columns for `batches` micro-batches of `per_batch` rows (2 partitions), from memory."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadAllAvailable, SupportsTriggerAvailableNow

    class _Drop(DataSourceStreamArrowWriter):
        def write(self, iterator):
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages, batchId):
            pass

        def abort(self, messages, batchId):
            pass

    class _Part(InputPartition):
        def __init__(self, lo, hi, p):
            self.lo, self.hi, self.p = lo, hi, p

    class _Memory(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def initialOffset(self):
            return {"batch": 0}

        def prepareForTriggerAvailableNow(self):
            pass

        def getDefaultReadLimit(self):
            return ReadAllAvailable()

        def latestOffset(self, start=None, limit=None):
            at = 0 if start is None else start["batch"]
            return {"batch": min(batches, at + 1)}  # one micro-batch per trigger, as the others

        def partitions(self, start, end):
            half = per_batch // 2
            return [
                _Part(b * per_batch + p * half, b * per_batch + (p + 1) * half, p)
                for b in range(start["batch"], end["batch"])
                for p in range(2)
            ]

        def read(self, part):
            import numpy as np
            import pyarrow as pa

            keys, values, ts = rows(part.lo, part.hi)
            n = part.hi - part.lo
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(keys, pa.binary()),
                    pa.array(values, pa.binary()),
                    pa.array([TOPIC] * n),
                    pa.array(np.full(n, part.p, np.int32)),
                    pa.array(np.arange(part.lo, part.hi, dtype=np.int64)),
                    pa.array(ts * 1000).cast(pa.timestamp("us", tz="UTC")),
                    pa.array(np.zeros(n, np.int32)),
                ],
                names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
            )

        def commit(self, end):
            pass

    class FloorSink(DataSource):
        @classmethod
        def name(cls):
            return "floor_sink"

        def streamWriter(self, schema, overwrite):
            return _Drop()

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "floor_source"

        def schema(self):
            return KAFKA_SCHEMA

        def streamReader(self, schema):
            return _Memory()

    spark.dataSource.register(FloorSink)
    spark.dataSource.register(FloorSource)
    # kafkalog is registered like the floors: without register(), format("kafkalog") first makes Spark look
    # up every pyspark_* module in a new Python process, once per session; that is measured on its own
    # (discovery_ms), not charged to the first micro-batch
    import kafkalog_ds

    kafkalog_ds.register(spark)


def discovery_ms() -> float:
    """A fresh session's first resolution of format("kafkalog") with no register() call (Spark's lookup of
    pyspark_* data sources, then creating the source), minus the second resolution's."""
    spark = session("kafkalog-discovery")
    try:
        spark.range(1).count()
        times = []
        for _ in range(2):
            t = time.perf_counter()
            spark.read.format("kafkalog").option("subscribe", "t").load("/nonexistent-kafkalog-root")
            times.append(time.perf_counter() - t)
        return 1000 * (times[0] - times[1])
    finally:
        spark.stop()


# ------------------------------------------------------------------------ instrumented kafkalog (--breakdown)
def register_timed(spark, log_path: str) -> None:
    """format("kafkalog_timed"): KafkaLogDataSource with every call the sink and the source make timed and
    logged (one JSON line per event) by whichever Python process runs it. Subclasses defined in this script
    (pickled by value), wrappers installed in each process at its first call: the package is not edited."""

    def probe():
        """Install the counters once per process; return (state dict, emit function)."""
        import json as _json
        import os as _os
        import sys as _sys
        import time as _time

        st = getattr(_sys, "_kl_latency", None)
        if st is None:
            with open("/proc/self/stat") as f:
                start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/stat") as f:
                btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
            st = {
                "born": btime + start_ticks / _os.sysconf("SC_CLK_TCK"),
                "first": _time.time(),
                "calls": 0,
                "fsync": 0,
                "fsync_files": {},
                "listdir": 0,
                "open_log": 0,
                "open_log_s": 0.0,
                "lock_s": 0.0,
                "locks": 0,
                "numba_compiled": 0,
            }
            _sys._kl_latency = st
            st["had_numba"] = "numba" in _sys.modules
            real_fsync = _os.fsync

            def fsync(fd):
                st["fsync"] += 1
                try:
                    name = _os.path.basename(_os.readlink(f"/proc/self/fd/{fd}"))
                    kind = name.rsplit(".", 1)[-1] if "." in name else name
                except OSError:
                    kind = "?"
                if kind.isdigit() or len(kind) > 24:
                    kind = "dir"
                st["fsync_files"][kind] = st["fsync_files"].get(kind, 0) + 1
                return real_fsync(fd)

            _os.fsync = fsync
        if not st.get("patched") and "storage.log_manager" in _sys.modules:  # after the package's import
            st["patched"] = True
            from storage.fs import local as lf
            from storage.log_manager import LogManager as LM

            real_list, real_lock, real_open = lf.LocalFileSystem.listdir, lf.LocalFileSystem.lock, LM.open_log

            def listdir(self, path):
                st["listdir"] += 1
                return real_list(self, path)

            import contextlib

            @contextlib.contextmanager
            def lock(self, path, *, timeout=None):
                t = _time.perf_counter()
                with real_lock(self, path, timeout=timeout):
                    st["lock_s"] += _time.perf_counter() - t
                    st["locks"] += 1
                    yield

            def open_log(self, tp, **kw):
                t = _time.perf_counter()
                try:
                    return real_open(self, tp, **kw)
                finally:
                    st["open_log"] += 1
                    st["open_log_s"] += _time.perf_counter() - t

            lf.LocalFileSystem.listdir, lf.LocalFileSystem.lock, LM.open_log = listdir, lock, open_log

        def emit(event, t0, **extra):
            now = _time.time()
            rec = {
                "pid": _os.getpid(),
                "event": event,
                "ms": round((now - t0) * 1000, 1),
                "age_at_first_ms": round((st["first"] - st["born"]) * 1000),
                "call": st["calls"],
                "fsync": st["fsync"],
                "fsync_files": dict(st["fsync_files"]),
                "listdir": st["listdir"],
                "open_log": st["open_log"],
                "open_log_ms": round(st["open_log_s"] * 1000, 1),
                "locks": st["locks"],
                "lock_ms": round(st["lock_s"] * 1000, 1),
                **extra,
            }
            for k in ("fsync", "listdir", "open_log", "open_log_s", "lock_s", "locks"):
                st[k] = 0 if not k.endswith("_s") else 0.0
            st["fsync_files"] = {}
            st["calls"] += 1
            with open(log_path, "a") as f:
                f.write(_json.dumps(rec) + "\n")

        return st, emit

    def numba_state():
        """(kernels compiled or loaded so far in this process, seconds numba spent on them)"""
        import sys as _sys

        n = 0
        for name in (
            "storage.records._record_kernels",
            "storage.records.record_batch",
            "storage.staging.partitioner",
            "storage.index_planner",
        ):
            mod = _sys.modules.get(name)
            for obj in vars(mod).values() if mod else ():
                if hasattr(obj, "signatures") and hasattr(obj, "py_func"):
                    n += len(obj.signatures)
        return n

    def unpickle(blob):
        """The real object, and the ms it took to unpickle it: the package's imports (numba, pyarrow,
        storage...) when this process has not imported it yet."""
        import pickle
        import time as _time

        t = _time.perf_counter()
        obj = pickle.loads(blob)
        probe()  # the storage counters, now that the package is imported
        return obj, round((_time.perf_counter() - t) * 1000, 1)

    from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, DataSourceStreamReader
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    # Wrappers that hold the real writer / reader as pickled bytes: unpickling them (and so importing
    # the package) happens inside a timed call, not before it, in whichever process runs the call.
    class TimedWriter(DataSourceStreamArrowWriter):
        def __init__(self, blob):
            self.blob = blob

        def write(self, iterator):
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            real, imp = unpickle(self.blob)
            k0 = numba_state()
            waited = [0.0]

            def timed(it):
                while True:
                    t = _time.perf_counter()
                    try:
                        b = next(it)
                    except StopIteration:
                        waited[0] += _time.perf_counter() - t
                        return
                    waited[0] += _time.perf_counter() - t
                    yield b

            msg = real.write(timed(iter(iterator)))
            emit(
                "write (executor task)",
                t0,
                unpickle_ms=imp,
                input_wait_ms=round(waited[0] * 1000, 1),
                numba_kernels_new=numba_state() - k0,
            )
            return msg

        def commit(self, messages, batchId):
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            real, imp = unpickle(self.blob)
            k0 = numba_state()
            real.commit(messages, batchId)
            emit(
                "commit (driver)",
                t0,
                unpickle_ms=imp,
                batch=batchId,
                numba_imported="numba" in __import__("sys").modules,
                numba_kernels_new=numba_state() - k0,
            )

        def abort(self, messages, batchId):
            unpickle(self.blob)[0].abort(messages, batchId)

    class TimedReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, blob):
            self.blob = blob
            self.real = None

        def _call(self, name, *args):
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            imp = None
            if self.real is None:
                self.real, imp = unpickle(self.blob)
            out = getattr(self.real, name)(*args)
            emit(f"reader.{name} (driver)", t0, **({"unpickle_ms": imp} if imp is not None else {}))
            return out

        def initialOffset(self):
            return self._call("initialOffset")

        def prepareForTriggerAvailableNow(self):
            return self._call("prepareForTriggerAvailableNow")

        def getDefaultReadLimit(self):
            return self._call("getDefaultReadLimit")

        def latestOffset(self, start=None, limit=None):
            return self._call("latestOffset", start, limit)

        def partitions(self, start, end):
            return self._call("partitions", start, end)

        def commit(self, end):
            return self._call("commit", end)

        def read(self, partition):
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            real, imp = unpickle(self.blob)
            k0 = numba_state()
            n = 0
            for b in real.read(partition):
                n += b.num_rows
                yield b
            emit("reader.read (executor task)", t0, unpickle_ms=imp, rows=n, numba_kernels_new=numba_state() - k0)

    class TimedKafkaLog(DataSource):
        @classmethod
        def name(cls):
            return "kafkalog_timed"

        def _real(self, event):
            import time as _time

            t = _time.perf_counter()
            from python_datasource.data_source import KafkaLogDataSource

            probe()
            return KafkaLogDataSource(self.options), round((_time.perf_counter() - t) * 1000, 1)

        def schema(self):
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            real, imp = self._real("schema")
            out = real.schema()
            emit("schema() (driver)", t0, import_ms=imp)
            return out

        def streamWriter(self, schema, overwrite):
            import pickle
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            real, imp = self._real("streamWriter")
            w = real.streamWriter(schema, overwrite)
            emit("streamWriter() (driver)", t0, import_ms=imp)
            return TimedWriter(pickle.dumps(w))

        def streamReader(self, schema):
            import pickle
            import time as _time

            t0 = _time.time()
            st, emit = probe()
            real, imp = self._real("streamReader")
            r = real.streamReader(schema)
            emit("streamReader() (driver)", t0, import_ms=imp)
            return TimedReader(pickle.dumps(r))

    spark.dataSource.register(TimedKafkaLog)


# ------------------------------------------------------------------------------------------- queries
class Runner:
    def __init__(self, spark, data: str, batches: int, per_batch: int):
        self.spark, self.data, self.batches, self.per_batch = spark, data, batches, per_batch
        self.n = 0
        register_floors(spark, batches, per_batch)

    def run(self, what: str) -> dict:
        """One availableNow query, "sink:KIND" or "source:KIND": per-trigger triggerExecution (ms) and
        the CPU other processes took meanwhile."""
        side, kind = what.split(":")
        self.n += 1
        out = os.path.join(self.data, "out", f"{os.getpid()}-{self.n}-{side}-{kind}")
        ckpt = out + ".ckpt"
        sp = self.spark
        if side == "sink":
            df = (
                sp.readStream.schema(SINK_INPUT_SCHEMA)
                .option("maxFilesPerTrigger", 2)
                .parquet(os.path.join(self.data, "sink_in"))
            )
            w = df.writeStream.option("checkpointLocation", ckpt).trigger(availableNow=True)
            if kind.startswith("kafkalog"):
                w = w.format(kind).option("topic", TOPIC).option("partitions", 2)
            elif kind == "parquet":
                w = w.format("parquet")
            else:
                w = w.format("floor_sink")
            start = lambda: w.start(out)  # noqa: E731
        else:
            if kind.startswith("kafkalog"):
                df = (
                    sp.readStream.format(kind)
                    .option("subscribe", TOPIC)
                    .option("startingOffsets", "earliest")
                    .option("maxOffsetsPerTrigger", self.per_batch)
                    .load(os.path.join(self.data, "src_kl"))
                )
            elif kind == "parquet":
                df = (
                    sp.readStream.schema(KAFKA_SCHEMA)
                    .option("maxFilesPerTrigger", 2)
                    .parquet(os.path.join(self.data, "src_pq"))
                )
            else:
                df = sp.readStream.format("floor_source").load()
            w = df.writeStream.format("noop").option("checkpointLocation", ckpt).trigger(availableNow=True)
            start = w.start
        me = os.getpid()
        cpu0, busy0, t0 = tree_cpu_seconds(me), machine_busy_seconds(), time.perf_counter()
        q = start()
        q.awaitTermination()
        wall = time.perf_counter() - t0
        cpu = tree_cpu_seconds(me) - cpu0
        others = max(0.0, machine_busy_seconds() - busy0 - cpu)
        if q.exception() is not None:
            raise RuntimeError(f"{what} failed: {q.exception()}")
        progress = [p for p in q.recentProgress if p["numInputRows"]]
        got = sum(p["numInputRows"] for p in progress)
        if got != self.batches * self.per_batch or len(progress) != self.batches:
            raise RuntimeError(
                f"{what}: {len(progress)} micro-batches of {got} rows in all, expected "
                f"{self.batches} of {self.per_batch}"
            )
        return {
            "what": what,
            "triggers": [p["durationMs"]["triggerExecution"] for p in progress],
            "wall": wall,
            "cpu": cpu,
            "others": others,
            "load": os.getloadavg()[0],
        }


def session(app: str):
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def fresh_main(args) -> None:
    """--fresh: one new SparkSession running the given queries in order; one JSON line per query."""
    spark = session("kafkalog-latency-fresh")
    try:
        runner = Runner(spark, args.data, args.batches, args.rows_per_batch)
        if args.timed_log:
            register_timed(spark, args.timed_log)
        for what in args.fresh.split(","):
            print("RESULT " + json.dumps(runner.run(what)), flush=True)
    finally:
        spark.stop()


def in_fresh_process(args, data: str, queries: list[str], timed_log: str | None = None) -> list[dict]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--fresh",
        ",".join(queries),
        "--data",
        data,
        "--batches",
        str(args.batches),
        "--rows-per-batch",
        str(args.rows_per_batch),
    ]
    if timed_log:
        cmd += ["--timed-log", timed_log]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    results = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or len(results) != len(queries):
        raise RuntimeError(f"fresh process {queries} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return results


def median_after_two(triggers: list[int]) -> float:
    return statistics.median(triggers[2:] if len(triggers) > 2 else triggers)


# ------------------------------------------------------------------------------------------- report
def show(table: dict, label: str, metric, kinds=KINDS) -> dict:
    """One row per kind: best of its runs (range), others' CPU of the best run; returns the best."""
    best = {}
    for kind in kinds:
        runs = table.get(kind)
        if not runs:
            continue
        vals = [(metric(r), r) for r in runs]
        v, r = min(vals, key=lambda x: x[0])
        best[kind] = v
        lo, hi = min(x for x, _ in vals), max(x for x, _ in vals)
        print(
            f"  {label:36}{kind:10}{v:9.0f} ms  (runs {lo:.0f}-{hi:.0f})  others {r['others']:5.1f} cpu s "
            f"in {r['wall']:5.1f} s, load {r['load']:.1f}"
        )
    if "kafkalog" in best:
        ratios = [f"/ {k} {best['kafkalog'] / best[k]:.1f}x" for k in ("floor", "parquet") if best.get(k)]
        print(f"  {'':36}kafkalog  " + ", ".join(ratios))
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--rows-per-batch", type=int, default=2000)
    parser.add_argument("--breakdown", action="store_true", help="instrumented run: where the time goes")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a fresh temp dir)")
    parser.add_argument("--fresh", help=argparse.SUPPRESS)  # internal: queries for one fresh process
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--timed-log", help=argparse.SUPPRESS)
    parser.add_argument("--discovery", action="store_true", help=argparse.SUPPRESS)  # internal
    args = parser.parse_args(argv)
    if args.rows_per_batch % 2:
        parser.error("--rows-per-batch must be even (2 tasks per micro-batch)")
    if args.fresh:
        fresh_main(args)
        return
    if args.discovery:
        print(f"RESULT {discovery_ms():.0f}")
        return
    work = tempfile.mkdtemp(prefix="kafkalog-latency-", dir=args.dir)
    try:
        write_inputs(work, args.batches, args.rows_per_batch)
        if args.breakdown:
            breakdown(args, work)
            return
        measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(args, work: str) -> None:
    t_start, load0 = time.perf_counter(), os.getloadavg()
    print(
        f"{args.batches} micro-batches of {args.rows_per_batch} rows (16-byte key, 100-byte value, timestamp) "
        f"in 2 tasks each; local[2] on {os.cpu_count()} cores; {args.rounds} round(s); Spark's "
        f"triggerExecution; load average {load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f} at the start"
    )
    fresh: dict = {"sink": {}, "source": {}}
    warm: dict = {"sink": {}, "source": {}}
    median: dict = {"sink": {}, "source": {}}
    # fresh processes, interleaved per round: (queries, where each result goes)
    plan = [
        (["sink:kafkalog"], [fresh["sink"]]),
        (
            ["sink:floor", "sink:floor", "sink:parquet", "sink:kafkalog"],
            [fresh["sink"], warm["sink"], warm["sink"], warm["sink"]],
        ),
        (["sink:parquet"], [fresh["sink"]]),
        # a source's warm-up is the floor source: a sink query starts none of the Python source runners
        (
            ["source:floor", "source:floor", "source:parquet", "source:kafkalog"],
            [None, warm["source"], warm["source"], warm["source"]],
        ),
    ]
    for _ in range(args.rounds):
        for queries, dests in plan:
            for r, dest in zip(in_fresh_process(args, work, queries), dests, strict=False):
                if dest is not None:
                    dest.setdefault(r["what"].split(":")[1], []).append(r)
    spark = session("kafkalog-latency")
    try:
        runner = Runner(spark, work, args.batches, args.rows_per_batch)
        order = [f"{side}:{k}" for side in ("sink", "source") for k in ("floor", "parquet", "kafkalog")]
        for what in order:  # warm-up (the floors first)
            runner.run(what)
        for rnd in range(args.rounds):
            for what in order if rnd % 2 == 0 else order[::-1]:
                r = runner.run(what)
                side, kind = what.split(":")
                median[side].setdefault(kind, []).append(r)
    finally:
        spark.stop()
    first = lambda r: r["triggers"][0]  # noqa: E731
    found = subprocess.run([sys.executable, os.path.abspath(__file__), "--discovery"], capture_output=True, text=True)
    lookups = [ln[7:] for ln in found.stdout.splitlines() if ln.startswith("RESULT ")]
    print(
        f'discovery: format("kafkalog") with no register() first costs {lookups[0] if lookups else "?"} ms more '
        f"in a session (Spark's lookup of pyspark_* modules, once per session; below, every source is "
        f"registered)"
    )
    print("sink (writeStream), first micro-batch:")
    show(fresh["sink"], "fresh process (first query)", first)
    show(warm["sink"], "after a warm-up query of the floor", first)
    print("sink, median trigger after the first two (one long-lived session):")
    show(median["sink"], "median triggerExecution", lambda r: median_after_two(r["triggers"]))
    show(median["sink"], "first trigger, warm session", first)
    print("source (readStream into noop), first micro-batch:")
    show(warm["source"], "after a warm-up query of the floor", first)
    print("source, median trigger after the first two (one long-lived session):")
    show(median["source"], "median triggerExecution", lambda r: median_after_two(r["triggers"]))
    show(median["source"], "first trigger, warm session", first)
    load1 = os.getloadavg()
    print(
        f"load average {load1[0]:.1f} / {load1[1]:.1f} / {load1[2]:.1f} at the end; whole run "
        f"{time.perf_counter() - t_start:.0f} s"
    )


# ------------------------------------------------------------------------------------------- breakdown
def breakdown(args, work: str) -> None:
    load0 = os.getloadavg()[0]
    log_path = os.path.join(work, "timed.jsonl")
    results = in_fresh_process(
        args, work, ["sink:floor", "sink:kafkalog_timed", "source:kafkalog_timed"], timed_log=log_path
    )
    print(f"instrumented fresh process (after a floor warm-up), load {load0:.1f}:")
    for r in results:
        t = r["triggers"]
        print(
            f"  {r['what']:22} triggers (ms): {t[0]}, {t[1]}, median after two {median_after_two(t):.0f}; "
            f"others {r['others']:.1f} cpu s in {r['wall']:.1f} s"
        )
    events = [json.loads(line) for line in open(log_path)]
    first_seen: dict = {}
    print(f"  {'event':58}{'pid':>7}{'ms':>8}{'age@1st':>9}  counters")
    for e in events:
        new = e["pid"] not in first_seen
        first_seen.setdefault(e["pid"], e)
        extra = {k: v for k, v in e.items() if k not in ("pid", "event", "ms", "age_at_first_ms", "call") and v}
        print(
            f"  {e['event'][:58]:58}{e['pid']:>7}{e['ms']:>8.1f}{e['age_at_first_ms'] if new else '':>9}  "
            f"{json.dumps(extra)}"
        )
    pids = {}
    for e in events:
        pids.setdefault(e["event"].split(" (")[0], set()).add(e["pid"])
    print("  distinct Python processes per call: " + ", ".join(f"{k} {len(v)}" for k, v in pids.items()))
    print("import times, python -X importtime (cumulative ms, fresh interpreter, best of 3):")

    def top_level_us(stmt: str) -> int:
        p = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", stmt],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": ROOT},
        )
        total = 0
        for line in p.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                _, cum, name = line[12:].split("|")
                if cum.strip().isdigit() and not name.startswith("  "):  # " name": a top-level import
                    total += int(cum)
        return total

    base = min(top_level_us("pass") for _ in range(3))  # the interpreter's own start-up imports
    for stmt in (
        "import pyspark.sql.datasource",
        "import numpy",
        "import pyarrow",
        "import numba",
        "import storage.staging.staged_commit",
        "import python_datasource.data_source",
    ):
        best = min(top_level_us(stmt) for _ in range(3)) - base
        print(f"  {stmt:44}{best / 1000:8.0f} ms")
    direct = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--direct", work, "--rows-per-batch", str(args.rows_per_batch)],
        capture_output=True,
        text=True,
    )
    print(direct.stdout + direct.stderr[-2000:])


def direct_main(work: str, per_batch: int) -> None:
    """RecordStager + commit_staged for one micro-batch into 2 partitions, in a fresh process: time, fsyncs
    (by file kind), directory listings and open_log calls per step, batch after batch."""
    t0 = time.perf_counter()
    import numpy  # noqa: F401
    import pyarrow as pa

    t1 = time.perf_counter()
    import numba  # noqa: F401

    t2 = time.perf_counter()
    from storage.log_manager import LogManager
    from storage.records.record_batch import CompressionType
    from storage.staging.record_stager import RecordStager
    from storage.staging.staged_commit import commit_staged

    t3 = time.perf_counter()
    print(
        f"direct, fresh process: import numpy+pyarrow {1e3 * (t1 - t0):.0f} ms, numba {1e3 * (t2 - t1):.0f} ms, "
        f"storage (log_manager, stager, commit) {1e3 * (t3 - t2):.0f} ms"
    )
    counts = {"fsync": 0, "files": {}}
    real = os.fsync

    def fsync(fd):
        counts["fsync"] += 1
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            name = "?"
        kind = name.rsplit(".", 1)[-1] if "." in name and not name.startswith(".kafkalog") else name
        kind = "partition/staging dir" if kind.startswith((TOPIC, ".kafkalog")) else kind
        counts["files"][kind] = counts["files"].get(kind, 0) + 1
        return real(fd)

    os.fsync = fsync
    root = os.path.join(work, "direct")
    keys, values, ts = rows(0, per_batch)
    table = pa.table(
        {"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()), "timestamp": pa.array(ts)}
    )
    lm = LogManager(root)
    lm.get_or_create_topic(TOPIC, 2)
    for batch in range(6):

        def snap():
            c = (counts["fsync"], dict(counts["files"]))
            counts["fsync"], counts["files"] = 0, {}
            return c

        snap()
        a = time.perf_counter()
        stagers = []
        for task in range(2):  # two tasks, half the rows each
            st = RecordStager(
                LogManager(root),
                7,
                topic=TOPIC,
                compression=CompressionType.NONE,
                new_topic_partitions=2,
                task_index=task,
            )
            st.add(table.slice(task * per_batch // 2, per_batch // 2))
            stagers.append(st.finish())
        b = time.perf_counter()
        fs_stage = snap()
        commit_staged(LogManager(root), 7, batch, stagers)
        c = time.perf_counter()
        fs_commit = snap()
        print(
            f"  batch {batch}: stage 2 tasks {1e3 * (b - a):7.1f} ms, fsyncs {fs_stage[0]} {fs_stage[1]}; "
            f"commit 2 partitions {1e3 * (c - b):6.1f} ms, fsyncs {fs_commit[0]} {fs_commit[1]}"
        )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--direct":
        per = int(sys.argv[sys.argv.index("--rows-per-batch") + 1]) if "--rows-per-batch" in sys.argv else 2000
        direct_main(sys.argv[2], per)
    else:
        main()
