"""RecordBatch v2 codec throughput: ours (Arrow in/out) vs aiokafka's C extension vs kafka-python.

Run: python benchmarks/codec.py [--records N] [--kafka-python-records N]
200k records, 16-byte key, 100-byte value, one header ("h", 8 bytes); codecs none and zstd.
Each figure is the best of 3 runs in this process, numba warmed up first. "ours 1 thr" compresses
batches one after another; "ours" spreads batches over a few threads (pyarrow releases the GIL).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from storage.records import compression  # noqa: E402
from storage.records.builder import build_records  # noqa: E402
from storage.records.decoder import decode_batches  # noqa: E402
from storage.records.record_batch import CompressionType, scan_batches  # noqa: E402

BATCH_BYTES = 1048576
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def make_data(n: int, seed: int = 7):
    """Keys key-000000000001, values 100 hex chars (half random: compresses about 2x), one header."""
    rng = np.random.default_rng(seed)
    keys = [b"key-%012d" % i for i in range(n)]
    raw = rng.integers(0, 256, size=(n, 50), dtype=np.uint8)
    values = [bytes(row).hex().encode() for row in raw]
    hvals = [int(i).to_bytes(8, "big") for i in range(n)]
    ts0 = 1_700_000_000_000
    timestamps = [ts0 + i for i in range(n)]
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array(timestamps, pa.int64()),
            "headers": pa.array([[{"key": "h", "value": v}] for v in hvals], HEADER_TYPE),
        }
    )
    py = [(timestamps[i], keys[i], values[i], [("h", hvals[i])]) for i in range(n)]
    return table, py


def best_of(fn, runs: int = 3):
    best = float("inf")
    result = None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def build_with(builder_cls, codec: int, records):
    """Fill batches of about BATCH_BYTES with a client's DefaultRecordBatchBuilder."""
    out = []
    builder = builder_cls(2, codec, 0, -1, -1, -1, BATCH_BYTES)
    delta = 0
    for ts, key, value, headers in records:
        if builder.append(delta, ts, key, value, headers) is None:
            out.append(bytes(builder.build()))
            builder = builder_cls(2, codec, 0, -1, -1, -1, BATCH_BYTES)
            delta = 0
            builder.append(delta, ts, key, value, headers)
        delta += 1
    out.append(bytes(builder.build()))
    return b"".join(out)


def read_with(memory_records_cls, buf: bytes) -> int:
    """Iterate every record, touching key and value, as a consumer would."""
    records = memory_records_cls(buf)
    n = 0
    total = 0
    while records.has_next():
        batch = records.next_batch()
        for rec in batch:
            total += len(rec.key) + len(rec.value)
            n += 1
    return n


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--kafka-python-records", type=int, default=20_000)
    parser.add_argument(
        "--threads", type=int, default=min(4, os.cpu_count() or 1), help="compression threads for the 'ours' column"
    )
    args = parser.parse_args(argv)
    compression.set_threads(args.threads)

    import aiokafka.record.default_records as aio_mod
    from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBuilder
    from aiokafka.record.memory_records import MemoryRecords as AioRecords
    from kafka.record.default_records import DefaultRecordBatchBuilder as KpBuilder
    from kafka.record.memory_records import MemoryRecords as KpRecords

    print(
        f"aiokafka builder: {AioBuilder.__module__}.{AioBuilder.__name__}"
        f" (C extension: {'_crecords' in AioBuilder.__module__ or not aio_mod.NO_EXTENSIONS})"
    )

    n = args.records
    table, py = make_data(n)
    kp_n = min(n, args.kafka_python_records)
    kp_py = py[:kp_n]

    warm, _ = make_data(100)  # compile / load the numba kernels outside the timings
    for codec in (CompressionType.NONE, CompressionType.ZSTD):
        decode_batches(build_records(warm, compression=codec))

    print(
        f"{n} records, 16-byte key, 100-byte value, 1 header; best of 3; records/s"
        f" (kafka-python: {kp_n} records); {os.cpu_count()} cores"
    )
    for codec in (CompressionType.NONE, CompressionType.ZSTD):
        # one untimed full-size run each: the first touch of fresh memory is slow on some VMs
        decode_batches(build_records(table, compression=codec, max_batch_bytes=BATCH_BYTES))
        read_with(AioRecords, build_with(AioBuilder, int(codec), py))
        t_enc, ours = best_of(lambda c=codec: build_records(table, compression=c, max_batch_bytes=BATCH_BYTES))
        t_dec, decoded = best_of(lambda o=ours: decode_batches(o))
        assert decoded.num_rows == n
        compression.set_threads(1)  # batches (de)compressed one after another, as aiokafka does
        t_enc1, _ = best_of(lambda c=codec: build_records(table, compression=c, max_batch_bytes=BATCH_BYTES))
        t_dec1, _ = best_of(lambda o=ours: decode_batches(o))
        compression.set_threads(args.threads)
        t_aenc, theirs = best_of(lambda c=codec: build_with(AioBuilder, int(c), py))
        t_adec, count = best_of(lambda t=theirs: read_with(AioRecords, t))
        assert count == n
        # each side decodes the other's bytes too (sanity, untimed)
        assert decode_batches(theirs).num_rows == n and read_with(AioRecords, ours) == n
        kp_bytes = build_with(KpBuilder, int(codec), kp_py)
        t_kenc, _ = best_of(lambda c=codec: build_with(KpBuilder, int(c), kp_py), runs=1)
        t_kdec, kcount = best_of(lambda b=kp_bytes: read_with(KpRecords, b), runs=1)
        assert kcount == kp_n

        def rate(t, k=n):
            return f"{k / t:>12,.0f}"

        print(
            f"\ncodec {codec.kafka_name}: ours {len(ours):,} bytes in {len(scan_batches(ours))} batches,"
            f" aiokafka {len(theirs):,} bytes in {len(scan_batches(theirs))} batches"
        )
        print(f"{'':8}{'ours':>12}{'ours 1 thr':>12}{'aiokafka':>12}{'kafka-py':>12}   ours/aiokafka (1 thread)")
        print(
            f"{'encode':8}{rate(t_enc)}{rate(t_enc1)}{rate(t_aenc)}{rate(t_kenc, kp_n)}"
            f"   {t_aenc / t_enc:5.2f}x ({t_aenc / t_enc1:.2f}x)"
        )
        print(
            f"{'decode':8}{rate(t_dec)}{rate(t_dec1)}{rate(t_adec)}{rate(t_kdec, kp_n)}"
            f"   {t_adec / t_dec:5.2f}x ({t_adec / t_dec1:.2f}x)"
        )


if __name__ == "__main__":
    main()
