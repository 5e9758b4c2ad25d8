"""The Spark maintenance job (kafkalog_ds.maintenance.run_once(ROOT, spark=...)) on local-cluster[2,1,1024] with
an executor killed in every pass, during the table write stage: the data files of a table are written by
Spark tasks (materializer.write_ranges, one task per partition) and the driver makes one commit per table.

The job runs in a driver process of its own (table_kill_driver.py --spark, one cluster start for the whole
test), one pass per request of the test. In each pass the first attempt of one chosen task (a topic's
partition, drawn seeded) SIGKILLs its executor JVM and its own Python worker, in the middle of its first data
file (rows written, no footer) or after it wrote all of them (decided by a marker file created with O_EXCL,
and by where the task is: never on a timer). Between passes the test appends plain
batches and transactions (committed, aborted, left open) to an append topic and an upsert topic with the
model's workload (tests/helpers/table_model.py). After every pass:

- Spark retried the task: the killed attempt 0 and a later attempt that returned, Spark counting the failure;
- the driver committed once per table: one new snapshot, the only one naming the pass;
- each table equals the model at its offsets: 0 rows lost, 0 twice, 0 from aborted transactions;
- the table's data folders hold only files its snapshots name: each attempt names its files apart, and the
  driver removes the failed attempt's after the commit (they name the pass).

Not in the default suite (a cluster start and a pass per kill, ~45 s for 2): `--table-kills N` (or
KAFKALOG_TABLE_KILLS=N) runs it with N executor kills, beside test_table_kill.py's N killed processes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import time

import pytest

pytest.importorskip("pyiceberg")
pytest.importorskip("pyspark")

from pyiceberg.exceptions import NoSuchTableError  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from storage.tables.table_offsets import PASS_ID  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.helpers.spark_procs import kill_session, session_procs  # noqa: E402
from tests.helpers.table_model import DAY, T0, TopicModel, Workload  # noqa: E402
from tests.storage.tables.table_kill_driver import (  # noqa: E402
    assert_equals_model,
    data_files_on_disk,
    load_table,
    referenced_files,
    table_offsets,
)

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

MASTER = "local-cluster[2,1,1024]"  # 2 workers of 1 core and 1024 MB: one executor each
HANG_S = 600  # generous: only a hang reaches it (JVMs starting on a busy 2-core machine take their time)
SEED = 20260302
PARTITIONS = 3
TOPICS = {"ev": "append", "kv": "upsert"}
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "table_kill_driver.py")
LOG4J = """rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


def executor_kills(config) -> int:
    """--table-kills N (or KAFKALOG_TABLE_KILLS=N); 0, the default, skips this test."""
    return config.getoption("--table-kills") or int(os.environ.get("KAFKALOG_TABLE_KILLS", 0))


def spark_env(base) -> dict:
    """The driver's environment: SPARK_HOME a directory of links to pip's pyspark with a conf dir of our own
    (error-level log4j), so the standalone worker's work dir (executor logs) lands in the test's temp dir."""
    pyspark_dir = importlib.util.find_spec("pyspark").submodule_search_locations[0]
    home = base / "spark-home"
    home.mkdir()
    for d in ("bin", "jars", "python"):
        os.symlink(os.path.join(pyspark_dir, d), home / d)
    conf = home / "conf"
    conf.mkdir()
    (conf / "log4j2.properties").write_text(LOG4J)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_CONF_DIR": str(conf),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def tail(path, n=80) -> str:
    try:
        with open(path, "rb") as f:
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class SparkDriver:
    def __init__(self, control, env):
        self.control = control
        self.log_path = control / "driver.log"
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, DRIVER, "--spark", str(control)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
                env=env,
            )

    def wait(self, cond, what: str, *, alive: bool = True):
        deadline = time.monotonic() + HANG_S
        while True:
            got = cond()
            if got:
                return got
            if alive and self.proc.poll() is not None:
                raise AssertionError(f"driver exited {self.proc.returncode} waiting for {what}:\n{tail(self.log_path)}")
            assert time.monotonic() < deadline, f"hang: no {what} in {HANG_S}s:\n{tail(self.log_path)}"
            time.sleep(0.05)

    def run_pass(self, n: int, now_ms: int, victim: dict) -> dict:
        tmp = self.control / f"go-{n}.json.tmp"
        tmp.write_text(json.dumps({"now_ms": now_ms, "victim": victim}))
        os.replace(tmp, self.control / f"go-{n}.json")
        return self.wait(lambda: read_json(self.control / f"done-{n}.json"), f"pass {n}")

    def stop(self) -> None:
        (self.control / "stop").touch()
        self.wait(lambda: self.proc.poll() is not None, "the driver's exit", alive=False)
        assert self.proc.returncode == 0, f"driver exited {self.proc.returncode}:\n{tail(self.log_path)}"
        self.wait(lambda: not session_procs(self.proc.pid), "the driver's processes to exit", alive=False)

    def cleanup(self) -> None:
        if self.proc.poll() is None or session_procs(self.proc.pid):
            kill_session(self.proc)


def snapshots_of(table, pass_id: str) -> int:
    return sum(1 for s in table.metadata.snapshots if s.summary.additional_properties.get(PASS_ID) == pass_id)


