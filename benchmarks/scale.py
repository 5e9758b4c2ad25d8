"""How the driver-side costs grow with partitions and segments: planning, a stream trigger, listing,
describe, a maintenance pass, and the memory planning takes.

Run:
    python benchmarks/scale.py --quick             # up to 1000 partitions, 100 segments (a couple of minutes)
    python benchmarks/scale.py                     # up to 10,000 partitions, 1000 segments
    python benchmarks/scale.py --s3 --quick        # on moto's S3 server in this process: requests and bytes too
    python benchmarks/scale.py --spark --ops a,b,e # also through Spark (local[2]): planning, idle triggers, maintain
    python benchmarks/scale.py --ops b --profile b --profile-layout 10x100   # cProfile of one op
Options: --max-partitions N (default 10000), --max-segments N (default 1000), --ops a,b,c,d,e,f,
--json FILE (every figure, per op and layout), --op-budget S (an op whose run took longer than S seconds
is not run on the larger layouts; default 300), --keep (keep the temp dir).

Layouts, each in a root of its own (under /tmp/scale-bench-*, or s3://kafkalog-test/scale-bench/...),
built once per run and shared by every operation; TxP is T topics of P partitions, every partition
holding one 3-record batch per segment (timestamps now, so nothing is due for retention):
- partition sweep: 1x1, 1x10, 10x10, 10x100, 100x100 (1, 10, 100, 1000, 10,000 partitions), one segment each;
- segment sweep: 1x1 and 1x10 with 1, 10, 100, 1000 segments per partition. Local disk: a topic with
  segment.bytes=100 and one append of S batches (every batch rolls a segment). S3: S appends (one segment
  object each).
The build (create_topic, then one writable open + append per partition) is timed and reported on its own.

Operations (--ops):
  a  planning a batch read: KafkaLogBatchReader.partitions() for subscribePattern ".*" (SourceOptions as
     data_source.py builds them); with --spark also spark.read.format("kafkalog")...load(root) and
     planning forced by df._jdf.queryExecution().toRdd().getNumPartitions() (the Python planner worker runs)
  b  one readStream trigger with nothing new: KafkaLogStreamReader.latestOffset(start, ReadAllAvailable())
     + partitions(start, end) with start == latest (no Spark); the note column splits the two. With --spark
     also a readStream query into the noop sink, trigger(processingTime=0): Spark's own triggerExecution,
     median of 30 triggers with nothing new (spark.sql.streaming.noDataProgressEventInterval=0)
  c  LogManager(root) + topics() + partitions(t) for every topic
  d  `kafkalog describe ROOT` through the CLI (LogManager.describe and the text tables), output discarded
  e  one `maintain --once` pass with nothing due (storage.log_maintenance.run_once); with --spark also
     kafkalog_ds.maintenance.run_once(spark=...) (4 tasks per core, local[2]). kafkalog.segment.merge.min.age.ms is set
     to ~forever so the S3 layouts' small segments are not merged (which would change them)
  f  peak memory of driver-side planning (op a, direct): a fresh `python` subprocess warms up on the 1x1
     layout (imports, numba kernels), then plans the layout; reported: the growth of its peak RSS
     (resource.getrusage ru_maxrss, the high-water mark, so the planning's extra memory over the warm
     process), not tracemalloc (which would slow planning and miss Arrow/numpy buffers)

Columns: "wall ms" is the best of up to 5 runs (runs repeat until 0.5 s is spent); "cpu ms" is the CPU
time of this process in that run (time.process_time: every thread, so on S3 it includes the moto server
answering in this process), or for the Spark rows the CPU of this process tree (JVM and Python workers);
"others s" is the CPU every other process on the machine took meanwhile, from /proc/stat minus this
process tree (as benchmarks/sink.py: rerun when it is not ~0). ms/part and ms/seg divide the wall time by
the partitions and by the segments (partitions x segments per partition); on S3, requests (by method:
LIST is a GET with a list query) and bytes received are the server's, for the best run, and req/part,
req/seg divide them likewise. The "growth" table compares per-unit cost at the largest layout with the
100-partition one (the trigger and the Spark rows: with the 10-partition one too), and per-segment cost
at the most segments with 10 segments; a ratio well above 1 is super-linear growth.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)  # sink (cpu accounting), s3_lookup (the --s3 server)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from sink import machine_busy_seconds, tree_cpu_seconds  # noqa: E402

PARTITION_LAYOUTS = [(1, 1), (1, 10), (10, 10), (10, 100), (100, 100)]  # topics x partitions per topic
SEGMENT_PARTITIONS = [1, 10]
SEGMENT_COUNTS = [1, 10, 100, 1000]
RECORDS_PER_BATCH = 3
MAINT_SETTINGS = {"kafkalog.segment.merge.min.age.ms": str(10**13)}  # nothing due: no merge of small segments
OP_NAMES = {
    "a": "plan (direct)",
    "a-spark": "plan (spark)",
    "b": "trigger",
    "b-spark": "trigger (spark)",
    "c": "list",
    "d": "describe",
    "e": "maintain",
    "e-spark": "maintain (spark)",
    "f": "plan memory",
}


@dataclass(frozen=True)
class Layout:
    topics: int
    per_topic: int
    segments: int

    @property
    def name(self) -> str:
        return f"{self.topics}x{self.per_topic}" + (f"/{self.segments}seg" if self.segments > 1 else "")

    @property
    def partitions(self) -> int:
        return self.topics * self.per_topic

    @property
    def total_segments(self) -> int:
        return self.partitions * self.segments


@dataclass
class Result:
    op: str
    layout: str
    partitions: int
    segments: int  # per partition
    wall_s: float = 0.0
    cpu_s: float = 0.0
    others_s: float = 0.0
    runs: int = 0
    requests: dict = field(default_factory=dict)  # method (LIST for listings) -> count
    bytes_in: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)
    skipped: str = ""

    @property
    def n_requests(self) -> int:
        return sum(self.requests.values())


# ---------------------------------------------------------------------------------------------- helpers


def req_kind(r) -> str:
    if r.method == "GET" and ("list-type" in r.query or "prefix=" in r.query or "delimiter=" in r.query):
        return "LIST"
    return r.method


class Env:
    """Where the layouts live: local temp dir or the S3 server; storage options in both forms."""

    def __init__(self, work: str, server=None, bucket: str | None = None, fs_options: dict | None = None):
        self.work = work
        self.server = server
        self.bucket = bucket
        self.spark = None
        self.layouts: list[Layout] = []
        self.built_at: dict[str, float] = {}  # layout name -> time.time() its build ended
        self._fs_options = fs_options  # the Spark-form options, given (the planning child has no server)

    @property
    def s3(self) -> bool:
        return self.server is not None

    def root(self, layout: Layout) -> str:
        name = layout.name.replace("/", "-")
        if self.s3:
            return f"s3://{self.bucket}/scale-bench/{name}"
        return os.path.join(self.work, name)

    @property
    def storage_options(self) -> dict | None:
        return self.server.storage_options if self.s3 else None

    @property
    def spark_options(self) -> dict:
        if self._fs_options is not None:
            return self._fs_options
        if not self.s3:
            return {}
        from s3_lookup import spark_fs_options

        return spark_fs_options(self.server)

    @property
    def cli_fs(self) -> list[str]:
        out = []
        for k, v in self.spark_options.items():
            out += ["--fs", f"{k[len('fs.') :]}={v}"]
        return out

    def mark(self):
        return self.server.log.mark() if self.s3 else 0

    def requests_since(self, mark) -> list:
        return self.server.log.since(mark) if self.s3 else []


def measure(env: Env, fn, *, tree_cpu: bool = False, min_total: float = 0.5, max_runs: int = 5, min_runs: int = 2):
    """Best run of fn(): (wall, cpu, others, requests, value). Repeats until min_total s or max_runs, and at
    least twice, so that a big layout's figure is not its first touch of the page cache while small ones are
    warm (10,000 partitions planned in 1.66 s cold, 1.32 s warm)."""
    me = os.getpid()
    runs = []
    spent = 0.0
    while True:
        mark = env.mark()
        busy0, tree0, cpu0 = machine_busy_seconds(), tree_cpu_seconds(me), time.process_time()
        t0 = time.perf_counter()
        value = fn()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        tree = tree_cpu_seconds(me) - tree0
        others = max(0.0, machine_busy_seconds() - busy0 - tree)
        runs.append((wall, tree if tree_cpu else cpu, others, env.requests_since(mark), value))
        spent += wall
        if len(runs) >= max_runs or (spent >= min_total and len(runs) >= min_runs):
            break
    best = min(runs, key=lambda r: r[0])
    return best, len(runs)


def fill(res: Result, best, runs: int, env: Env | None = None) -> Result:
    wall, cpu, others, reqs, _ = best
    res.wall_s, res.cpu_s, res.others_s, res.runs = wall, cpu, others, runs
    res.requests = dict(sorted(Counter(req_kind(r) for r in reqs).items()))
    res.bytes_in = sum(r.body_bytes for r in reqs)
    if reqs and env is not None and env.s3:
        root = env.root(next(lay for lay in env.layouts if lay.name == res.layout))
        n, b = Counter(), Counter()
        for r in reqs:
            t = req_target(r, root[len("s3:/") :])
            n[t] += 1
            b[t] += r.body_bytes
        res.extra["by_target"] = {t: {"requests": n[t], "bytes": b[t]} for t in sorted(n)}
    return res


def req_target(r, root_path: str) -> str:
    """What a request was for: 'LIST root', 'LIST partition', 'LIST <name>' (a prefix under the root), or
    the method and the object's kind ('GET log', 'GET json', 'HEAD recovery-point-offset-checkpoint')."""
    from storage.topic_partition import parse_log_dir_name

    if req_kind(r) == "LIST":
        prefix = "/" + r.path.strip("/").split("/", 1)[0] + "/" + urllib.parse.parse_qs(r.query).get("prefix", [""])[0]
        rel = prefix.rstrip("/")[len(root_path) :].strip("/")
        if not prefix.startswith(root_path):
            return "LIST outside the root"
        if rel == "":
            return "LIST root"
        if parse_log_dir_name(rel.split("/")[0]) is not None:
            return "LIST partition"
        return f"LIST {rel}"
    name = r.path.rsplit("/", 1)[-1]
    return f"{r.method} {name.rsplit('.', 1)[-1] if '.' in name else name}"


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- build


