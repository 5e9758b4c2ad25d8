"""Materialization passes that SIGKILL their own process at a chosen operation, for test_table_kill.py; and
what the table crash and kill tests share: the operations of a pass that a crash or a kill is placed at, and
the checks of a table against the brute-force model (tests/helpers/table_model.py).

    python tests/storage/tables/table_kill_driver.py ROOT TOPIC NOW_MS KILL_AT
    python tests/storage/tables/table_kill_driver.py --serve
    python tests/storage/tables/table_kill_driver.py --spark CONTROL_DIR

The first runs materialize_topic(LogManager(ROOT), TOPIC, now_ms=NOW_MS) and, just before its operation number
KILL_AT (0-based, in the order of counted_operations), writes `kill at <n>: <operation>` to stdout and sends
itself SIGKILL: nothing of the process runs after that, as in a machine's crash. KILL_AT -1 kills nowhere; the
pass then ends with one JSON line {"ops": n, "committed": ..., "error": ...}. The second does the same for each
JSON line {"root", "topic", "now_ms", "kill_at"} on its stdin, each pass in a process forked for it (the
imports, most of a start, made once), and after each writes {"status": "killed", "signal": 9} (or "exited",
"code") once that process is gone. It forks only while it has no thread of its own. The third is the Spark
job of test_table_spark_kill.py (spark_job below): maintenance passes on a local cluster whose table write
tasks kill their executor at a chosen task's first attempt.

The operations (counted_operations) are what a crash can fall between: a data file opened (DataFileWriter
._new_file) and finished (._finish), every FileIO file created (data files, manifests, manifest lists,
metadata files) or deleted, the catalog's commit_table (before it, and after it landed: a commit whose answer
was lost), every write of ROOT's table state (table_state.write_state) and every orphan file removed (fsspec's
local rm). Parts of a pass run on threads (a partition's data files each, pyiceberg's manifests): their
operations are counted too; they are the same in number on every run of the same pass (nothing in a pass runs
on a timer), so a count taken on one run places a crash on another.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

if __name__ == "__main__":  # run as a script: the repository root on sys.path, as pytest has it
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

COMMIT = "commit_table"
COMMIT_LANDED = "commit_table landed"


@contextlib.contextmanager
def counted_operations(tick: Callable[[str], None]):
    """Within: tick(label) is called before each operation of a pass (see the module doc), from whichever
    thread makes it; what tick raises, the operation raises instead of running. Patches classes: one at a
    time."""
    import fsspec.implementations.local as fsspec_local
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

    from storage.tables import table_state
    from storage.tables.data_files import DataFileWriter

    saved = []

    def patch(owner, name, make):
        real = getattr(owner, name)
        saved.append((owner, name, real))
        setattr(owner, name, make(real))

    def before(label, path_arg=None):
        def make(real):
            def op(*args, **kwargs):
                what = label
                if path_arg is not None and len(args) > path_arg:
                    what = f"{label} {_base(args[path_arg])}"
                tick(what)
                return real(*args, **kwargs)

            return op

        return make

    def commit(real):
        def op(self, table, *args, **kwargs):
            tick(COMMIT)
            out = real(self, table, *args, **kwargs)
            tick(COMMIT_LANDED)  # a crash here: the commit is made, its answer lost
            return out

        return op

    def file_create(real):
        def op(self, *args, **kwargs):
            tick(f"create {_base(self.location)}")
            return real(self, *args, **kwargs)

        return op

    def state_write(real):
        def op(fs, log_dir, state, *args, **kwargs):
            tick(f"write_state pending={len(state.pending)} offsets={dict(sorted(state.next_offsets.items()))}")
            return real(fs, log_dir, state, *args, **kwargs)

        return op

    try:
        patch(DataFileWriter, "_new_file", before("new data file"))
        patch(DataFileWriter, "_finish", before("finish data file"))
        patch(PyArrowFile, "create", file_create)
        patch(PyArrowFileIO, "delete", before("delete", 1))
        patch(SqlCatalog, "commit_table", commit)
        patch(table_state, "write_state", state_write)
        patch(fsspec_local.LocalFileSystem, "rm", before("remove orphan", 1))
        yield
    finally:
        for owner, name, real in reversed(saved):
            setattr(owner, name, real)


def _base(path) -> str:
    text = getattr(path, "location", path)
    return str(text).rsplit("/", 1)[-1]


def op_kind(label: str) -> str:
    """An operation's label without its file: what kind of step of a pass it is."""
    if label.startswith("create "):
        name = label.split(" ", 1)[1]
        if name.endswith(".parquet"):
            return "create data file"
        if name.endswith(".metadata.json"):
            return "create metadata file"
        return "create manifest list" if name.startswith("snap-") else "create manifest"
    for kind in ("write_state", "remove orphan", "delete"):
        if label.startswith(kind):
            return kind
    return label


