"""The sink's path outside Spark, stage by stage, in ns per record, each stage beside its floor (issue 31).

Run: python benchmarks/sink_path.py [--rows N] [--partitions P] [--codec none|zstd] [--rounds R] [--dir DIR]
The input is vs_kafka.py case 1's, built in Arrow here: N rows (16-byte string key "key-%012d", 100-char
string value, 50 random hex and 50 zeros, a microsecond timestamp) in Spark's 10,000-row Arrow batches, split
between 2 tasks as Spark's 2 input partitions split them, into a topic of P partitions.

Stages, each timed alone on the same data, chunk by chunk as RecordStager streams it (best of R rounds, after one
warm-up round):
  select      what the writer and RecordStager.add do before routing: select the sink's columns, gather the
              10k-row batches into COALESCE_ROWS-row tables (concat + combine_chunks: one copy)
  route       partition_for_keys (Kafka's murmur2) and the stable sort into partition order
  encode      encode_records per partition, its rows read in place (rows=): framing, varints, CRC-32C, compression
  stage       the staging Log's appends of the encoded bytes (index entries, batch positions, O_DIRECT writes),
              and its release (the fsync of an adopted log)
  task        the whole executor side as the writer runs it: RecordStager.add over the batches, then finish()
  commit      commit_staged of the tasks' staged files on the driver, transactional=false and the default
              transactional=true, in alternating order, each into a fresh ROOT
  stamp       of the transactional commit, the part that makes staged batches transactional
              (_stamp_staged_segment / stamp_commit)
Floors (the same bytes, the same run): crc32c.crc32c over the encoded bytes; zstd (pyarrow's codec) over the
records' bytes; one os.write of the encoded bytes into a fresh file, and that file's fsync; a read of them back.
The last line gives the CPU every other process took during the run (rerun if it is not near 0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sink: the CPU meters

import crc32c  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from sink import machine_busy_seconds, own_cpu_seconds  # noqa: E402

from storage.log import Log  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.records.builder import encode_records  # noqa: E402
from storage.records.record_batch import CompressionType  # noqa: E402
from storage.staging import staged_commit  # noqa: E402
from storage.staging.partitioner import partition_for_keys  # noqa: E402
from storage.staging.record_stager import COALESCE_ROWS, RecordStager, staging_config, staging_log  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402

SPARK_BATCH_ROWS = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch
WRITER_ID = 7


def make_input(rows: int, tasks: int = 2) -> list[list[pa.RecordBatch]]:
    """vs_kafka case 1's rows as Spark hands them to the writer: per task, a list of 10k-row Arrow batches."""
    i = np.arange(rows)
    keys = pa.array(np.char.add(b"key-", np.char.zfill(i.astype("S12"), 12)).astype(object)).cast(pa.string())
    rnd = np.random.default_rng(1).integers(0, 16, size=(rows, 50), dtype=np.uint8)
    hexd = np.frombuffer(b"0123456789ABCDEF", np.uint8)[rnd]
    vals = np.concatenate([hexd, np.full((rows, 50), ord("0"), np.uint8)], axis=1)
    value = pa.StringArray.from_buffers(
        rows, pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * 100), pa.py_buffer(vals)
    )
    ts = pa.array(1_700_000_000_000_000 + i, pa.timestamp("us", tz="UTC"))
    table = pa.table({"key": keys, "value": value, "timestamp": ts})
    per = rows // tasks
    return [
        table.slice(t * per, per if t < tasks - 1 else rows - t * per).to_batches(SPARK_BATCH_ROWS)
        for t in range(tasks)
    ]