def build_layout(env: Env, layout: Layout) -> dict:
    """Create the layout's topics and write its records; returns the build's timings (and requests)."""
    import pyarrow as pa

    from storage.common.time import SYSTEM_TIME
    from storage.log_manager import LogManager
    from storage.records.builder import build_records
    from storage.topic_partition import TopicPartition

    root = env.root(layout)
    now = SYSTEM_TIME.milliseconds()
    table = pa.table(
        {
            "key": [b"key-%d" % i for i in range(RECORDS_PER_BATCH)],
            "value": [b"v" * 32] * RECORDS_PER_BATCH,
            "timestamp": pa.array([now] * RECORDS_PER_BATCH, pa.int64()),
        }
    )
    one = build_records(table)
    mark = env.mark()
    t0 = time.perf_counter()
    lm = LogManager(root, env.storage_options)
    config = {"segment.bytes": "100"} if layout.segments > 1 else None  # every batch rolls a segment
    topics = [f"t{t:03d}" for t in range(layout.topics)]
    for t in topics:
        lm.create_topic(t, layout.per_topic, config)
    t_create = time.perf_counter() - t0
    create_reqs = len(env.requests_since(mark))
    immutable = not lm.fs.capabilities.append
    t1 = time.perf_counter()
    slowest = 0.0
    with lm.snapshot():  # checkpoints read once, recovery points written once (README, "From Python")
        for i, t in enumerate(topics):
            for p in range(layout.per_topic):
                ta = time.perf_counter()
                with lm.open_log(TopicPartition(t, p), writable=True) as log:
                    if immutable:  # one segment object per append
                        for _ in range(layout.segments):
                            log.append(one)
                    else:
                        log.append(one * layout.segments)
                slowest = max(slowest, time.perf_counter() - ta)
            if layout.partitions >= 1000 and (i + 1) % max(1, layout.topics // 10) == 0:
                progress(
                    f"  build {layout.name}: {(i + 1) * layout.per_topic} partitions written, "
                    f"{time.perf_counter() - t0:.1f}s"
                )
    t_append = time.perf_counter() - t1
    env.built_at[layout.name] = time.time()
    with LogManager(root, env.storage_options).open_log(TopicPartition(topics[-1], layout.per_topic - 1)) as log:
        got = (len(log.segments), log.log_end_offset)
    want = (layout.segments, layout.segments * RECORDS_PER_BATCH)
    if got != want:
        raise RuntimeError(
            f"layout {layout.name}: last partition has {got[0]} segments, end offset {got[1]}; expected {want}"
        )
    reqs = env.requests_since(mark)
    return {
        "layout": layout.name,
        "partitions": layout.partitions,
        "segments": layout.segments,
        "create_s": t_create,
        "append_s": t_append,
        "slowest_partition_s": slowest,
        "requests": len(reqs),
        "create_requests": create_reqs,
        "by_method": dict(sorted(Counter(req_kind(r) for r in reqs).items())),
    }


# ---------------------------------------------------------------------------------------------- operations


def source_options(env: Env, root: str, streaming: bool):
    from python_datasource.source_options import SourceOptions

    return SourceOptions.parse({"path": root, "subscribePattern": ".*", **env.spark_options}, streaming=streaming)


def plan_direct(env: Env, root: str) -> list:
    from python_datasource.reader import KafkaLogBatchReader, selected_columns

    opts = source_options(env, root, streaming=False)
    return KafkaLogBatchReader(opts, selected_columns(None, opts.include_headers)).partitions()


def op_plan(env: Env, layout: Layout) -> Result:
    root = env.root(layout)
    best, runs = measure(env, lambda: plan_direct(env, root))
    parts = best[4]
    if len(parts) != layout.partitions:
        raise RuntimeError(f"plan of {layout.name}: {len(parts)} input partitions, expected {layout.partitions}")
    return fill(Result("a", layout.name, layout.partitions, layout.segments), best, runs, env)


def op_plan_spark(env: Env, layout: Layout) -> Result:
    spark = env.spark
    root = env.root(layout)

    def run():
        df = spark.read.format("kafkalog").options(**env.spark_options).option("subscribePattern", ".*").load(root)
        return df._jdf.queryExecution().toRdd().getNumPartitions()

    best, runs = measure(env, run, tree_cpu=True)
    if best[4] != layout.partitions:
        raise RuntimeError(f"spark plan of {layout.name}: {best[4]} partitions, expected {layout.partitions}")
    return fill(Result("a-spark", layout.name, layout.partitions, layout.segments), best, runs, env)


def op_trigger(env: Env, layout: Layout) -> Result:
    from python_datasource import reader as rd
    from storage.log_offsets import SETTLE_NS

    # a trigger reuses a partition's offsets once its files are SETTLE_NS old: measure the steady state
    time.sleep(max(0.0, env.built_at.get(layout.name, 0.0) + SETTLE_NS / 1e9 + 0.1 - time.time()))
    root = env.root(layout)
    opts = source_options(env, root, streaming=True)
    stream = rd.KafkaLogStreamReader(opts, rd.selected_columns(None, opts.include_headers))
    start = stream.latestOffset()  # what the previous trigger ended at
    limit = rd.ReadAllAvailable() if rd.ReadAllAvailable is not None else None
    split = {}

    def run():
        t0 = time.perf_counter()
        end = stream.latestOffset(start, limit)
        t1 = time.perf_counter()
        parts = stream.partitions(start, end)
        t2 = time.perf_counter()
        split[t2 - t0] = (t1 - t0, t2 - t1)
        if end != start or parts:
            raise RuntimeError(f"trigger on {layout.name}: something new ({len(parts)} partitions)")

    best, runs = measure(env, run)
    res = fill(Result("b", layout.name, layout.partitions, layout.segments), best, runs, env)
    lat, par = min(split.items())[1]
    res.extra = {"latestOffset_s": lat, "partitions_s": par}
    res.note = f"latestOffset {lat * 1000:.1f} + partitions {par * 1000:.1f} ms"
    return res


def op_trigger_spark(env: Env, layout: Layout, triggers: int = 30) -> Result:
    """Spark's own triggerExecution of readStream triggers with nothing new (median of `triggers`, after the
    first few), with a query that has read everything there is: what a user's idle stream costs."""
    import statistics
    import tempfile

    spark = env.spark
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")  # a progress for every idle trigger
    ckpt = tempfile.mkdtemp(prefix="scale-trigger-", dir=env.work)
    q = (
        spark.readStream.format("kafkalog")
        .options(**env.spark_options)
        .option("subscribePattern", ".*")
        .load(env.root(layout))
        .writeStream.format("noop")
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="0 seconds")
        .start()
    )
    busy0 = machine_busy_seconds()
    try:
        idle = []
        while len(idle) < triggers + 5:  # a hang guard would only hide a bug here: the query fails or idles
            if q.exception() is not None:
                raise RuntimeError(f"trigger (spark) on {layout.name}: {q.exception()}")
            idle = [p for p in q.recentProgress if p["numInputRows"] == 0 and "latestOffset" in p["durationMs"]]
            time.sleep(0.2)
    finally:
        q.stop()
    idle = idle[5:]
    te = statistics.median(p["durationMs"]["triggerExecution"] for p in idle) / 1000
    lo = statistics.median(p["durationMs"]["latestOffset"] for p in idle) / 1000
    res = fill(
        Result("b-spark", layout.name, layout.partitions, layout.segments),
        (te, 0.0, machine_busy_seconds() - busy0, [], None),
        len(idle),
        env,
    )
    res.extra = {"latestOffset_s": lo}
    res.note = f"median of {len(idle)} idle triggers; latestOffset {lo * 1000:.1f} ms; cpu n/a; others: whole run"
    return res