def test_executor_killed_in_the_table_write_stage(tmp_path, pytestconfig):
    kills = executor_kills(pytestconfig)
    if not kills:
        pytest.skip("executor kills on a cluster run with the table-kill runs: pass --table-kills N")
    rng = random.Random(SEED)
    control, root = tmp_path / "control", str(tmp_path / "logs")
    control.mkdir()
    lm = LogManager(root)
    models, works = {}, {}
    for topic, mode in TOPICS.items():
        config = {"table.mode": mode, "retention.ms": "-1"}
        if mode == "upsert":
            config["cleanup.policy"] = "compact"
        lm.create_topic(topic, PARTITIONS, config)
        models[topic] = TopicModel(topic, PARTITIONS)
        works[topic] = Workload(lm, models[topic], rng.randrange(1 << 30), keys=12)
    (control / "spec.json").write_text(json.dumps({"master": MASTER, "root": root, "topics": sorted(TOPICS)}))
    t0 = time.monotonic()
    d = SparkDriver(control, spark_env(tmp_path))
    report = []
    try:
        for n in range(kills):
            victim_topic = sorted(TOPICS)[n % len(TOPICS)]
            victim_partition = rng.randrange(PARTITIONS)
            for work in works.values():
                for _ in range(rng.randrange(3, 10)):
                    work.step()
                # the victim's partition and the next one have new records past any transaction (two ranges or
                # more: the writes go to Spark tasks, one per partition); the others may stay held
                sure = {victim_partition, (victim_partition + 1) % PARTITIONS}
                for p in range(PARTITIONS):
                    if p in work.open and (p in sure or rng.random() < 0.5):
                        work.end_transaction(p, "commit" if rng.random() < 0.6 else "abort")
                    if p not in work.open:
                        work.plain_batch(p, rng.randrange(1, 6))
            before = {}
            for topic in TOPICS:
                try:
                    before[topic] = len(load_table(lm, topic).metadata.snapshots)
                except NoSuchTableError:  # before the first pass
                    before[topic] = 0
            when = ("mid", "after")[rng.randrange(2)] if n >= 2 else ("mid", "after")[n]
            victim = {"topic": victim_topic, "task": f"p{victim_partition}", "when": when}
            done = d.run_pass(n, T0 + 90 * DAY + n * DAY, victim)
            assert done["error"] is None, done["error"]
            assert not done["partition_errors"], done["partition_errors"]
            killed = read_json(control / f"killed-{n}.json")
            assert killed is not None and killed["attempt"] == 0, f"pass {n}: no attempt killed itself ({victim})"
            retries = sorted(control.glob(f"attempt-{n}-{victim_topic}-{victim['task']}-*.json"))
            attempts = [read_json(f) for f in retries]
            assert attempts and all(a["attempt"] > 0 for a in attempts), (n, attempts)  # retried; 0 never returned
            assert done["failed_tasks"] >= n + 1, done  # Spark counted each killed attempt
            assert killed["paths"] and killed["when"] == when, killed
            for t in done["tables"]:
                topic, mode = t["topic"], TOPICS[t["topic"]]
                assert t["error"] is None and t["committed"], t["line"]
                table = load_table(lm, topic)
                where = f"pass {n}, table of {topic}"
                assert len(table.metadata.snapshots) == before[topic] + 1, where  # one commit
                pass_id = table.current_snapshot().summary.additional_properties[PASS_ID]
                assert snapshots_of(table, pass_id) == 1, where
                got = assert_equals_model(table, models[topic], mode, where)
                if topic == victim_topic:
                    assert pass_id == killed["pass_id"], where
                    on_disk, named = data_files_on_disk(root), referenced_files(table)
                    left = {p for p in killed["paths"] if p in on_disk and p not in named}
                    assert not left, f"{where}: files of the killed attempt left behind: {sorted(left)}"
                    rewritten = sum(1 for p in killed["paths"] if p in named)
                    report.append(
                        f"pass {n}: {victim_topic} task {victim['task']} attempt 0 killed executor "
                        f"{killed['executor']} (JVM {killed['jvm']}) {when} writing its data files "
                        f"({len(killed['paths'])} begun); "
                        f"retried as attempt(s) {[a['attempt'] for a in attempts]} on executor(s) "
                        f"{sorted({a['executor'] for a in attempts})}; one commit; {rewritten} of the killed "
                        f"attempt's file(s) rewritten by the retry and named by the commit, "
                        f"{t['orphans_removed']} orphan(s) removed; {got['rows']} rows at {got['offsets']}: "
                        "0 lost, 0 twice, 0 aborted"
                    )
            # the data folders hold only what the snapshots name
            named = set()
            for topic in TOPICS:
                named |= referenced_files(load_table(lm, topic))
            assert data_files_on_disk(root) == named, f"pass {n}: files no snapshot names"
        d.stop()
    finally:
        d.cleanup()
    for topic in TOPICS:
        assert table_offsets(load_table(lm, topic))  # every pass committed
    print(
        f"\nSpark executor kills in the table write stage: {kills} on {MASTER}, {time.monotonic() - t0:.0f}s\n"
        + "\n".join(report)
    )
