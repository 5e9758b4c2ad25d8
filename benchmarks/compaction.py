"""Log compaction throughput and offset-map memory.

Run: python benchmarks/compaction.py [--records 3000000] [--keys 100000] [--codec none] [--root DIR]
Builds one partition of N records (keys drawn uniformly from K, values of --value-bytes hex chars
that compress about 2x, --tombstones of them null), rolls it so all of it is cleanable, then cleans
it in a child process (so its peak RSS is the cleaning's own) after warming up numba's cache there.
Prints MB/s of log cleaned (log bytes before / wall time), records/s, the time of the key-count
(HyperLogLog) pass that sizes the offset map, the map's bytes per distinct key (its table, and its
peak over the cleaning incl. the HLL registers), and the child's peak RSS rise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from storage.cleaner.cleaner import Cleaner
from storage.cleaner.cleaner_config import CleanerConfig  # noqa: E402
from storage.cleaner.log_cleaner_manager import LogCleanerManager  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.records.builder import build_records  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402

TP = TopicPartition("bench", 0)
CHUNK = 200_000


def build(root: str, n: int, keys: int, value_bytes: int, tombstones: float, codec: str, segment_bytes: int) -> float:
    lm = LogManager(root)
    lm.create_topic(TP.topic, 1, {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)})
    rng = np.random.default_rng(11)
    t0 = time.perf_counter()
    with lm.open_log(TP, writable=True) as log:
        for start in range(0, n, CHUNK):
            m = min(CHUNK, n - start)
            ids = pa.array(rng.integers(0, keys, m))
            key = pc.binary_join_element_wise("key-", pc.utf8_lpad(pc.cast(ids, pa.string()), 9, "0"), "")
            half = rng.integers(0, 256, (m, value_bytes // 4), dtype=np.uint8)
            hexed = np.frombuffer(half.tobytes().hex().encode(), np.uint8).reshape(m, -1)
            data = np.concatenate([hexed, np.full((m, value_bytes - hexed.shape[1]), ord("x"), np.uint8)], axis=1)
            offsets = (np.arange(m + 1) * value_bytes).astype(np.int32)
            valid = rng.random(m) >= tombstones
            value = pa.Array.from_buffers(
                pa.binary(),
                m,
                [
                    pa.py_buffer(np.packbits(valid, bitorder="little")),
                    pa.py_buffer(offsets),
                    pa.py_buffer(data.tobytes()),
                ],
            )
            ts = pa.array(1_700_000_000_000 + start + np.arange(m), pa.int64())
            table = pa.table({"key": key.cast(pa.binary()), "value": value, "timestamp": ts})
            log.append(build_records(table, compression=codec))
        log.roll()
    return time.perf_counter() - t0


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> int:
    """Current RSS (KiB), after resetting the peak to it where Linux allows (clear_refs 5)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _peak_rss() -> int:
    return _status_kib("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def clean_child(root: str, dedupe: int) -> dict:
    """Runs in the child: warm numba up on a tiny log, then clean the benchmark log once."""
    warm = LogManager(f"memory://warm-{os.getpid()}")
    warm.create_topic("w", 1, {"cleanup.policy": "compact"})
    with warm.open_log(TopicPartition("w", 0), writable=True) as log:
        log.append(build_records(pa.table({"key": [b"a", b"a"], "value": [b"1", None]}), compression="zstd"))
        log.roll()
    LogCleanerManager(warm).clean_partition(TopicPartition("w", 0), force=True)
    base_rss = _reset_peak_rss()
    mgr = LogCleanerManager(LogManager(root), cleaner=Cleaner(CleanerConfig(dedupe_buffer_size=dedupe)))
    hll = {"s": 0.0, "estimate": -1}
    estimate_keys = Cleaner._estimate_keys

    def timed_estimate(self, *a):
        t = time.perf_counter()
        hll["estimate"] = estimate_keys(self, *a)
        hll["s"] += time.perf_counter() - t
        return hll["estimate"]

    Cleaner._estimate_keys = timed_estimate
    t0 = time.perf_counter()
    res = mgr.clean_partition(TP, force=True)
    wall = time.perf_counter() - t0
    if not res.ok:
        raise SystemExit(f"cleaning failed: {res.error}")
    out = {k: v for k, v in vars(res).items() if k not in ("exception", "groups")}
    out.update(
        wall_s=wall,
        rss_rise_kib=_peak_rss() - base_rss,
        outputs=len(res.groups),
        hll_s=hll["s"],
        hll_estimate=hll["estimate"],
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=3_000_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--tombstones", type=float, default=0.01, help="fraction of records with a null value")
    ap.add_argument("--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--segment-bytes", type=int, default=64 * 1024 * 1024)
    ap.add_argument("--dedupe-buffer-size", type=int, default=128 * 1024 * 1024)
    ap.add_argument("--root", help="log dir to build in (default: a temporary directory)")
    ap.add_argument("--clean-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.clean_only:
        print(json.dumps(clean_child(args.root, args.dedupe_buffer_size)))
        return
    with tempfile.TemporaryDirectory(dir=args.root) as tmp:
        root = os.path.join(tmp, "logs")
        secs = build(root, args.records, args.keys, args.value_bytes, args.tombstones, args.codec, args.segment_bytes)
        print(f"built {args.records:,} records, {args.keys:,} keys, codec {args.codec}: {secs:.1f} s")
        child = subprocess.run(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--clean-only",
                "--root",
                root,
                "--dedupe-buffer-size",
                str(args.dedupe_buffer_size),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode:
            raise SystemExit(child.stderr)
        r = json.loads(child.stdout.strip().splitlines()[-1])
    mb = r["bytes_before"] / 1e6
    print(
        f"log before      {mb:,.1f} MB in {r['segments_before']} segments; after "
        f"{r['bytes_after'] / 1e6:,.1f} MB in {r['segments_after']} ({r['outputs']} outputs)"
    )
    print(
        f"cleaned         {r['wall_s']:.2f} s: {mb / r['wall_s']:,.1f} MB/s of log, "
        f"{r['records_read'] / r['wall_s'] / 1e6:.2f} M records/s (all passes read "
        f"{r['bytes_read'] / 1e6:,.0f} MB, wrote {r['bytes_written'] / 1e6:,.1f} MB)"
    )
    print(
        f"records         {r['records_read']:,} read, {r['records_dropped']:,} dropped, "
        f"{r['tombstones_dropped']:,} tombstones dropped (inside their horizon: kept)"
    )
    keys = max(r["keys"], 1)
    print(
        f"key count pass  {r['hll_s']:.2f} s = {mb / max(r['hll_s'], 1e-9):,.0f} MB/s of log, "
        f"{100 * r['hll_s'] / r['wall_s']:.0f}% of the cleaning; HLL estimate {r['hll_estimate']:,} "
        f"({100 * (r['hll_estimate'] / keys - 1):+.2f}% of the keys mapped)"
    )
    print(
        f"offset map      {r['keys']:,} distinct keys; table {r['map_bytes']:,} B = "
        f"{r['map_bytes'] / keys:.1f} B/key; peak {r['map_peak_bytes']:,} B = {r['map_peak_bytes'] / keys:.1f} B/key "
        f"(Kafka: 24 B/slot at <= 0.9 load = 26.7 B/key)"
    )
    print(f"peak RSS rise   {r['rss_rise_kib'] / 1024:,.1f} MiB in the cleaning process")


if __name__ == "__main__":
    main()