def op_list(env: Env, layout: Layout) -> Result:
    from storage.log_manager import LogManager

    root = env.root(layout)

    def run():
        lm = LogManager(root, env.storage_options)
        return [tp for t in lm.topics() for tp in lm.partitions(t)]

    best, runs = measure(env, run)
    if len(best[4]) != layout.partitions:
        raise RuntimeError(f"list of {layout.name}: {len(best[4])} partitions")
    return fill(Result("c", layout.name, layout.partitions, layout.segments), best, runs, env)


def op_describe(env: Env, layout: Layout) -> Result:
    from kafkalog_ds import cli

    root = env.root(layout)
    sizes = []

    def run():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = cli.main(["describe", root, *env.cli_fs])
        if code != 0:
            raise RuntimeError(f"kafkalog describe {layout.name} exited {code}")
        sizes.append(len(buf.getvalue()))

    best, runs = measure(env, run)
    res = fill(Result("d", layout.name, layout.partitions, layout.segments), best, runs, env)
    res.note = f"{sizes[-1]:,} chars of output"
    return res


def op_maintain(env: Env, layout: Layout, spark: bool = False) -> Result:
    from kafkalog_ds.maintenance import run_once

    root = env.root(layout)

    def run():
        reports = run_once(
            root,
            storage_options=env.storage_options,
            cleaner_settings=MAINT_SETTINGS,
            spark=env.spark if spark else None,
        )
        bad = [
            r
            for r in reports
            if r.errors or r.segments_deleted or r.merged_groups or r.cleaned or r.bytes_before != r.bytes_after
        ]
        if len(reports) != layout.partitions or bad:
            raise RuntimeError(
                f"maintain {layout.name}: {len(reports)} reports; did something: {bad[0].line() if bad else ''}"
            )

    best, runs = measure(env, run, tree_cpu=spark)
    return fill(Result("e-spark" if spark else "e", layout.name, layout.partitions, layout.segments), best, runs, env)