class Counter:
    """A tick for counted_operations that records every operation (thread-safe)."""

    def __init__(self):
        self.ops: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, label: str) -> None:
        with self._lock:
            self.ops.append(label)


# ---------------------------------------------------------------- the table, checked against the model


def load_table(lm, topic: str, *, errors: bool = False):
    """The topic's table (or its errors table) as its catalog has it now (a catalog opened anew: nothing
    cached)."""
    from storage.tables.catalog import open_catalog
    from storage.tables.table_config import TableConfig

    cfg = TableConfig.of(topic, lm.topic(topic).config)
    return open_catalog(lm, cfg).load_table(cfg.errors_identifier if errors else cfg.identifier)


def table_offsets(table) -> dict[int, int]:
    """The next offsets the table's snapshots say it holds ({} before its first commit)."""
    from storage.tables.table_offsets import committed_offsets

    return dict(committed_offsets(table).next_offsets or {})


def referenced_files(table) -> set[str]:
    """Every data file any snapshot of the table names (added, kept or deleted by it)."""
    out = set()
    for s in table.metadata.snapshots:
        for m in s.manifests(table.io):
            for e in m.fetch_manifest_entry(table.io, discard_deleted=False):
                out.add(e.data_file.file_path)
    return out


def data_files_on_disk(root: str) -> set[str]:
    """The Parquet files under the data/ folders of ROOT's own warehouse, as file:// URLs."""
    pattern = os.path.join(root, ".kafkalog-tables", "warehouse", "**", "data", "**", "*.parquet")
    return {"file://" + p for p in glob.glob(pattern, recursive=True)}


def compare(table, model, mode: str) -> dict:
    """How the table's rows differ from the model's at the table's own offsets: counts of rows lost, rows
    twice, rows of aborted or open transactions and other rows that should not be there; all 0 when equal."""
    from collections import Counter as Bag

    from tests.helpers.table_model import table_rows

    offsets = table_offsets(table)
    got = table_rows(table) if table.current_snapshot() is not None else []
    want = model.upsert_rows(offsets) if mode == "upsert" else model.append_rows(offsets)
    bag, want_set = Bag(got), set(want)
    not_committed = {
        (r.partition, r.offset) for r in model.records if r.txn is not None and model.outcome.get(r.txn) != "commit"
    }
    return {
        "offsets": offsets,
        "rows": len(got),
        "lost": len(want_set - set(bag)),
        "twice": sum(n - 1 for n in bag.values() if n > 1),
        "aborted": sum(1 for row in bag if (row[0], row[1]) in not_committed),
        "extra": sum(1 for row in bag if row not in want_set),
    }


def assert_equals_model(table, model, mode: str, where: str = "") -> dict:
    d = compare(table, model, mode)
    bad = {k: d[k] for k in ("lost", "twice", "aborted", "extra") if d[k]}
    assert not bad, f"{where}: the table differs from the model at offsets {d['offsets']}: {bad}"
    return d


# ---------------------------------------------------------------- the driver


