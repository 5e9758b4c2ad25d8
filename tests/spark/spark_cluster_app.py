"""The Spark driver of tests/spark/test_spark_cluster.py: `python tests/spark/spark_cluster_app.py CONTROL_DIR`.

Runs the phases listed in CONTROL_DIR/spec.json, in order, in ONE SparkSession on the spec's master
(`local-cluster[2,1,1024]`: a standalone master and worker inside the driver's JVM, and two executor JVMs
on this machine, which the worker relaunches when they die). The test drives it through files in
CONTROL_DIR (a control channel on local disk; the data itself goes only where the phase's ROOT says):

    spec.json            (test -> app)  {"master": ..., "phases": [{"kind": ..., ...}, ...]}
    limit-<source>       (test -> app)  rows the counter source <source> may hand out (grows as the test feeds)
    finish-<source>      (test -> app)  stop the phase's stream once every row up to the limit is committed
    go-passes            (test -> app)  the maintain phase may start its maintenance passes (the test runs the
                                        maintenance CLI first: one maintenance job per log dir at a time)
    hold                 (test -> tasks) while it exists, a counter task that starts writes held-<...>.json
                                        (its executor id and JVM pid) and waits for the file's removal
    status.json          (app -> test)  every ~0.25 s: the phase running, the executors Spark knows
                                        (live and dead: task counts), maintenance passes so far
    result.json          (app -> test)  what each phase saw (rows read back, executors, task failures)

Input is `clustertest_counter`, a Python streaming source defined here: row i (0 <= i < limit) has
value str(i) and a key by the spec's key scheme; each micro-batch takes at most batch_rows new rows, split
into `tasks` ranges, one task each. Rows are computed from their offsets on the executors (nothing is
read there), so a replayed micro-batch yields the same rows in the same tasks. Each row carries headers
saying which executor (id@host:JVM pid) and which task attempt (stage.partition.attempt) produced it.

Phase kinds:
    sink      counter -> writeStream.format("kafkalog") into ROOT, until finish-<source>
    read      spark.read and spark.readStream (Trigger.AvailableNow, memory sink) of a topic, each row tagged
              with the executor that read it; waits for two live executors first
    maintain  a counter -> kafkalog stream into ROOT; once go-passes exists, kafkalog_ds.maintenance.run_once(
              ROOT, spark=...) passes run on the cluster beside it, until finish-<source>; then one more pass
              after the stream stops
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

HANG_S = 600  # a phase waiting on the test (or a held task waiting for its release) gives up after this
EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"
COUNTER_SCHEMA = "key string, value string, headers array<struct<key:string,value:binary>>"


# ---- helpers shared with the test (no Spark needed) ----


def write_json(path: str, obj) -> None:
    """Atomically (a reader never sees half a file)."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def key_of(scheme: str, i: int) -> str | None:
    """The key of row i. events: null every 5th row (round-robin routing), else i % 11 (murmur2 routing).
    changelog: every 4th row updates one of 7 hot keys (compaction drops their old versions), the others
    have a key of their own (compaction keeps them all)."""
    if scheme == "events":
        return None if i % 5 == 0 else str(i % 11)
    if scheme == "changelog":
        return f"hot-{i % 7}" if i % 4 == 0 else f"row-{i}"
    raise ValueError(scheme)


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat fields after the command name (here, not from spark_procs: executors run this)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def proc_cmdline(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().split(b"\0")


def executor_of_cmdline(cmd: list[bytes]) -> str | None:
    """The executor id of a CoarseGrainedExecutorBackend JVM's command line, else None."""
    if EXECUTOR_MAIN not in cmd or b"--executor-id" not in cmd:
        return None
    return cmd[cmd.index(b"--executor-id") + 1].decode()


def executor_identity() -> tuple[str, int]:
    """(executor id, JVM pid) of the executor this Python worker serves: the first ancestor process
    whose command line is an executor's. ("?", 0) outside an executor."""
    pid = os.getpid()
    while pid > 1:
        try:
            eid = executor_of_cmdline(proc_cmdline(pid))
            if eid is not None:
                return eid, pid
            pid = int(proc_stat(pid)[1])
        except (OSError, ValueError, IndexError):
            break
    return "?", 0


def task_tag() -> tuple[str, str]:
    """('<executor id>@<host>:<executor JVM pid>', '<stage>.<partition>.<attempt>') of the running task."""
    import socket

    from pyspark import TaskContext

    eid, jvm = executor_identity()
    ctx = TaskContext.get()
    task = f"{ctx.stageId()}.{ctx.partitionId()}.{ctx.attemptNumber()}" if ctx is not None else "?"
    return f"{eid}@{socket.gethostname()}:{jvm}", task


def hold_if_asked(control: str, executor: str, task: str) -> None:
    """While CONTROL/hold exists, say so (held-<task>.json) and wait: the test kills this executor or the
    driver at a moment it knows a task is running (before its sink has staged anything)."""
    hold = os.path.join(control, "hold")
    if not os.path.exists(hold):
        return
    write_json(
        os.path.join(control, f"held-{task}.json"),
        {"executor": executor, "task": task, "pid": os.getpid(), "jvm": int(executor.rsplit(":", 1)[1])},
    )
    deadline = time.monotonic() + HANG_S
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.02)