def op_memory(env: Env, layout: Layout, warm_root: str) -> Result:
    args = {"root": env.root(layout), "warm": warm_root, "options": env.spark_options}
    mark = env.mark()
    busy0, tree0 = machine_busy_seconds(), tree_cpu_seconds(os.getpid())
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--_plan-child", json.dumps(args)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    wall = time.perf_counter() - t0
    others = max(0.0, machine_busy_seconds() - busy0 - (tree_cpu_seconds(os.getpid()) - tree0))
    if proc.returncode != 0:
        raise RuntimeError(f"planning child for {layout.name} failed:\n{proc.stderr[-3000:]}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    if doc["partitions"] != layout.partitions:
        raise RuntimeError(f"planning child for {layout.name}: {doc['partitions']} partitions")
    res = fill(
        Result("f", layout.name, layout.partitions, layout.segments),
        (doc["plan_s"], doc["plan_cpu_s"], others, env.requests_since(mark), None),
        1,
        env,
    )
    res.extra = {**doc, "process_wall_s": wall}
    res.note = (
        f"RSS {doc['base_kib'] / 1024:.0f} MiB, peak +{doc['delta_kib']:,} KiB, "
        f"{doc['delta_kib'] / layout.partitions:.2f} KiB/part, {doc['delta_kib'] / layout.total_segments:.2f} "
        f"KiB/seg ({doc['how']})"
    )
    return res


def plan_child(arg: str) -> None:
    """In a fresh process: warm up on a tiny layout, then plan one layout; print its peak RSS growth."""
    import gc
    import resource

    a = json.loads(arg)
    env = Env("", fs_options=a["options"])
    plan_direct(env, a["warm"])
    gc.collect()
    try:  # reset the peak RSS (VmHWM) to the current RSS, so that the peak is the planning's own
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        how = "VmHWM after clear_refs"
    except OSError:
        how = "ru_maxrss (no reset: a lower bound)"
    base = _status_kib("VmRSS") if how.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c0, t0 = time.process_time(), time.perf_counter()
    parts = plan_direct(env, a["root"])
    plan_s, plan_cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = _status_kib("VmHWM") if how.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "partitions": len(parts),
                "base_kib": base,
                "peak_kib": peak,
                "delta_kib": peak - base,
                "plan_s": plan_s,
                "plan_cpu_s": plan_cpu,
                "how": how,
            }
        )
    )


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


