"""The cost of read_committed: the same transactional log read at read_committed and at read_uncommitted,
interleaved, in one process.

Run: python benchmarks/read_committed.py [--records N] [--rounds R] [--range-size S] [--dir DIR]
The log: 4 producers writing interleaved transactions of 5 batches of 20 records (about 100-byte values), one in
four aborted, plus non-transactional batches between them, over 1 MiB segments (a writer rolls them, writing a
producer snapshot and the aborts' `.txnindex` entries at each roll). Two patterns, each timed per level in
alternating order so that a burst of load elsewhere hits both:
- full: a freshly opened Log reads every record (Log.read_records from the log start);
- ranges: a Spark-like scan, many small ranges of S offsets, each read by a freshly opened LogManager and Log
  (what each Spark task does), all ranges per round.
Printed: the median of each, records per second, the read_committed / read_uncommitted ratio, and the CPU every
other process on the machine took during the rounds (from /proc/stat less this process): rerun if it is not
near 0.
"""

from __future__ import annotations

import argparse
import logging
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
from storage.records.builder import build_batch  # noqa: E402
from storage.records.record_batch import CompressionType  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402
from storage.transactions.control_records import ControlRecordType, EndTransactionMarker  # noqa: E402

TP = TopicPartition("t", 0)
PRODUCERS = 4
BATCHES_PER_TXN = 5
RECORDS_PER_BATCH = 20


def batch(pid: int, n: int, seq: int, *, transactional: bool = True) -> bytes:
    t = pa.table(
        {
            "key": pa.array([b"key-%08d" % (seq + i) for i in range(n)], pa.binary()),
            "value": pa.array([b"v" * 100] * n, pa.binary()),
            "timestamp": pa.array([1_700_000_000_000 + seq + i for i in range(n)], pa.int64()),
        }
    )
    return build_batch(
        t,
        compression=CompressionType.NONE,
        base_offset=0,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=transactional,
        now_ms=1000,
    )


def build(root: str, records: int) -> int:
    lm = LogManager(root)
    lm.create_topic("t", 1, {"segment.bytes": str(1 << 20)})
    written = txn = 0
    with lm.open_log(TP, writable=True) as log:
        while written < records:
            for step in range(BATCHES_PER_TXN):
                for pid in range(PRODUCERS):
                    log.append(batch(pid, RECORDS_PER_BATCH, written))
                    written += RECORDS_PER_BATCH
                if step == 2:
                    log.append(batch(-1, RECORDS_PER_BATCH, written, transactional=False))
                    written += RECORDS_PER_BATCH
            for pid in range(PRODUCERS):
                kind = ControlRecordType.ABORT if (txn + pid) % 4 == 0 else ControlRecordType.COMMIT
                log.append(
                    EndTransactionMarker(kind, 0).to_batch(
                        base_offset=0, timestamp=5000, producer_id=pid, producer_epoch=0
                    )
                )
            txn += 1
        return log.log_end_offset


def read_full(root: str, level: str) -> int:
    with LogManager(root).open_log(TP) as log:
        return sum(b.num_rows for b in log.read_records(0, isolation_level=level))


def read_ranges(root: str, level: str, end: int, size: int) -> int:
    n = 0
    for lo in range(0, end, size):
        with LogManager(root).open_log(TP) as log:
            n += sum(b.num_rows for b in log.read_records(lo, lo + size, isolation_level=level))
    return n


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the active segment has no `.txnindex` yet: a warning per open
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--range-size", type=int, default=5000)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(dir=args.dir, prefix="read-committed-")
    root = os.path.join(work, "logs")
    levels = ("read_uncommitted", "read_committed")
    times: dict[tuple[str, str], list[float]] = {(p, lv): [] for p in ("full", "ranges") for lv in levels}
    counts: dict[tuple[str, str], int] = {}
    try:
        end = build(root, args.records)
        busy0, own0 = machine_busy_seconds(), own_cpu_seconds()
        for r in range(args.rounds + 1):  # the first warms up (imports, page cache) and is not counted
            order = levels if r % 2 else levels[::-1]
            for pattern in ("full", "ranges"):
                for level in order:
                    a = time.perf_counter()
                    if pattern == "full":
                        n = read_full(root, level)
                    else:
                        n = read_ranges(root, level, end, args.range_size)
                    if r:
                        times[(pattern, level)].append(time.perf_counter() - a)
                    counts[(pattern, level)] = n
        others = (machine_busy_seconds() - busy0) - (own_cpu_seconds() - own0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"log: {end} offsets, {PRODUCERS} producers, 1 in 4 transactions aborted; {args.rounds} rounds (median)")
    for pattern in ("full", "ranges"):
        what = "one fresh Log, every record" if pattern == "full" else f"ranges of {args.range_size}, each fresh"
        med = {lv: statistics.median(times[(pattern, lv)]) for lv in levels}
        for lv in levels:
            print(
                f"  {pattern:6} {lv:17} {1e3 * med[lv]:8.1f} ms  {counts[(pattern, lv)] / med[lv] / 1e6:6.2f} M rec/s"
                f"  ({counts[(pattern, lv)]} records)"
            )
        print(f"  {pattern:6} ratio read_committed / read_uncommitted: {med[levels[1]] / med[levels[0]]:.2f}x ({what})")
    print(f"  other processes took {max(0.0, others):.1f} CPU s meanwhile")


if __name__ == "__main__":
    main()