# ---- the counter source ----


class CounterPartition(InputPartition):
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi


class CounterSource(DataSource):
    """format("clustertest_counter"): options limit_file, control_dir, keys, batch_rows, tasks."""

    @classmethod
    def name(cls):
        return "clustertest_counter"

    def schema(self):
        return COUNTER_SCHEMA

    def streamReader(self, schema):
        return CounterStream(dict(self.options))


class CounterStream(DataSourceStreamReader):
    def __init__(self, options: dict):
        self.limit_file = options["limit_file"]  # (Spark hands options over with their names in lower case)
        self.control = options["control_dir"]
        self.keys = options.get("keys", "events")
        self.batch_rows = int(options.get("batch_rows", "200"))
        self.tasks = int(options.get("tasks", "2"))

    def initialOffset(self):
        return {"row": 0}

    def latestOffset(self, start, limit):
        try:
            with open(self.limit_file) as f:
                available = int(f.read())
        except (OSError, ValueError):
            available = 0
        lo = start["row"] if start else 0
        return {"row": max(lo, min(available, lo + self.batch_rows))}

    def partitions(self, start, end):
        lo, hi = start["row"], end["row"]
        step = -(-(hi - lo) // self.tasks) if hi > lo else 1
        return [CounterPartition(a, min(hi, a + step)) for a in range(lo, hi, step)]

    def read(self, partition):
        executor, task = task_tag()
        hold_if_asked(self.control, executor, task)
        headers = [("executor", executor.encode()), ("task", task.encode())]
        for i in range(partition.lo, partition.hi):
            yield key_of(self.keys, i), str(i), headers


# ---- the driver ----


class App:
    def __init__(self, control: str):
        self.control = control
        self.spec = read_json(os.path.join(control, "spec.json"))
        self.phase = "starting"
        self.maintenance = {"passes": 0, "cleaned": 0, "records_dropped": 0, "errors": []}
        self.results: dict = {}
        self._stop = threading.Event()
        self.spark = None

    def log(self, msg: str) -> None:
        print(f"app[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # -- status --
    def executors(self) -> dict:
        """{executor id: {...}} of every executor Spark's status store knows, live or dead (not the driver)."""
        lst = self.spark.sparkContext._jsc.sc().statusStore().executorList(False)
        out = {}
        for i in range(lst.size()):
            e = lst.apply(i)
            if e.id() == "driver":
                continue
            out[e.id()] = {
                "active": bool(e.isActive()),
                "running": e.activeTasks(),
                "total": e.totalTasks(),
                "completed": e.completedTasks(),
                "failed": e.failedTasks(),
            }
        return out

    def task_failures(self) -> dict:
        """{stage id: failed task attempts} over every stage so far (the status tracker's last attempt of each;
        stage ids are dense from 0). Per stage, because a task lost with its executor is not counted in that
        executor's summary: the executor is gone from the live ones when the task's end is processed."""
        tracker = self.spark.sparkContext.statusTracker()
        failed, sid, misses = {}, 0, 0
        while misses < 200:
            info = tracker.getStageInfo(sid)
            misses = misses + 1 if info is None else 0
            if info is not None and info.numFailedTasks:
                failed[str(sid)] = info.numFailedTasks
            sid += 1
        return failed

    def write_status(self) -> None:
        write_json(
            os.path.join(self.control, "status.json"),
            {
                "phase": self.phase,
                "executors": self.executors(),
                "maintenance": dict(self.maintenance),
                "time": time.time(),
            },
        )

    def _status_loop(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):  # the session is stopping: the next round, or none
                self.write_status()

    def wait_for(self, cond, what: str) -> None:
        deadline = time.monotonic() + HANG_S
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what} after {HANG_S}s")
            time.sleep(0.05)

    def wait_for_live_executors(self, n: int) -> None:
        self.wait_for(lambda: sum(e["active"] for e in self.executors().values()) >= n, f"{n} live executors")

    # -- phases --
    def counter_stream(self, p: dict):
        source = p["source"]
        return (
            self.spark.readStream.format("clustertest_counter")
            .option("limit_file", os.path.join(self.control, f"limit-{source}"))
            .option("control_dir", self.control)
            .option("keys", p.get("keys", "events"))
            .option("batch_rows", str(p.get("batch_rows", 200)))
            .option("tasks", str(p.get("tasks", 2)))
            .load()
        )

    def start_sink(self, p: dict):
        w = (
            self.counter_stream(p)
            .writeStream.format("kafkalog")
            .option("topic", p["topic"])
            .option("partitions", str(p["partitions"]))
            .option("checkpointLocation", p["checkpoint"])
            .options(**p.get("options", {}))
            .trigger(processingTime=p.get("trigger", "300 milliseconds"))
        )
        return w.start(p["root"])

    def finish_stream(self, q, source: str, during=None) -> dict:
        """Run `during()` repeatedly until the test writes finish-<source>; then commit every row up to
        the limit and stop between two micro-batches."""
        finish = os.path.join(self.control, f"finish-{source}")
        deadline = time.monotonic() + HANG_S
        while not os.path.exists(finish):
            if q.exception() is not None or not q.isActive:
                raise RuntimeError(f"query {source} stopped: {q.exception()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no finish-{source} in {HANG_S}s")
            if during is not None:
                during()
            else:
                time.sleep(0.05)
        q.processAllAvailable()
        q.stop()
        if q.exception() is not None:
            raise RuntimeError(f"query {source} failed: {q.exception()}")
        return {"batches": len(q.recentProgress), "rows": sum(x["numInputRows"] for x in q.recentProgress)}

    def phase_sink(self, p: dict) -> dict:
        q = self.start_sink(p)
        self.log(f"{p['source']}: sink query started")
        out = self.finish_stream(q, p["source"])
        self.log(f"{p['source']}: every row committed, query stopped")
        return out

    def phase_read(self, p: dict) -> dict:
        from pyspark.sql import functions as F

        self.wait_for_live_executors(2)
        tag = F.udf(lambda: task_tag()[0], "string", useArrow=False).asNondeterministic()
        opts = {"subscribe": p["topic"], **p.get("options", {})}
        cols = ["partition", "offset", "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value"]
        before = self.executors()
        df = (
            self.spark.read.format("kafkalog")
            .options(**opts)
            .option("minPartitions", str(p.get("min_partitions", 6)))
            .load(p["root"])
            .selectExpr(*cols)
            .withColumn("executor", tag())
        )
        batch = [list(r) for r in df.collect()]
        self.log(f"read: batch read {len(batch)} rows")
        q = (
            self.spark.readStream.format("kafkalog")
            .options(**opts)
            .option("startingOffsets", "earliest")
            .load(p["root"])
            .selectExpr(*cols)
            .withColumn("executor", tag())
            .writeStream.format("memory")
            .queryName("readback")
            .option("checkpointLocation", p["checkpoint"])
            .trigger(availableNow=True)
            .start()
        )
        if not q.awaitTermination(HANG_S):
            raise TimeoutError("the AvailableNow read did not end")
        if q.exception() is not None:
            raise RuntimeError(f"stream read failed: {q.exception()}")
        stream = [list(r) for r in self.spark.sql("SELECT * FROM readback").collect()]
        self.log(f"read: stream read {len(stream)} rows in {len(q.recentProgress)} micro-batches")
        return {
            "batch": batch,
            "stream": stream,
            "stream_batches": len(q.recentProgress),
            "executors_before": before,
            "executors_after": self.executors(),
        }

    def maintenance_pass(self, p: dict) -> None:
        from kafkalog_ds.maintenance import run_once

        reports = run_once(p["root"], spark=self.spark)
        m = self.maintenance
        m["passes"] += 1
        m["cleaned"] += sum(r.cleaned for r in reports)
        m["records_dropped"] += sum(r.records_dropped for r in reports)
        m["errors"] += [r.line() for r in reports if r.errors]
        self.log(f"maintenance pass {m['passes']}: " + "; ".join(r.line() for r in reports))

    def phase_maintain(self, p: dict) -> dict:
        q = self.start_sink(p)
        self.log(f"{p['source']}: sink query started beside maintenance passes")
        go = os.path.join(self.control, "go-passes")  # the test runs the maintenance CLI first: one job at a time

        def during():
            if os.path.exists(go):
                self.maintenance_pass(p)
            else:
                time.sleep(0.05)

        out = self.finish_stream(q, p["source"], during=during)
        self.maintenance_pass(p)  # one more with the stream stopped: everything but the active segment is cleanable
        return {**out, **self.maintenance}

    def run(self) -> int:
        os.environ["PYSPARK_PYTHON"] = sys.executable  # before the JVM starts: executors and workers run this
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        t0 = time.monotonic()
        self.spark = (
            SparkSession.builder.master(self.spec["master"])
            .appName("kafkalog-cluster-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
            .config("spark.executor.memory", "1024m")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            # a task may be hit by several of the test's executor kills: never fail the job for it
            .config("spark.task.maxFailures", "50")
            .config("spark.ui.retainedStages", "100000")
            .config("spark.ui.retainedJobs", "100000")
            .getOrCreate()
        )
        self.spark.sparkContext.setLogLevel("ERROR")
        self.spark.dataSource.register(CounterSource)
        self.log(f"session on {self.spec['master']} after {time.monotonic() - t0:.1f}s")
        status = threading.Thread(target=self._status_loop, name="status", daemon=True)
        status.start()
        rc = 0
        try:
            for p in self.spec["phases"]:
                self.phase = p.get("source", p["kind"])
                self.log(f"phase {self.phase} ({p['kind']})")
                self.results[self.phase] = getattr(self, f"phase_{p['kind']}")(p)
                self.results[self.phase]["failed_tasks"] = self.task_failures()
                self.write_status()
            self.phase = "done"
        except Exception:  # noqa: BLE001 - reported to the test in result.json and the log
            self.results["error"] = traceback.format_exc()
            self.log(self.results["error"])
            rc = 1
        self.results["executors"] = self.executors()
        self.write_status()
        self._stop.set()
        write_json(os.path.join(self.control, "result.json"), self.results)
        self.spark.stop()
        self.log(f"done after {time.monotonic() - t0:.1f}s")
        return rc


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(App(sys.argv[1]).run())