# ---------------------------------------------------------------------------------------------- output


def table(results: list[Result], env: Env, unit: str) -> list[str]:
    """unit: 'part' (partition sweep) or 'seg' (segment sweep)."""
    head = f"{'op':18}{'layout':>14}{'parts':>7}{'seg/p':>6}{'runs':>5}{'wall ms':>11}{'cpu ms':>10}{'others s':>9}"
    head += f"{'ms/' + unit:>10}"
    if env.s3:
        head += f"{'reqs':>8}{'req/' + unit:>9}{'GET':>7}{'HEAD':>7}{'LIST':>7}{'PUT':>6}{'DEL':>6}{'KB in':>9}"
    head += "  note"
    lines = [head]
    prev = None
    for r in results:
        if prev is not None and r.op != prev:
            lines.append("")
        prev = r.op
        name = OP_NAMES[r.op]
        if r.skipped:
            lines.append(f"{name:18}{r.layout:>14}{r.partitions:>7}{r.segments:>6}  skipped: {r.skipped}")
            continue
        units = r.partitions if unit == "part" else r.partitions * r.segments
        line = (
            f"{name:18}{r.layout:>14}{r.partitions:>7}{r.segments:>6}{r.runs:>5}{r.wall_s * 1000:>11.1f}"
            f"{r.cpu_s * 1000:>10.1f}{r.others_s:>9.2f}{r.wall_s * 1000 / units:>10.3f}"
        )
        if env.s3:
            q = r.requests
            line += (
                f"{r.n_requests:>8}{r.n_requests / units:>9.2f}{q.get('GET', 0):>7}{q.get('HEAD', 0):>7}"
                f"{q.get('LIST', 0):>7}{q.get('PUT', 0):>6}{q.get('DELETE', 0):>6}{r.bytes_in / 1000:>9.1f}"
            )
        lines.append(line + (f"  {r.note}" if r.note else ""))
    return lines


