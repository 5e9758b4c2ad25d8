"""Soak: a streaming query into kafkalog, the maintenance loop and readers, together for minutes.

Off by default: `pytest --soak 300 tests/spark/test_soak.py` (or KAFKALOG_SOAK_SECONDS=300). Every wait is
a seeded random pause between steps, never a timeout raced against a TTL; the duration only says how
long the three keep going. Checked: the query never fails, every record of the delete-policy topic is
there exactly once, the compacted topic keeps the latest value of every key, and every read along the
way saw offsets strictly increasing and no record twice.
"""

from __future__ import annotations

import io
import random
import threading
import time

import pytest

from kafkalog_ds.consume import consume
from kafkalog_ds.maintenance import run_once
from storage.errors import CorruptRecordError
from storage.log_manager import LogManager

KEYS = 37


def read_topic(root: str, topic: str) -> list[tuple[int, int, bytes, int]]:
    """(partition, offset, key, value) of every record, checking offsets increase within each partition."""
    lm = LogManager(root)
    out = []
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            last = -1
            for batch in log.read_records(log.log_start_offset):
                offs = batch.column("offset").to_pylist()
                assert offs == sorted(set(offs)) and offs[0] > last, f"{tp}: offsets out of order"
                last = offs[-1]
                out += [
                    (tp.partition, o, k, int(v))
                    for o, k, v in zip(
                        offs, batch.column("key").to_pylist(), batch.column("value").to_pylist(), strict=False
                    )
                ]
    return out


@pytest.mark.spark
def test_query_maintenance_and_readers_together(spark_session, tmp_path, request):
    seconds = request.config.getoption("--soak")
    if not seconds:
        pytest.skip("a soak: run with --soak SECONDS (or KAFKALOG_SOAK_SECONDS)")
    root, ckpt = str(tmp_path / "logs"), str(tmp_path / "ckpt")
    lm = LogManager(root)
    lm.create_topic("all", 3, {"segment.bytes": "3000", "retention.ms": "-1"})
    lm.create_topic(
        "kv",
        2,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "3000",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
            "file.delete.delay.ms": "5000",
        },
    )
    rows = (
        spark_session.readStream.format("rate")
        .option("rowsPerSecond", 300)
        .load()
        .selectExpr(
            "CASE WHEN value % 2 = 0 THEN 'all' ELSE 'kv' END AS topic",
            f"CAST(value % {KEYS} AS STRING) AS key",
            "CAST(value AS STRING) AS value",
        )
    )
    q = (
        rows.writeStream.format("kafkalog")
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="300 milliseconds")
        .start(root)
    )
    stop = threading.Event()
    problems: list[str] = []
    counts = {"passes": 0, "cleanings": 0, "spark_passes": 0, "reads": 0, "gone": 0, "spark_reads": 0}

    def maintenance(rng: random.Random):
        while not stop.is_set():
            spark = spark_session if rng.random() < 0.15 else None
            try:
                reports = run_once(root, spark=spark)
            except Exception as e:  # noqa: BLE001 - reported below
                problems.append(f"maintenance: {type(e).__name__}: {e}")
                return
            errors = [e for r in reports for e in r.errors if not e.startswith("retention: ")]
            problems.extend(f"maintenance report: {e}" for e in errors)
            counts["passes"] += 1
            counts["spark_passes"] += spark is not None
            counts["cleanings"] += sum(r.cleaned for r in reports)
            stop.wait(rng.uniform(0, 0.4))

    def reader(rng: random.Random):
        while not stop.is_set():
            topic = rng.choice(["all", "kv"])
            try:
                if rng.random() < 0.1:
                    n = spark_session.read.format("kafkalog").option("subscribe", topic).load(root).count()
                    counts["spark_reads"] += n >= 0
                elif rng.random() < 0.3:
                    out = io.StringIO()
                    assert consume(LogManager(root), topic, out) == len(out.getvalue().splitlines())
                else:
                    got = read_topic(root, topic)
                    values = [v for _, _, _, v in got]
                    assert len(values) == len(set(values)), f"{topic}: a record read twice"
                    if topic == "all":
                        assert all(v % 2 == 0 for v in values)
                counts["reads"] += 1
            except CorruptRecordError as e:
                if "removed while being read" not in str(e):  # in flight past file.delete.delay.ms: documented
                    problems.append(f"reader: {e}")
                    return
                counts["gone"] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                problems.append(f"reader: {type(e).__name__}: {e}")
                return
            stop.wait(rng.uniform(0, 0.2))

    threads = [
        threading.Thread(target=maintenance, args=(random.Random(1),), daemon=True),
        threading.Thread(target=reader, args=(random.Random(2),), daemon=True),
        threading.Thread(target=reader, args=(random.Random(3),), daemon=True),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and q.isActive and not problems:
            time.sleep(1)
    finally:
        stop.set()
        for t in threads:
            t.join()
        q.stop()
    assert q.exception() is None, q.exception()
    assert not problems, problems[:5]
    run_once(root)
    everything = read_topic(root, "all")
    kv = read_topic(root, "kv")
    evens = sorted(v for _, _, _, v in everything)
    assert evens == list(range(0, 2 * len(evens), 2)), "the delete-policy topic lost or doubled records"
    top = max([v for _, _, _, v in kv], default=-1)
    latest = {}
    for _, _, k, v in kv:
        latest[k] = max(latest.get(k, -1), v)
    want = {
        str(k).encode(): max(v for v in range(1, top + 1, 2) if v % KEYS == k)
        for k in range(KEYS)
        if any(v % KEYS == k for v in range(1, top + 1, 2))
    }
    assert latest == want, "the compacted topic lost a latest value"
    print(
        f"soak {seconds:.0f} s: {len(evens)} + {len(kv)} records, {q.lastProgress and q.lastProgress['batchId']} "
        f"batches, {counts}"
    )
    assert counts["passes"] > 3 and counts["reads"] > 3