def run_pass(root: str, topic: str, now_ms: int, kill_at: int) -> int:
    """One pass, killing this process before operation kill_at; returns the exit code when it did not."""
    from storage.log_manager import LogManager
    from storage.tables.materializer import materialize_topic

    lock = threading.Lock()
    done = [0]

    def tick(label: str) -> None:
        with lock:
            if done[0] == kill_at:
                os.write(1, f"kill at {done[0]}: {label}\n".encode())
                os.kill(os.getpid(), signal.SIGKILL)
            done[0] += 1

    with counted_operations(tick):
        rep = materialize_topic(LogManager(root), topic, now_ms=now_ms)
    os.write(1, (json.dumps({"ops": done[0], "committed": rep.committed, "error": rep.error}) + "\n").encode())
    return 0 if rep.error is None else 1


def serve() -> int:
    """The --serve loop (see the module doc)."""
    import storage.log_manager  # noqa: F401 - the imports every pass needs, made once before the forks
    import storage.tables.materializer  # noqa: F401

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if threading.active_count() != 1:  # a fork copies no other thread: a lock one held would never be freed
            raise RuntimeError(f"threads before a fork: {threading.enumerate()}")
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run_pass(req["root"], req["topic"], int(req["now_ms"]), int(req["kill_at"]))
            except BaseException:  # noqa: BLE001 - reported; the process ends below either way
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if os.WIFSIGNALED(status):
            out = {"status": "killed", "signal": os.WTERMSIG(status)}
        else:
            out = {"status": "exited", "code": os.waitstatus_to_exitcode(status)}
        os.write(1, (json.dumps(out) + "\n").encode())
    return 0


# ---------------------------------------------------------------- the Spark job (test_table_spark_kill.py)

EXECUTOR_MAIN = b"org.apache.spark.executor.CoarseGrainedExecutorBackend"