def growth_lines(results: list[Result], env: Env) -> list[str]:
    """Per-unit cost at the largest layout vs a reference one: the partition sweep (vs 100 and vs 10
    partitions) and the segment sweep (vs 10 segments per partition)."""
    lines = [
        f"{'op':18}{'sweep':>10}{'from':>14}{'to':>14}{'ms/unit':>10}{'->':>4}{'ms/unit':>10}{'ratio':>8}"
        + (f"{'req/unit':>10}{'->':>4}{'req/unit':>10}{'KB/unit':>10}{'->':>4}{'KB/unit':>10}" if env.s3 else "")
        + "  verdict"
    ]
    ops = list(dict.fromkeys(r.op for r in results))
    for op in ops:
        rows = [r for r in results if r.op == op and not r.skipped]
        psweep = sorted((r for r in rows if r.segments == 1), key=lambda r: r.partitions)
        cands = []
        if psweep:
            big = psweep[-1]
            for ref_n in (100, 10):
                ref = next((r for r in psweep if r.partitions == ref_n), None)
                if ref is not None and big.partitions > ref.partitions:
                    cands.append(("partitions", ref, big, big.partitions, ref.partitions))
            if op == "b":  # the brief's comparison for the trigger: 1000 vs 10
                r1000 = next((r for r in psweep if r.partitions == 1000), None)
                r10 = next((r for r in psweep if r.partitions == 10), None)
                if r1000 and r10 and r1000 is not big:
                    cands.append(("partitions", r10, r1000, 1000, 10))
        for np_ in SEGMENT_PARTITIONS:
            ssweep = sorted(
                (r for r in rows if r.partitions == np_ and r.layout.startswith("1x")), key=lambda r: r.segments
            )
            ref = next((r for r in ssweep if r.segments == 10), None)
            if ssweep and ref is not None and ssweep[-1].segments > 10:
                big = ssweep[-1]
                cands.append(("segments", ref, big, big.partitions * big.segments, ref.partitions * ref.segments))
        for sweep, ref, big, nb, nr in cands:
            u0, u1 = ref.wall_s * 1000 / nr, big.wall_s * 1000 / nb
            ratio = u1 / u0 if u0 else float("nan")
            verdict = "SUPER-LINEAR" if ratio > 2 else ("super-linear?" if ratio > 1.3 else "linear or better")
            line = f"{OP_NAMES[op]:18}{sweep:>10}{ref.layout:>14}{big.layout:>14}"
            line += f"{u0:>10.3f}{'':>4}{u1:>10.3f}{ratio:>8.2f}"
            if env.s3:
                line += (
                    f"{ref.n_requests / nr:>10.2f}{'':>4}{big.n_requests / nb:>10.2f}"
                    f"{ref.bytes_in / 1000 / nr:>10.2f}{'':>4}{big.bytes_in / 1000 / nb:>10.2f}"
                )
                b0, b1 = ref.bytes_in / nr, big.bytes_in / nb
                if b0 and b1 / b0 > 2:
                    verdict += f"; bytes/unit x{b1 / b0:.1f}: SUPER-LINEAR"
            lines.append(line + "  " + verdict)
    return lines


# ---------------------------------------------------------------------------------------------- main


