"""format("kafkalog") on a Spark cluster: `local-cluster[2,1,1024]`, a standalone master and worker in the
driver's JVM and two executor JVMs, which the worker relaunches when they die.

Each scenario runs tests/spark/spark_cluster_app.py as a driver subprocess of its own (one process holds one
SparkContext; pytest-spark's session is local[2]) in a session of its own, so the test can find its
executor JVMs (`org.apache.spark.executor.CoarseGrainedExecutorBackend`, with `--executor-id`) and kill
them, or kill all of it. Input is the app's counter source: row i has value str(i), so the test knows the
exact row set (0 .. the limit it fed). Every row carries headers naming the executor and the task attempt
that produced it. What a scenario wrote is read back with the repo's engine (LogManager ... read_records)
and with kafka-python: every row exactly once, offsets dense from 0 per partition.

- the sink while executor JVMs are SIGKILLed, some while a task is held mid-flight (the counter source waits
  while the test's hold file exists, so the kill is known to fail a task), some at random moments
  (test_sink_survives_executor_kills)
- batch and stream reads spread over both executors (test_reads_spread_over_both_executors)
- the maintenance job on the cluster (its CLI on a cluster of its own, then run_once(spark=...) passes in
  the app) beside a live stream into a compacted topic (test_maintenance_job_beside_a_live_stream)
  These three share one driver and cluster (the `group` fixture): sink, then reads, then maintenance.
- the driver SIGKILLed (driver, its JVM, the cluster it started) mid-stream, just after its tasks staged
  their rows, then a new driver finishes from the same checkpoint
  (test_driver_kill_then_restart_from_the_checkpoint; with the driver-kill runs, `--kill-rounds N`: the
  default suite kills drivers in local mode, tests/spark/test_spark_kill.py)
- the sink on the S3 test server while executors are killed: the executors share only the object
  store, for data (test_s3_sink_survives_executor_kills; the hold file is the test's control channel)

Waits are on conditions (commits, files, processes), each with a hang guard (HANG_S) that only a
hang reaches; nothing asserts how long anything took.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

import pytest
from kafka.partitioner.default import murmur2  # kafka-python's port of the Java client's hash

from storage.log_manager import LogManager
from storage.staging.staged_commit import STAGED_PREFIX
from storage.topic_partition import TopicPartition
from storage.transactions.writer_state import STATE_FILE
from tests.helpers import REPO
from tests.helpers.kafka_reference import kp_committed, kp_parse
from tests.helpers.spark_procs import kill_session, proc_cmdline, session_procs
from tests.spark import spark_cluster_app as app
from tools.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY

pytestmark = [pytest.mark.spark, pytest.mark.cluster, pytest.mark.long]

MASTER = "local-cluster[2,1,1024]"  # 2 workers of 1 core and 1024 MB: one executor each
HANG_S = 600  # generous: only a hang reaches it (JVMs starting on a busy 2-core machine take their time)
SEED = 20250301
BATCH_ROWS = 200  # rows per micro-batch, 2 tasks each
AHEAD_ROWS = 3 * BATCH_ROWS  # the test feeds the source this far past the last committed row
MAX_RANDOM_DELAY_S = 2.0
EXECUTOR_KILLS = (2, 1)  # the local executor-kill scenario: kills of a held task's executor, kills at random moments
S3_EXECUTOR_KILLS = (1, 1)  # the S3 one: one of each (what is S3's own, the shared store, needs no more)
EVENTS_PARTITIONS = 3
KV_PARTITIONS = 3
APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark_cluster_app.py")
PROJECT = REPO

LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


# ---- the Spark installation the subprocesses use ----


@pytest.fixture(scope="module")
def spark_env(tmp_path_factory):
    """Environment for the drivers: SPARK_HOME is a directory of links to pip's pyspark (bin, jars, python)
    with a conf dir of our own (error-level log4j, spark-defaults for the maintenance CLI's session), so the
    standalone worker's work dir (executor logs) lands in the test's temp dir, not in site-packages."""
    import importlib.util

    pyspark_dir = importlib.util.find_spec("pyspark").submodule_search_locations[0]
    home = tmp_path_factory.mktemp("spark-home")
    for d in ("bin", "jars", "python"):
        os.symlink(os.path.join(pyspark_dir, d), home / d)
    conf = home / "conf"
    conf.mkdir()
    (conf / "log4j2.properties").write_text(LOG4J)
    (conf / "spark-defaults.conf").write_text(
        "spark.ui.enabled false\nspark.ui.showConsoleProgress false\nspark.executor.memory 1024m\n"
        f"spark.executorEnv.PYSPARK_PYTHON {sys.executable}\n"
    )
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


# ---- processes ----


def tail(path, n=60) -> str:
    try:
        lines = pathlib.Path(path).read_bytes().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


class Driver:
    """One run of spark_cluster_app.py in a session of its own."""

    def __init__(self, control: pathlib.Path, spec: dict, env: dict, log_name: str):
        control.mkdir(parents=True, exist_ok=True)
        self.control = control
        app.write_json(str(control / "spec.json"), spec)
        for f in ("status.json", "result.json"):
            (control / f).unlink(missing_ok=True)
        self.log_path = control / log_name
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, APP, str(control)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=PROJECT,
                env=env,
            )
        self.pumps: list = []  # called on every poll of wait(): feeders

    def status(self) -> dict:
        return app.read_json(str(self.control / "status.json"), {}) or {}

    def wait(self, cond, what: str, *, alive: bool = True):
        """Poll cond() (and the pumps) until it is true; fail if the driver exits first or on a hang."""
        deadline = time.monotonic() + HANG_S
        while True:
            for pump in self.pumps:
                pump()
            got = cond()
            if got:
                return got
            if alive and self.proc.poll() is not None:
                raise AssertionError(
                    f"driver exited {self.proc.returncode} while waiting for {what}:\n{tail(self.log_path)}"
                )
            assert time.monotonic() < deadline, f"hang: no {what} in {HANG_S}s:\n{tail(self.log_path)}"
            time.sleep(0.05)

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for pump in self.pumps:
                pump()
            time.sleep(0.02)

    def executor_jvms(self) -> dict[str, int]:
        """{executor id: JVM pid} of this driver's live executor processes."""
        out = {}
        for pid, _, _ in session_procs(self.proc.pid):
            try:
                eid = app.executor_of_cmdline(proc_cmdline(pid))
            except OSError:
                continue
            if eid is not None:
                out[eid] = pid
        return out

    def ready_executors(self) -> dict[str, int]:
        """Executors both registered with the driver (its status store says active) and running."""
        active = {e for e, s in self.status().get("executors", {}).items() if s["active"]}
        return {e: pid for e, pid in self.executor_jvms().items() if e in active}

    def finish(self) -> dict:
        """Wait for a clean exit; the app's result.json."""
        self.wait(lambda: self.proc.poll() is not None, "the driver's exit", alive=False)
        result = app.read_json(str(self.control / "result.json"), {}) or {}
        assert self.proc.returncode == 0, (
            f"driver exited {self.proc.returncode}: {result.get('error')}\n{tail(self.log_path)}"
        )
        self.wait(
            lambda: not session_procs(self.proc.pid), "the driver's processes to exit (executors, workers)", alive=False
        )
        return result

    def kill(self) -> None:
        kill_session(self.proc)
        self.proc.wait()

    def cleanup(self) -> None:
        if self.proc.poll() is None or session_procs(self.proc.pid):
            self.kill()


# ---- feeding the counter source ----


def batch_ids(path) -> set[int]:
    return {int(f) for f in os.listdir(path) if f.isdigit()} if os.path.isdir(path) else set()


def committed_row(ckpt: str) -> int:
    """The counter source's offset at the end of the last micro-batch Spark recorded as committed."""
    done = batch_ids(os.path.join(ckpt, "commits"))
    if not done:
        return 0
    try:
        lines = pathlib.Path(ckpt, "offsets", str(max(done))).read_text().splitlines()
        return int(json.loads(lines[-1])["row"])
    except (OSError, ValueError, KeyError, IndexError):
        return 0


class Feeder:
    """Keeps the counter source `source` AHEAD_ROWS rows past the last committed row, so a stream never runs
    dry while the test is still at work, and stops it at an exact row count."""

    def __init__(self, control: pathlib.Path, source: str, ckpt: str):
        self.control, self.source, self.ckpt = control, source, ckpt
        self.limit = int(app.read_json(str(control / f"limit-{source}"), 0) or 0)  # a restart keeps its limit
        self.done = False
        self.pump()

    def pump(self) -> None:
        if not self.done:
            self.set(committed_row(self.ckpt) + AHEAD_ROWS)

    def set(self, limit: int) -> None:
        if limit > self.limit:
            self.limit = limit
            app.write_json(str(self.control / f"limit-{self.source}"), limit)

    def finish(self) -> int:
        """No more rows: the stream stops once all `limit` rows are committed. Returns the row count."""
        self.done = True
        (self.control / f"finish-{self.source}").touch()
        return self.limit


# ---- killing executors ----


@dataclass
class KillLog:
    kills: list[str] = field(default_factory=list)
    modes: collections.Counter = field(default_factory=collections.Counter)
    held_tasks: list[str] = field(default_factory=list)


def kill_executors(d: Driver, ckpt: str, plan: list[str], rng: random.Random) -> KillLog:
    """SIGKILL one executor JVM per entry of plan, once both executors are registered and a micro-batch
    committed since the last kill. `held`: a task is held mid-flight (the counter source's read waits while
    CONTROL/hold exists) and its executor is killed, so the task is known to fail and run again on another
    executor. `random`: a random executor, a random moment later (in a task or between them)."""
    out = KillLog()
    hold = d.control / "hold"
    for n, mode in enumerate(plan):
        mark = max(batch_ids(os.path.join(ckpt, "commits")), default=-1)
        d.wait(
            lambda mark=mark: (
                max(batch_ids(os.path.join(ckpt, "commits")), default=-1) > mark and len(d.ready_executors()) >= 2
            ),
            f"a commit and two live executors before kill {n + 1}",
        )
        if mode == "random":
            delay = rng.uniform(0, MAX_RANDOM_DELAY_S)
            d.sleep(delay)
            jvms = d.executor_jvms()
            eid = rng.choice(sorted(jvms))
            what = f"random, +{delay:.2f}s"
        else:
            for f in d.control.glob("held-*.json"):
                f.unlink()
            hold.touch()
            held = d.wait(lambda: sorted(d.control.glob("held-*.json")), f"a task held before kill {n + 1}")
            chosen = app.read_json(str(rng.choice(held)))
            eid = chosen["executor"].split("@", 1)[0]
            jvms = {eid: chosen["jvm"]}
            what = f"held task {chosen['task']}"
            out.held_tasks.append(chosen["task"])
        try:
            os.kill(jvms[eid], signal.SIGKILL)
        finally:
            hold.unlink(missing_ok=True)
        out.kills.append(
            f"kill {n + 1}: executor {eid} (pid {jvms[eid]}), {what}, after batch "
            f"{max(batch_ids(os.path.join(ckpt, 'commits')), default=-1)}"
        )
        out.modes[mode] += 1
    return out


def kill_plan(rng: random.Random, held: int, random_: int) -> list[str]:
    plan = ["held"] * held + ["random"] * random_
    rng.shuffle(plan)
    return plan


# ---- reading back, independently of Spark ----


def engine_records(lm: LogManager, topic: str, partitions: int) -> dict[int, list[tuple]]:
    """{partition: [(offset, key, value, headers dict)]} read with the repo's engine, log start to end, as a
    read_committed consumer (the sink writes each micro-batch as a transaction)."""
    out = {}
    for p in range(partitions):
        rows = []
        with lm.open_log(TopicPartition(topic, p)) as log:
            assert log.log_start_offset == 0, f"{topic}-{p}: log start {log.log_start_offset}"
            for b in log.read_records(log.log_start_offset, isolation_level="read_committed"):
                for r in b.to_pylist():
                    rows.append((r["offset"], r["key"], r["value"], {h["key"]: h["value"] for h in r["headers"] or []}))
            assert log.last_stable_offset == log.log_end_offset, f"{topic}-{p}: a transaction left open"
        out[p] = rows
    return out


def kafka_python_records(root: str, topic: str, partitions: int) -> dict[int, list[tuple]]:
    """The same from kafka-python parsing every .log file of each partition directory (local disk), through
    the brute-force read_committed model (kp_committed); offsets of everything in the files are dense."""
    out = {}
    for p in range(partitions):
        d = os.path.join(root, f"{topic}-{p}")
        rows = []
        for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
            data = pathlib.Path(d, name).read_bytes()
            batches = kp_parse(data)
            assert sum(b["size"] for b in batches) == len(data), f"{topic}-{p}/{name}: bytes past the last batch"
            assert all(b["crc_ok"] for b in batches), f"{topic}-{p}/{name}: bad CRC"
            rows += batches
        offsets = [r[0] for b in rows for r in b["records"]]
        assert offsets == sorted(set(offsets)), f"{topic}-{p}: offsets not increasing"
        committed, still_open = kp_committed(rows)
        assert not still_open, f"{topic}-{p}: {len(still_open)} records of a transaction left open"
        out[p] = [(o, k, v, dict(h)) for o, _, k, v, h in committed]
    return out


def check_events(records: dict[int, list[tuple]], n_rows: int) -> dict:
    """Every row 0..n_rows-1 exactly once, offsets increasing (markers and aborted attempts take offsets
    between), keys as the source made them, keyed rows in murmur2's partition. Returns what the headers say
    about executors and task attempts."""
    values = collections.Counter()
    executors, tasks = collections.Counter(), set()
    for p, rows in records.items():
        assert [r[0] for r in rows] == sorted({r[0] for r in rows}), f"partition {p}: offsets not increasing"
        for _, key, value, headers in rows:
            i = int(value)
            want = app.key_of("events", i)
            assert key == (None if want is None else want.encode()), f"partition {p}: row {i} has key {key}"
            if key is not None:
                assert (murmur2(key) & 0x7FFFFFFF) % len(records) == p, f"row {i} in partition {p}"
            values[i] += 1
            executors[headers["executor"].decode()] += 1
            tasks.add(headers["task"].decode())
    twice = sorted(v for v, c in values.items() if c > 1)
    missing = sorted(set(range(n_rows)) - set(values))
    extra = sorted(set(values) - set(range(n_rows)))
    assert not twice and not missing and not extra, (
        f"{len(twice)} rows twice (first {twice[:10]}), {len(missing)} missing (first {missing[:10]}), "
        f"{len(extra)} extra (first {extra[:10]})"
    )
    retried = sorted(t for t in tasks if not t.endswith(".0"))
    return {"executors": {e.split("@")[0] for e in executors}, "retried_tasks": retried, "tasks": len(tasks)}


def staged_leftovers(root: str) -> list[str]:
    return sorted(f for f in os.listdir(root) if f.startswith(STAGED_PREFIX))


def pending_commits(root: str, topic: str, partitions: int) -> list:
    out = []
    for p in range(partitions):
        path = os.path.join(root, f"{topic}-{p}", STATE_FILE)
        if os.path.exists(path):
            out += [
                (p, e["pending"])
                for e in json.loads(pathlib.Path(path).read_text())["writers"].values()
                if e.get("pending")
            ]
    return out


def committed_batches(root: str, topic: str, partitions: int) -> list:
    """Per partition, the last micro-batch the sink's writer state says the partition holds (-1: none)."""
    out = []
    for p in range(partitions):
        path = os.path.join(root, f"{topic}-{p}", STATE_FILE)
        writers = json.loads(pathlib.Path(path).read_text())["writers"] if os.path.exists(path) else {}
        out.append(max((e["committed_batch_id"] for e in writers.values()), default=-1))
    return out


def failed_tasks(phase: dict) -> int:
    """Task attempts that failed in the phase's stages (and before it), as Spark's status tracker counts them."""
    return sum(phase["failed_tasks"].values())


# ---- scenario group: sink with executor kills, reads, maintenance; one driver, one cluster ----


@dataclass
class Group:
    root: str
    n_events: int = 0
    n_kv: int = 0
    kills: KillLog | None = None
    result: dict = field(default_factory=dict)
    cli: subprocess.CompletedProcess | None = None
    seconds: dict = field(default_factory=dict)


@pytest.fixture(scope="module")
def group(tmp_path_factory, spark_env):
    base = tmp_path_factory.mktemp("cluster")
    control, root = base / "control", str(base / "logs")
    g = Group(root)
    spec = {
        "master": MASTER,
        "phases": [
            {
                "kind": "sink",
                "source": "events",
                "root": root,
                "checkpoint": str(base / "ckpt-events"),
                "topic": "events",
                "partitions": EVENTS_PARTITIONS,
                "batch_rows": BATCH_ROWS,
                "tasks": 2,
                # small segments: most commits copy, some tasks' staging logs are big enough to be adopted
                "options": {"segment.bytes": "4000"},
            },
            {
                "kind": "read",
                "root": root,
                "topic": "events",
                "checkpoint": str(base / "ckpt-read"),
                "min_partitions": 6,
            },
            {
                "kind": "maintain",
                "source": "kv",
                "root": root,
                "checkpoint": str(base / "ckpt-kv"),
                "topic": "kv",
                "partitions": KV_PARTITIONS,
                "keys": "changelog",
                "batch_rows": BATCH_ROWS,
                "tasks": 2,
                "options": {
                    "cleanup.policy": "compact",
                    "segment.bytes": "3000",
                    "min.cleanable.dirty.ratio": "0.01",
                    "file.delete.delay.ms": "0",
                },
            },
        ],
    }
    rng = random.Random(SEED)
    t0 = time.monotonic()
    d = Driver(control, spec, spark_env, "driver.log")
    try:
        events = Feeder(control, "events", spec["phases"][0]["checkpoint"])
        d.pumps.append(events.pump)
        g.kills = kill_executors(d, spec["phases"][0]["checkpoint"], kill_plan(rng, *EXECUTOR_KILLS), rng)
        g.n_events = events.finish()
        d.pumps.remove(events.pump)
        d.wait(lambda: d.status().get("phase") not in (None, "starting", "events"), "the end of the sink phase")
        g.seconds["sink"] = time.monotonic() - t0
        d.wait(lambda: d.status().get("phase") == "kv", "the maintenance phase")
        g.seconds["read"] = time.monotonic() - t0 - g.seconds["sink"]
        kv_ckpt = spec["phases"][2]["checkpoint"]
        kv = Feeder(control, "kv", kv_ckpt)
        d.pumps.append(kv.pump)
        d.wait(lambda: batch_ids(os.path.join(kv_ckpt, "commits")), "the first commit into kv")
        # The maintenance CLI on a cluster of its own, beside the live stream (the app runs no pass of its own
        # until it ends: two jobs are not meant to maintain one local log dir at once).
        cli_out, cli_err = control / "maintenance-cli.out", control / "maintenance-cli.err"
        with open(cli_out, "wb") as out, open(cli_err, "wb") as err:  # files, not pipes: nothing can block on them
            cli = subprocess.Popen(
                [sys.executable, "-m", "kafkalog_ds.maintenance", root, "--spark", "--master", MASTER],
                stdout=out,
                stderr=err,
                start_new_session=True,
                cwd=PROJECT,
                env=spark_env,
            )
        try:
            d.wait(lambda: cli.poll() is not None, "the maintenance CLI's exit")
            d.wait(lambda: not session_procs(cli.pid), "the maintenance CLI's executors to exit")
        finally:
            if cli.poll() is None or session_procs(cli.pid):
                kill_session(cli)
            cli.wait()
            g.cli = subprocess.CompletedProcess(
                cli.args, cli.returncode, cli_out.read_text(errors="replace"), cli_err.read_text(errors="replace")
            )
        (control / "go-passes").touch()
        # two in-app passes (run_once(spark=...) on this cluster) while the stream still writes
        d.wait(lambda: d.status().get("maintenance", {}).get("passes", 0) >= 2, "two maintenance passes")
        g.n_kv = kv.finish()
        g.result = d.finish()
        g.seconds["maintain"] = time.monotonic() - t0 - g.seconds["sink"] - g.seconds["read"]
    finally:
        (control / "hold").unlink(missing_ok=True)
        d.cleanup()
    g.log = d.log_path
    yield g


def test_sink_survives_executor_kills(group):
    g = group
    assert "error" not in g.result, g.result.get("error")
    got = engine_records(LogManager(g.root), "events", EVENTS_PARTITIONS)
    assert got == kafka_python_records(g.root, "events", EVENTS_PARTITIONS)  # the engine and kafka-python agree
    seen = check_events(got, g.n_events)
    execs = g.result["executors"]
    failed = failed_tasks(g.result["events"])
    print(
        f"\nsink with executor kills: {sum(g.kills.modes.values())} executor kills ({dict(g.kills.modes)}), "
        f"{failed} failed task attempts (Spark's status store), {len(seen['retried_tasks'])} retried tasks' rows "
        f"committed ({seen['retried_tasks']}), {len(execs)} executors over the run ({sorted(execs, key=int)}), "
        f"rows written by executors {sorted(seen['executors'], key=int)}, {g.n_events} rows in "
        f"{g.result['events']['batches']} micro-batches, {g.seconds['sink']:.0f}s"
    )
    print("\n".join(g.kills.kills))
    assert len(g.kills.kills) == sum(EXECUTOR_KILLS)
    # each held kill failed the task it held: Spark counted the failure and the task's rows came from a retry
    assert failed >= g.kills.modes["held"]
    assert set(g.kills.held_tasks) <= {t.rsplit(".", 1)[0] + ".0" for t in seen["retried_tasks"]} | set(), (
        f"held tasks {g.kills.held_tasks} but retried {seen['retried_tasks']}"
    )
    assert len(seen["executors"]) >= 3  # the first two and at least one the worker relaunched
    assert len(execs) == 2 + len(g.kills.kills)  # one executor launched for each one killed
    assert staged_leftovers(g.root) == []
    assert pending_commits(g.root, "events", EVENTS_PARTITIONS) == []


def test_reads_spread_over_both_executors(group):
    g = group
    r = g.result.get("read")
    assert r, g.result.get("error")
    want = sorted(
        (p, o, k.decode() if k is not None else None, v.decode())
        for p, rows in engine_records(LogManager(g.root), "events", EVENTS_PARTITIONS).items()
        for o, k, v, _ in rows
    )
    assert len(want) == g.n_events
    for name in ("batch", "stream"):
        rows = r[name]
        assert sorted(tuple(x[:4]) for x in rows) == want, f"{name} read differs from the log"
        by_exec = collections.Counter(x[4].split("@")[0] for x in rows)
        print(f"\n{name} read: {len(rows)} rows, read by executors {dict(by_exec)}")
        assert len(by_exec) >= 2, f"{name} read ran on one executor only: {dict(by_exec)}"
    before, after = r["executors_before"], r["executors_after"]
    ran = sorted(e for e in after if after[e]["completed"] > before.get(e, {"completed": 0})["completed"])
    print(
        f"executors that completed read tasks (status store): {ran}; stream read in {r['stream_batches']} "
        f"micro-batch(es); {g.seconds['read']:.0f}s"
    )
    assert len(ran) >= 2


def test_maintenance_job_beside_a_live_stream(group):
    g = group
    assert g.cli is not None and g.cli.returncode == 0, f"maintenance CLI: {g.cli}"
    assert "maintenance pass:" in g.cli.stdout and ", 0 failed" in g.cli.stdout, g.cli.stdout
    m = g.result.get("kv")
    assert m, g.result.get("error")
    print(
        f"\nmaintenance beside a live stream: CLI pass on its own cluster, then {m['passes']} passes on the "
        f"app's cluster; {m['cleaned']} partition cleanings dropped {m['records_dropped']} records; "
        f"{g.n_kv} rows in {m['batches']} micro-batches; {g.seconds['maintain']:.0f}s\nCLI: "
        + g.cli.stdout.strip().replace("\n", "\nCLI: ")
    )
    assert m["passes"] >= 3 and m["cleaned"] >= 1 and m["records_dropped"] > 0
    lm = LogManager(g.root)
    got = engine_records(lm, "kv", KV_PARTITIONS)
    assert got == kafka_python_records(g.root, "kv", KV_PARTITIONS)
    # Exact after compaction: each row's offset stays; keys of their own all survive, each hot key's latest
    # value survives, older versions of hot keys may be gone; nothing is there twice or from elsewhere.
    routed = collections.Counter(
        (murmur2(app.key_of("changelog", i).encode()) & 0x7FFFFFFF) % KV_PARTITIONS for i in range(g.n_kv)
    )
    values = collections.Counter()
    for p, rows in got.items():
        offsets = [r[0] for r in rows]
        assert offsets == sorted(set(offsets)), f"kv-{p}: offsets not increasing"
        with lm.open_log(TopicPartition("kv", p)) as log:
            # every routed row took an offset, and so did each micro-batch's COMMIT marker (and any aborted
            # attempt): the log end is past the rows by those, which compaction may since have removed
            assert log.log_end_offset >= routed[p], f"kv-{p}: log end {log.log_end_offset}, {routed[p]} rows routed"
        for _, key, value, _ in rows:
            i = int(value)
            assert key == app.key_of("changelog", i).encode(), f"kv-{p}: row {i} has key {key}"
            assert (murmur2(key) & 0x7FFFFFFF) % KV_PARTITIONS == p
            values[i] += 1
    assert all(c == 1 for c in values.values()), "a row twice"
    assert set(values) <= set(range(g.n_kv))
    unique = {i for i in range(g.n_kv) if i % 4}
    missing = sorted(unique - set(values))
    assert not missing, f"{len(missing)} rows of unique keys missing (first {missing[:10]})"
    latest = {app.key_of("changelog", i): i for i in range(g.n_kv) if i % 4 == 0}
    assert all(i in values for i in latest.values()), "a hot key's latest value is missing"
    assert len(values) < g.n_kv, "compaction removed nothing"
    assert m["errors"] == [], m["errors"]
    assert staged_leftovers(g.root) == []


# ---- the driver killed, then restarted from its checkpoint ----

# Drivers killed before the one that finishes, each at one of these moments: "staged" once a task's staging directory
# appears (tasks done or finishing, the commit due or under way; the restart finds staging left behind), "held"
# while tasks are held inside the source's read, "random" a random delay after a commit.
DRIVER_KILL_MODES = ("staged",)


def test_driver_kill_then_restart_from_the_checkpoint(tmp_path, spark_env, pytestconfig):
    if not (pytestconfig.getoption("--kill-rounds") or os.environ.get("KAFKALOG_KILL_ROUNDS")):
        # two cluster starts (about a minute); the default suite kills the driver in local mode (test_spark_kill)
        pytest.skip("the driver kill on a cluster runs with the driver-kill runs: pass --kill-rounds N")
    rng = random.Random(SEED + 1)
    control, root, ckpt = tmp_path / "control", str(tmp_path / "logs"), str(tmp_path / "ckpt")
    spec = {
        "master": MASTER,
        "phases": [
            {
                "kind": "sink",
                "source": "drv",
                "root": root,
                "checkpoint": ckpt,
                "topic": "events",
                "partitions": EVENTS_PARTITIONS,
                "batch_rows": BATCH_ROWS,
                "tasks": 2,
                "options": {"segment.bytes": "4000"},
            }
        ],
    }
    report = []
    t0 = time.monotonic()
    for run, mode in enumerate(DRIVER_KILL_MODES + ("final",)):
        d = Driver(control, spec, spark_env, f"driver-{run}.log")
        try:
            feeder = Feeder(control, "drv", ckpt)
            if mode == "final":
                n_rows = feeder.finish()
                d.finish()
                break
            d.pumps.append(feeder.pump)
            first = max(batch_ids(os.path.join(ckpt, "commits")), default=-1)
            d.wait(
                lambda first=first: max(batch_ids(os.path.join(ckpt, "commits")), default=-1) >= first + 2,
                f"two commits in run {run}",
            )
            if mode == "staged":
                known = set(staged_leftovers(root))
                d.wait(lambda known=known: set(staged_leftovers(root)) - known, "a task's staging directory")
                delay = rng.uniform(0, 0.05)
                d.sleep(delay)
                what = f"+{delay:.2f}s after a task's staging directory appeared"
            elif mode == "held":
                (control / "hold").touch()
                d.wait(lambda: list(control.glob("held-*.json")), "a task held mid-flight")
                what = "tasks held mid-flight"
            else:
                delay = rng.uniform(0, MAX_RANDOM_DELAY_S)
                d.sleep(delay)
                what = f"random, +{delay:.2f}s"
            d.kill()
            offsets, commits = batch_ids(os.path.join(ckpt, "offsets")), batch_ids(os.path.join(ckpt, "commits"))
            report.append(
                f"driver {run} killed ({what}): batch {max(offsets)} planned, {max(commits)} in Spark's "
                f"commit log, in the partitions' writer state {committed_batches(root, 'events', 3)}, "
                f"staging dirs left {len(staged_leftovers(root))}, "
                f"pending commits {len(pending_commits(root, 'events', EVENTS_PARTITIONS))}"
            )
        finally:
            (control / "hold").unlink(missing_ok=True)
            for f in control.glob("held-*.json"):
                f.unlink()
            d.cleanup()
    got = engine_records(LogManager(root), "events", EVENTS_PARTITIONS)
    assert got == kafka_python_records(root, "events", EVENTS_PARTITIONS)
    seen = check_events(got, n_rows)
    print(
        f"\ndriver kills: {len(DRIVER_KILL_MODES)} driver(s) killed with their clusters, "
        f"then one restart to the end; {n_rows} rows in "
        f"{max(batch_ids(os.path.join(ckpt, 'commits'))) + 1} micro-batches, written by executors "
        f"{sorted(seen['executors'], key=int)} of {len(DRIVER_KILL_MODES) + 1} clusters; "
        f"{time.monotonic() - t0:.0f}s\n" + "\n".join(report)
    )
    assert staged_leftovers(root) == []
    assert pending_commits(root, "events", EVENTS_PARTITIONS) == []


# ---- the sink on S3 while executors are killed ----


def test_s3_sink_survives_executor_kills(tmp_path, spark_env, s3_server):
    from tests.helpers.s3_objects import check_kafka_files, partition_objects, s3fs_of

    rng = random.Random(SEED + 2)
    control, ckpt = tmp_path / "control", str(tmp_path / "ckpt")
    url = f"s3://{BUCKET}/cluster-{uuid.uuid4().hex[:12]}"
    fs = {
        "fs.endpoint_url": s3_server.endpoint_url,
        "fs.key": ACCESS_KEY,
        "fs.secret": SECRET_KEY,
        "fs.client_kwargs": json.dumps({"region_name": REGION}),
    }
    spec = {
        "master": MASTER,
        "phases": [
            {
                "kind": "sink",
                "source": "s3",
                "root": url,
                "checkpoint": ckpt,
                "topic": "events",
                "partitions": EVENTS_PARTITIONS,
                "batch_rows": BATCH_ROWS,
                "tasks": 2,
                "options": fs,
            }
        ],
    }
    t0 = time.monotonic()
    mark = s3_server.log.mark()
    d = Driver(control, spec, spark_env, "driver.log")
    try:
        feeder = Feeder(control, "s3", ckpt)
        d.pumps.append(feeder.pump)
        kills = kill_executors(d, ckpt, kill_plan(rng, *S3_EXECUTOR_KILLS), rng)
        n_rows = feeder.finish()
        result = d.finish()
    finally:
        (control / "hold").unlink(missing_ok=True)
        d.cleanup()
    requests = s3_server.log.since(mark, path_prefix="/" + url[len("s3://") :])
    s3 = s3fs_of(s3_server)
    objs = {p: partition_objects(s3, url, "events", p) for p in range(EVENTS_PARTITIONS)}
    kp = {
        p: [(o, k, v, dict(h)) for o, _, k, v, h in check_kafka_files(objs[p], 4096)] for p in range(EVENTS_PARTITIONS)
    }
    got = engine_records(LogManager(url, s3_server.storage_options), "events", EVENTS_PARTITIONS)
    assert got == kp
    seen = check_events(got, n_rows)
    failed = failed_tasks(result["s3"])
    print(
        f"\nS3 sink with executor kills: {len(kills.kills)} executor kills ({dict(kills.modes)}), {failed} failed "
        f"task attempts, {len(seen['retried_tasks'])} retried tasks' rows committed, rows written by executors "
        f"{sorted(seen['executors'], key=int)}, {n_rows} rows in {result['s3']['batches']} micro-batches, "
        f"{len(requests)} S3 requests; {time.monotonic() - t0:.0f}s\n" + "\n".join(kills.kills)
    )
    assert failed >= kills.modes["held"]
    assert set(kills.held_tasks) <= {t.rsplit(".", 1)[0] + ".0" for t in seen["retried_tasks"]}
    assert len(seen["executors"]) >= 3
    left = [n for n in s3.ls(url[len("s3://") :], detail=False, refresh=True) if STAGED_PREFIX in n]
    assert left == [], f"staging objects left: {left}"