class Bench:
    def __init__(self, args, work: str):
        self.acc: dict[str, float] = {}
        self.args, self.work = args, work
        self.codec = CompressionType.for_name(args.codec)
        self.tasks = make_input(args.rows)
        self.times: dict[str, list[float]] = {}
        self.n = 0  # a counter for fresh roots and files

    def fresh(self, what: str) -> str:
        self.n += 1
        return os.path.join(self.work, f"{what}-{self.n}")

    def timed(self, name: str, fn, *args, **kwargs):
        a = time.perf_counter()
        out = fn(*args, **kwargs)
        self.times.setdefault(name, []).append(time.perf_counter() - a)
        return out

    # ---- the executor's stages, one at a time, chunk by chunk as RecordStager streams them ----
    def clock(self, name: str, fn, *args, **kwargs):
        a = time.perf_counter()
        out = fn(*args, **kwargs)
        self.acc[name] = self.acc.get(name, 0.0) + time.perf_counter() - a
        return out

    @staticmethod
    def select(pending: list[pa.RecordBatch]) -> pa.Table:
        """select: the writer's column selection and RecordStager's coalescing (concat + combine_chunks)."""
        return pa.Table.from_batches([b.select(["key", "value", "timestamp"]) for b in pending]).combine_chunks()

    def route(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """route: murmur2 partitions and the stable sort into partition order, as RecordStager._add_topic does."""
        parts = partition_for_keys(table.column("key"), self.args.partitions).astype(np.int64)
        order = np.argsort(parts.astype(np.int16), kind="stable")
        return parts[order], order

    def encode(self, table: pa.Table, parts: np.ndarray, order: np.ndarray) -> list:
        """encode: each partition's rows, read where they are (encode_records(rows=...)), as the stager does."""
        out = []
        starts = np.concatenate(([0], np.flatnonzero(parts[1:] != parts[:-1]) + 1, [len(parts)]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            data, scan = encode_records(
                table,
                rows=order[a:b],
                compression=self.codec,
                compression_level=3,
                producer_id=WRITER_ID,
                producer_epoch=0,
                max_batch_bytes=1048588 - 61,
            )
            out.append((int(parts[a]), data, scan))
        return out

    def staging_log(self, lm: LogManager, config, p: int) -> Log:
        d = os.path.join(lm.root, ".staging", f"t-{p}")
        os.makedirs(d)
        return staging_log(lm.fs, d, TopicPartition("t", p), config)

    def stages(self) -> None:
        """Every stage and floor over the whole input, chunk by chunk; each clock sums its stage's time."""
        self.acc: dict[str, float] = {}
        lm = LogManager(self.fresh("stage"))
        config = staging_config(lm.get_or_create_topic("t", self.args.partitions).config)
        logs: dict[int, Log] = {}
        floor = self.fresh("floor")
        fd = os.open(floor, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        zstd = pa.Codec("zstd", compression_level=3)
        for batches in self.tasks:
            for i in range(0, len(batches), -(-COALESCE_ROWS // SPARK_BATCH_ROWS)):
                table = self.clock("select", self.select, batches[i : i + -(-COALESCE_ROWS // SPARK_BATCH_ROWS)])
                parts, order = self.clock("route", self.route, table)
                encoded = self.clock("encode", self.encode, table, parts, order)
                for p, data, scan in encoded:
                    self.clock("crc32c floor", crc32c.crc32c, data)
                    self.clock("write floor", os.write, fd, data)
                    if p not in logs:
                        logs[p] = self.clock("stage", self.staging_log, lm, config, p)
                    self.clock("stage", logs[p].append, data, built=scan)
                if self.codec is CompressionType.ZSTD:
                    for col in ("key", "value"):
                        self.clock("zstd floor", zstd.compress, table.column(col).chunk(0).buffers()[2])
        for log in logs.values():
            self.clock("stage", log.release, fsync=True)
        self.clock("fsync floor", os.fsync, fd)
        os.close(fd)
        with open(floor, "rb") as f:
            self.clock("read floor", lambda: [None for _ in iter(lambda: f.read(64 << 20), b"")])
        for name, t in self.acc.items():
            self.times.setdefault(name, []).append(t)

    # ---- the whole executor side and the driver's commit ----
    def task_side(self, root: str, topic: str) -> list:
        staged = []
        for index, batches in enumerate(self.tasks):
            st = RecordStager(
                LogManager(root),
                WRITER_ID,
                topic=topic,
                compression=self.codec,
                compression_level=3,
                new_topic_partitions=self.args.partitions,
                task_index=index,
            )
            for b in batches:
                st.add(b.select(["key", "value", "timestamp"]))
            staged.append(st.finish())
        return staged

    def round(self, i: int) -> None:
        self.stages()
        # the whole path, both commit kinds, in alternating order (each into a fresh ROOT)
        for tx in (False, True) if i % 2 else (True, False):
            root = self.fresh("root")
            staged = self.timed("task", self.task_side, root, "t")
            name = "commit (transactional)" if tx else "commit (transactional=false)"
            self.stamp_clock = 0.0
            self.timed(name, staged_commit.commit_staged, LogManager(root), WRITER_ID, 0, staged, transactional=tx)
            if tx:
                self.times.setdefault("stamp", []).append(self.stamp_clock)
            shutil.rmtree(root)
        for d in os.listdir(self.work):
            shutil.rmtree(os.path.join(self.work, d), ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--codec", default="none", choices=["none", "zstd"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="20,000 rows, 1 round (a smoke run)")
    ap.add_argument("--dir", default=None, help="where the logs go (default: a temp dir)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.rounds = 20_000, 1
    work = tempfile.mkdtemp(dir=args.dir, prefix="sink-path-")
    bench = Bench(args, work)
    # stamp's share of the transactional commit: the time inside the stamping helpers (outermost call only)
    stampers = ("_stamp_staged_segment", "_read_stamped", "stamp_commit")
    originals = {name: getattr(staged_commit, name) for name in stampers}
    depth = [0]

    def clocked(fn):
        def run(*a, **k):
            t = time.perf_counter()
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                if not depth[0]:
                    bench.stamp_clock += time.perf_counter() - t

        return run

    for name, fn in originals.items():
        setattr(staged_commit, name, clocked(fn))
    try:
        bench.round(0)  # warm-up: numba's cache, first opens
        bench.times.clear()
        busy0, own0 = machine_busy_seconds(), own_cpu_seconds()
        for i in range(args.rounds):
            bench.round(i + 1)
        others = (machine_busy_seconds() - busy0) - (own_cpu_seconds() - own0)
    finally:
        for name, fn in originals.items():
            setattr(staged_commit, name, fn)
        shutil.rmtree(work, ignore_errors=True)
    n = args.rows
    best = {k: min(v) for k, v in bench.times.items()}
    print(
        f"{n:,} rows, {args.partitions} partitions, codec {args.codec}, best of {args.rounds} round(s), ns per record:"
    )
    print(f"  {'stage':32} {'ns/rec':>8} {'ms':>9}")
    for name in (
        "select",
        "route",
        "encode",
        "crc32c floor",
        "zstd floor",
        "stage",
        "write floor",
        "fsync floor",
        "read floor",
        "task",
        "commit (transactional=false)",
        "commit (transactional)",
        "stamp",
    ):
        if name in best:
            print(f"  {name:32} {1e9 * best[name] / n:8.1f} {1e3 * best[name]:9.1f}")
    parts = best["select"] + best["route"] + best["encode"] + best["stage"]
    print(f"  {'select+route+encode+stage':32} {1e9 * parts / n:8.1f} {1e3 * parts:9.1f}   (the task's parts, summed)")
    extra = best["commit (transactional)"] - best["commit (transactional=false)"]
    print(f"  transactional commit over transactional=false: {1e9 * extra / n:+.1f} ns/rec ({1e3 * extra:+.1f} ms)")
    print(f"  other processes took {max(0.0, others):.1f} CPU s meanwhile")


if __name__ == "__main__":
    main()