def _write_json(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _executor_jvm() -> tuple[str, int]:
    """(executor id, JVM pid) of the executor this Python worker serves: its first ancestor whose command line
    is an executor JVM's."""
    pid = os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if EXECUTOR_MAIN in cmd and b"--executor-id" in cmd:
                return cmd[cmd.index(b"--executor-id") + 1].decode(), pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return "?", 0


def write_or_kill(job, *, control: str, real):
    """A Spark task's write_ranges(job) that, at the first attempt of the victim's task (CONTROL/victim.json
    names the pass, topic, task and when), SIGKILLs its executor JVM and then its own Python worker: `after`
    it wrote its data files (before it returns them), or `mid` its first data file (rows written, the file
    not finished: no Parquet footer). Which attempt that is, is decided by creating CONTROL/killed-<pass>.json
    with O_EXCL, so each pass kills exactly once, whatever Spark retries; the file says what the attempt had
    written. Every attempt that returns says so in CONTROL/attempt-<pass>-<topic>-<task>-<attempt>.json."""
    from pyspark import TaskContext

    from storage.tables.data_files import DataFileWriter

    ctx = TaskContext.get()
    attempt = ctx.attemptNumber() if ctx is not None else -1
    victim = _read_json(os.path.join(control, "victim.json"), {}) or {}
    eid, jvm = _executor_jvm()
    info = {"executor": eid, "jvm": jvm, "attempt": attempt, "pass_id": job.table.pass_id, "began": time.time()}
    fd = None
    if (job.topic, job.task) == (victim.get("topic"), victim.get("task")) and jvm:
        try:
            fd = os.open(os.path.join(control, f"killed-{victim['pass']}.json"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass

    def die(paths, when):
        os.write(
            fd, json.dumps({**info, "paths": list(paths), "when": when, "topic": job.topic, "task": job.task}).encode()
        )
        os.fsync(fd)
        os.kill(jvm, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    finish = DataFileWriter._finish
    if fd is not None and victim.get("when") == "mid":

        def finish_or_die(self, value):
            if self.ctx is job.table:  # this task's table writer, not its errors writer
                die(self.paths, "mid")
            return finish(self, value)

        DataFileWriter._finish = finish_or_die
    try:
        result = real(job)
    finally:
        DataFileWriter._finish = finish
    if fd is not None:
        die(result.paths, "after")
    info["paths"], info["ended"] = list(result.paths), time.time()
    _write_json(os.path.join(control, f"attempt-{victim.get('pass')}-{job.topic}-{job.task}-{attempt}.json"), info)
    return result


def spark_job(control: str) -> int:
    """Maintenance passes (kafkalog_ds.maintenance.run_once(ROOT, spark=...)) on CONTROL/spec.json's master,
    one per CONTROL/go-<n>.json the test writes ({"now_ms", "victim": {"topic", "task"}}), each answered with
    CONTROL/done-<n>.json; until CONTROL/stop. Before each pass: two live executors."""
    import functools

    os.environ["PYSPARK_PYTHON"] = sys.executable  # before the JVM starts: executors and workers run this
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from kafkalog_ds.maintenance import run_once
    from storage.tables import materializer

    t0 = time.monotonic()

    def log(msg: str) -> None:
        print(f"driver +{time.monotonic() - t0:.1f}s: {msg}", flush=True)

    spec = _read_json(os.path.join(control, "spec.json"))
    spark = (
        SparkSession.builder.master(spec["master"])
        .appName("kafkalog-table-executor-kills")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .config("spark.executor.memory", "1024m")
        .config("spark.task.maxFailures", "50")  # every pass loses an executor: never fail the job for it
        .config("spark.deploy.maxExecutorRetries", "-1")  # nor the application for executors that died
        .config("spark.ui.retainedStages", "100000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    log(f"session on {spec['master']}")
    materializer.write_ranges = functools.partial(write_or_kill, control=control, real=materializer.write_ranges)

    def live_executors() -> int:
        lst = spark.sparkContext._jsc.sc().statusStore().executorList(True)
        return sum(1 for i in range(lst.size()) if lst.apply(i).id() != "driver")

    def failed_tasks() -> int:
        tracker, failed, sid, misses = spark.sparkContext.statusTracker(), 0, 0, 0
        while misses < 200:  # stage ids are dense from 0
            info = tracker.getStageInfo(sid)
            misses = misses + 1 if info is None else 0
            failed += info.numFailedTasks if info is not None else 0
            sid += 1
        return failed

    rc, n = 0, 0
    try:
        while True:
            go = os.path.join(control, f"go-{n}.json")
            while not os.path.exists(go) and not os.path.exists(os.path.join(control, "stop")):
                time.sleep(0.05)
            req = _read_json(go)
            if req is None:
                break
            while live_executors() < 2:  # the last pass's killed executor, relaunched by the worker
                time.sleep(0.05)
            log(f"pass {n}: two live executors")
            _write_json(os.path.join(control, "victim.json"), {"pass": n, **req["victim"]})
            log(f"pass {n} begins at {time.time():.3f}")
            out: dict = {"error": None}
            try:
                reps = run_once(spec["root"], spark=spark, topics=spec["topics"], now_ms=req["now_ms"])
                out["tables"] = [
                    {
                        "topic": t.topic,
                        "line": t.line(),
                        "error": t.error,
                        "committed": t.committed,
                        "orphans_removed": t.orphans_removed,
                    }
                    for t in reps.tables
                ]
                out["partition_errors"] = [r.line() for r in reps if r.errors]
            except Exception:  # noqa: BLE001 - reported to the test
                out["error"] = traceback.format_exc()
            out["failed_tasks"] = failed_tasks()
            log(f"pass {n} done: {out.get('tables')}")
            _write_json(os.path.join(control, f"done-{n}.json"), out)
            n += 1
    except BaseException:
        traceback.print_exc()
        rc = 1
    spark.stop()
    return rc


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    if argv[:1] == ["--spark"]:
        return spark_job(argv[1])
    return run_pass(argv[0], argv[1], int(argv[2]), int(argv[3]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