def profile_op(env: Env, op: str, layout: Layout, warm_root: str) -> None:
    import cProfile
    import pstats

    if op == "a":

        def fn():
            return plan_direct(env, env.root(layout))
    elif op == "b":
        from python_datasource import reader as rd

        opts = source_options(env, env.root(layout), streaming=True)
        stream = rd.KafkaLogStreamReader(opts, rd.selected_columns(None, False))
        start = stream.latestOffset()
        limit = rd.ReadAllAvailable() if rd.ReadAllAvailable is not None else None

        def fn():
            stream.partitions(start, stream.latestOffset(start, limit))
    elif op == "c":
        from storage.log_manager import LogManager

        def fn():
            lm = LogManager(env.root(layout), env.storage_options)
            return [tp for t in lm.topics() for tp in lm.partitions(t)]
    elif op == "d":
        from kafkalog_ds import cli

        def fn():
            with contextlib.redirect_stdout(io.StringIO()):
                cli.main(["describe", env.root(layout), *env.cli_fs])
    elif op == "e":
        from storage.log_maintenance import run_once

        def fn():
            run_once(env.root(layout), storage_options=env.storage_options, cleaner_settings=MAINT_SETTINGS)
    else:
        raise SystemExit(f"--profile: no profile for op {op!r} (a, b, c, d, e)")
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)
    print(f"\n=== cProfile of {OP_NAMES[op]} on {layout.name} ===")
    text = out.getvalue().replace(REPO + "/", "")
    print("\n".join(line for line in text.splitlines() if line.strip()))


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 2 and sys.argv[1] == "--_plan-child":
        plan_child(sys.argv[2])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-partitions", type=int, default=10_000)
    p.add_argument("--max-segments", type=int, default=1000)
    p.add_argument("--quick", action="store_true", help="stop at 1000 partitions and 100 segments")
    p.add_argument("--ops", default="a,b,c,d,e,f", help="operations to run (a,b,c,d,e,f; see the docstring)")
    p.add_argument("--s3", action="store_true", help="layouts on moto's S3 server started in this process")
    p.add_argument(
        "--spark", action="store_true", help="also plan (a), idle triggers (b) and maintain (e) through Spark, local[2]"
    )
    p.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    p.add_argument(
        "--op-budget",
        type=float,
        default=300.0,
        help="seconds: an op slower than this on a layout is skipped on the larger ones",
    )
    p.add_argument("--profile", default="", help="ops to cProfile once on --profile-layout (a,b,c,d,e)")
    p.add_argument("--profile-layout", default=None, help="layout name to profile (default: largest partitions)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    args = p.parse_args(argv)
    if args.quick:
        args.max_partitions = min(args.max_partitions, 1000)
        args.max_segments = min(args.max_segments, 100)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in "abcdef" or len(o) != 1]
    if unknown:
        p.error(f"--ops: unknown {unknown}; choose from a,b,c,d,e,f")

    import logging

    logging.getLogger("python_datasource").setLevel(logging.ERROR)
    work = tempfile.mkdtemp(prefix="scale-bench-", dir="/tmp")
    server = bucket = None
    if args.s3:
        from s3_lookup import start_server

        server, bucket = start_server()
    env = Env(work, server, bucket)
    playouts = [Layout(t, n, 1) for t, n in PARTITION_LAYOUTS if t * n <= args.max_partitions]
    slayouts = [
        Layout(1, n, s)
        for n in SEGMENT_PARTITIONS
        for s in SEGMENT_COUNTS
        if s <= args.max_segments and n <= args.max_partitions
    ]
    layouts = list(dict.fromkeys(playouts + slayouts))
    layouts.sort(key=lambda lay: (lay.total_segments, lay.partitions))
    env.layouts = layouts
    report = {
        "argv": sys.argv[1:],
        "backend": "s3 (moto, in process)" if args.s3 else "local disk",
        "cores": os.cpu_count(),
        "build": [],
        "results": [],
    }
    results: list[Result] = []
    try:
        progress(f"scale bench: {len(layouts)} layouts in {'s3://' + bucket if args.s3 else work}; ops {ops}")
        print(
            f"kafkalog scale benchmark: {'S3 (moto server in this process)' if args.s3 else 'local disk'} "
            f"({work if not args.s3 else 's3://' + bucket + '/scale-bench'}), {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        builds = []
        for lay in layouts:
            progress(f"build {lay.name} ({lay.partitions} partitions x {lay.segments} segments)")
            b = build_layout(env, lay)
            builds.append(b)
            report["build"].append(b)
        print("\nBuild (once per run; create_topic for every topic, then one writable open + append per partition)")
        head = f"{'layout':>14}{'parts':>7}{'seg/p':>6}{'create s':>10}{'append s':>10}{'ms/part':>9}{'slowest ms':>11}"
        if args.s3:
            head += f"{'reqs':>9}{'req/part':>9}"
        print(head)
        for b in builds:
            line = (
                f"{b['layout']:>14}{b['partitions']:>7}{b['segments']:>6}{b['create_s']:>10.2f}"
                f"{b['append_s']:>10.2f}{(b['create_s'] + b['append_s']) * 1000 / b['partitions']:>9.2f}"
                f"{b['slowest_partition_s'] * 1000:>11.1f}"
            )
            if args.s3:
                line += f"{b['requests']:>9}{b['requests'] / b['partitions']:>9.1f}"
            print(line)
        sys.stdout.flush()
        if args.spark:
            from pyspark.sql import SparkSession

            env.spark = (
                SparkSession.builder.master("local[2]")
                .appName("kafkalog-scale-bench")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .getOrCreate()
            )
            env.spark.sparkContext.setLogLevel("ERROR")
        warm = env.root(layouts[0])
        runners = []
        for o in ops:
            if o == "a":
                runners.append(("a", lambda lay: op_plan(env, lay)))
                if args.spark:
                    runners.append(("a-spark", lambda lay: op_plan_spark(env, lay)))
            elif o == "b":
                runners.append(("b", lambda lay: op_trigger(env, lay)))
                if args.spark:
                    runners.append(("b-spark", lambda lay: op_trigger_spark(env, lay)))
            elif o == "c":
                runners.append(("c", lambda lay: op_list(env, lay)))
            elif o == "d":
                runners.append(("d", lambda lay: op_describe(env, lay)))
            elif o == "e":
                runners.append(("e", lambda lay: op_maintain(env, lay)))
                if args.spark:
                    runners.append(("e-spark", lambda lay: op_maintain(env, lay, spark=True)))
            elif o == "f":
                runners.append(("f", lambda lay: op_memory(env, lay, warm)))
        if args.spark:  # Python workers and the planner started once, not inside the first timed run
            op_plan_spark(env, layouts[0])
        for op, run in runners:
            too_slow = None
            for lay in layouts:
                if too_slow is not None and lay.total_segments > too_slow[0]:
                    r = Result(
                        op,
                        lay.name,
                        lay.partitions,
                        lay.segments,
                        skipped=f"{too_slow[1]} took {too_slow[2]:.0f}s (> --op-budget)",
                    )
                else:
                    progress(f"{OP_NAMES[op]} on {lay.name}")
                    r = run(lay)
                    if r.wall_s * r.runs > args.op_budget:
                        too_slow = (lay.total_segments, lay.name, r.wall_s)
                results.append(r)
                report["results"].append({**asdict(r), "n_requests": r.n_requests})
                progress("  " + table([r], env, "part")[-1])
                if args.json:  # as it goes, so that a run stopped early leaves what it measured
                    with open(args.json, "w") as f:
                        json.dump(report, f, indent=1)
        by_op = {op: i for i, (op, _) in enumerate(runners)}
        results.sort(key=lambda r: by_op[r.op])
        pnames = {lay.name for lay in playouts}
        print(f"\nPartition sweep (one segment per partition, {RECORDS_PER_BATCH} records each)")
        print("\n".join(table([r for r in results if r.layout in pnames], env, "part")))
        print("\nSegment sweep (1 topic of 1 or 10 partitions; S segments per partition)")
        snames = [lay.name for lay in sorted(slayouts, key=lambda lay: (lay.partitions, lay.segments))]
        srows = sorted((r for r in results if r.layout in snames), key=lambda r: (by_op[r.op], snames.index(r.layout)))
        print("\n".join(table(srows, env, "seg")))
        if args.s3:
            print("\nS3 requests by target (count, KB received), largest layout of each op; per partition in brackets")
            for op in by_op:
                rows = [r for r in results if r.op == op and not r.skipped and r.extra.get("by_target")]
                if not rows:
                    continue
                r = max(rows, key=lambda r: (r.partitions, r.segments))
                parts = ", ".join(
                    f"{t}: {v['requests']} [{v['requests'] / r.partitions:.2f}] "
                    f"{v['bytes'] / 1000:.1f} KB [{v['bytes'] / 1000 / r.partitions:.2f}]"
                    for t, v in r.extra["by_target"].items()
                )
                print(f"  {OP_NAMES[op]} on {r.layout}: {parts}")
        print("\nGrowth (per-unit wall cost, largest layout vs reference; ratio > 1: super-linear)")
        print("\n".join(growth_lines(results, env)))
        print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
        sys.stdout.flush()
        for op in [o.strip() for o in args.profile.split(",") if o.strip()]:
            name = args.profile_layout or max(playouts, key=lambda lay: lay.partitions).name
            lay = next((x for x in layouts if x.name == name), None)
            if lay is None:
                raise SystemExit(f"--profile-layout {name}: not built (layouts: {[x.name for x in layouts]})")
            profile_op(env, op, lay, warm)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    finally:
        if env.spark is not None:
            env.spark.stop()
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            progress(f"kept {work}")


if __name__ == "__main__":
    main()
