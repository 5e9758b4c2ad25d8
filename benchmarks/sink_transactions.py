"""The cost of sink transactions: commit_staged with and without them, one micro-batch at a time, interleaved.

Run: python benchmarks/sink_transactions.py [--rows N] [--partitions P] [--rounds R] [--dir DIR]
Each round stages one micro-batch of N rows (two tasks) into P partitions, then commits it twice: into a topic
with transactional=False (today's protocol: pending mark, data, done mark) and into a topic with
transactional=True (pending mark, data, the decision file, then per partition a second open and a COMMIT
marker), in alternating order so that a burst of load elsewhere hits both. Only commit_staged is timed.
Printed: the median commit of each, their ratio, the extra time per partition, and the CPU every other
process on the machine took during the rounds (from /proc/stat less this process): rerun if it is not near 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sink: the CPU meters

import pyarrow as pa  # noqa: E402
from sink import machine_busy_seconds, own_cpu_seconds  # noqa: E402

from storage.log_manager import LogManager  # noqa: E402
from storage.records.record_batch import CompressionType  # noqa: E402
from storage.staging.record_stager import RecordStager  # noqa: E402
from storage.staging.staged_commit import commit_staged  # noqa: E402


def stage(root: str, topic: str, partitions: int, table: pa.Table):
    out = []
    half = table.num_rows // 2
    for task in range(2):
        st = RecordStager(
            LogManager(root),
            7,
            topic=topic,
            compression=CompressionType.NONE,
            new_topic_partitions=partitions,
            task_index=task,
        )
        st.add(table.slice(task * half, half))
        out.append(st.finish())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(dir=args.dir, prefix="sink-txn-")
    root = os.path.join(work, "logs")
    n = args.rows
    table = pa.table(
        {
            "key": pa.array([b"key-%012d" % i for i in range(n)], pa.binary()),
            "value": pa.array([os.urandom(50).hex().encode() for _ in range(n)], pa.binary()),
        }
    )
    lm = LogManager(root)
    for topic in ("plain", "txn"):
        lm.get_or_create_topic(topic, args.partitions)
    times: dict[str, list[float]] = {"plain": [], "txn": []}
    busy0, own0 = machine_busy_seconds(), own_cpu_seconds()
    try:
        for batch in range(args.rounds + 2):  # the first two warm up (imports, caches) and are not counted
            order = ("plain", "txn") if batch % 2 else ("txn", "plain")
            for topic in order:
                staged = stage(root, topic, args.partitions, table)
                a = time.perf_counter()
                commit_staged(LogManager(root), 7, batch, staged, transactional=topic == "txn")
                if batch >= 2:
                    times[topic].append(time.perf_counter() - a)
        others = (machine_busy_seconds() - busy0) - (own_cpu_seconds() - own0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    plain, txn = statistics.median(times["plain"]), statistics.median(times["txn"])
    print(
        f"{args.rounds} micro-batches of {n} rows into {args.partitions} partitions, commit_staged only (median):\n"
        f"  non-transactional {1e3 * plain:7.2f} ms\n"
        f"  transactional     {1e3 * txn:7.2f} ms\n"
        f"  ratio {txn / plain:.2f}x, {1e3 * (txn - plain) / args.partitions:.2f} ms more per partition "
        f"(a decision file, a second open and a COMMIT marker)\n"
        f"  other processes took {max(0.0, others):.1f} CPU s meanwhile"
    )


if __name__ == "__main__":
    main()
