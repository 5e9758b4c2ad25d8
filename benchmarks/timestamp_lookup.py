"""Bytes and reads needed to answer one startingTimestamp lookup as a partition grows from 10 to 1000
segments, counted at the filesystem seam (every byte the engine reads passes through it).

Run:  python benchmarks/timestamp_lookup.py [--quick]     (--quick: 10 and 100 segments, a smoke run)
The lookup is what spark.read.format("kafkalog").option("startingTimestamp", T) plans with:
Log.offset_for_timestamp(T) on a freshly opened partition (listing included), for a T in the
last segment (the worst case: every earlier segment is skipped) and a T in the middle.
"""

import os
import sys
import tempfile
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from storage.fs.local import LocalFileSystem  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.records.builder import build_records  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402

RECORDS_PER_SEGMENT = 2200  # about one 256 KiB segment of 16 KiB batches
SEGMENT_BYTES = 256 * 1024
TP = TopicPartition("t", 0)


class CountingFileSystem(LocalFileSystem):
    """Local disk that counts the bytes and calls of every read."""

    def __init__(self):
        super().__init__()
        self.bytes = self.reads = 0

    def read(self, path, start=0, end=None):
        data = super().read(path, start, end)
        self.bytes += len(data)
        self.reads += 1
        return data


def build(root: str, segments: int, t0: int) -> int:
    lm = LogManager(root)
    lm.create_topic("t", 1, {"segment.bytes": str(SEGMENT_BYTES)})
    n = segments * RECORDS_PER_SEGMENT
    step = 1000
    with lm.open_log(TP, writable=True) as log:
        for lo in range(0, n, 50_000):
            hi = min(n, lo + 50_000)
            table = pa.table(
                {
                    "key": pa.array([b"k%05d" % (i % 997) for i in range(lo, hi)]),
                    "value": pa.array([b"x" * 100] * (hi - lo)),
                    "timestamp": pa.array(range(t0 + lo * step, t0 + hi * step, step), pa.int64()),
                }
            )
            log.append(build_records(table, max_batch_bytes=16 * 1024))
        return len(log.segments)


def lookup(root: str, ts: int):
    fs = CountingFileSystem()
    lm = LogManager(root, fs=fs)
    start = time.perf_counter()
    with lm.open_log(TP) as log:
        offset = log.offset_for_timestamp(ts)
    return offset, fs.bytes, fs.reads, time.perf_counter() - start


def main(argv=None):
    quick = "--quick" in (sys.argv[1:] if argv is None else argv)
    t0 = 1_700_000_000_000
    print(f"{'segments':>8} {'target':>7} {'offset':>10} {'bytes read':>11} {'reads':>6} {'ms':>7}")
    base = {}
    for segments in (10, 100) if quick else (10, 100, 1000):
        with tempfile.TemporaryDirectory() as root:
            actual = build(root, segments, t0)
            n = segments * RECORDS_PER_SEGMENT
            for name, record in (("last", n - RECORDS_PER_SEGMENT // 2), ("middle", n // 2)):
                offset, nbytes, reads, secs = lookup(root, t0 + record * 1000)
                assert offset == record, (offset, record)
                base.setdefault(name, nbytes)
                print(
                    f"{actual:>8} {name:>7} {offset:>10} {nbytes:>11,} {reads:>6} {secs * 1000:>7.1f}"
                    f"   ({nbytes / base[name]:.2f}x the 10-segment bytes)"
                )


if __name__ == "__main__":
    main()
