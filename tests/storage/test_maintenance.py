"""The maintenance job (`kafkalog maintain`, kafkalog_ds.maintenance): retention, compaction and
checkpoints per partition, failures isolated; checked with kafka-python and plain models."""

import io
import json
import os
import time

import pytest

from kafkalog_ds.cli import main
from kafkalog_ds.maintenance import run_once
from storage.log_manager import LogManager
from storage.metadata.checkpoint import LOG_START_OFFSET_CHECKPOINT_FILE, parse_checkpoint
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch, kp_parse

OLD = 1_600_000_000_000  # 2020: far past any retention.ms below


def run(capsys, *argv):
    rc = main(list(argv), stdin=io.BytesIO(b""))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def records_of(root, topic, partition):
    d = os.path.join(root, f"{topic}-{partition}")
    out = []
    for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
        for b in kp_parse(open(os.path.join(d, name), "rb").read()):
            if not b["is_control"]:  # a consumer never sees transaction markers
                out += [(r[0], r[2], r[3]) for r in b["records"]]  # offset, key, value
    return out


def fill(lm, topic, batches, *, ts, key=lambda i: None):
    with lm.open_log(TopicPartition(topic, 0), writable=True) as log:
        for i in range(batches):
            log.append(kp_batch([(ts + i, key(i), f"v{i}".encode(), [])]))


def test_one_pass_applies_retention_and_compaction_and_writes_checkpoints(root, capsys):
    lm = LogManager(root)
    small = {"segment.bytes": "400", "file.delete.delay.ms": "0"}
    lm.create_topic("old", 1, {**small, "retention.ms": "60000"})
    lm.create_topic("changelog", 1, {**small, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    fill(lm, "old", 30, ts=OLD)
    fill(lm, "changelog", 60, ts=int(time.time() * 1000) - 10_000, key=lambda i: f"k{i % 5}".encode())
    before = records_of(root, "changelog", 0)

    rc, out, err = run(capsys, "maintain", root, "--once")
    assert rc == 0, err
    assert "old-0: ok" in out and "changelog-0: ok" in out and "compacted" in out
    assert "maintenance pass: 2 partition(s), 0 failed" in out
    # retention: everything expired, the old active segment rolled away; consume starts at the new start
    with lm.open_log(TopicPartition("old", 0)) as log:
        assert log.log_start_offset == 30 and log.log_end_offset == 30
    ckpt = parse_checkpoint(open(os.path.join(root, LOG_START_OFFSET_CHECKPOINT_FILE), "rb").read())
    assert ckpt[TopicPartition("old", 0)] == 30
    # compaction: in the cleaned part one record per key survives, the latest; offsets kept
    after = records_of(root, "changelog", 0)
    with lm.open_log(TopicPartition("changelog", 0)) as log:
        head = log.active_segment.base_offset
    latest = {}  # the cleaner maps keys up to the active segment (the first uncleanable offset)
    for off, k, v in before:
        if off < head:
            latest[k] = (off, k, v)
    cleaned = [r for r in after if r[0] < head]
    assert cleaned == sorted(latest.values())
    assert len(cleaned) < len([r for r in before if r[0] < head])
    assert [r for r in after if r[0] >= head] == [r for r in before if r[0] >= head]
    # a second pass has nothing left to do and fails nothing
    rc, out, _ = run(capsys, "maintain", root, "--once")
    assert rc == 0 and "0 failed" in out


def test_a_failing_partition_is_reported_and_the_others_still_run(root, capsys):
    lm = LogManager(root)
    lm.create_topic("t", 2, {"segment.bytes": "300", "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    for p in (0, 1):
        with lm.open_log(TopicPartition("t", p), writable=True) as log:
            for i in range(20):
                log.append(kp_batch([(OLD + i, f"k{i % 3}".encode(), b"x" * 40, [])]))
    seg = sorted(os.listdir(os.path.join(root, "t-0")))
    first = os.path.join(root, "t-0", [f for f in seg if f.endswith(".log")][1])
    with open(first, "r+b") as f:  # a rolled segment with a batch length no batch can have
        f.seek(8)
        f.write(b"\x7f\xff\xff\xff")
    reports = run_once(root)
    by = {r.partition: r for r in reports}
    assert by[1].errors == [] and by[1].cleaned and by[1].records_dropped > 0
    assert by[0].errors  # reported, named by partition in its line
    assert "t-0: FAILED" in by[0].line()
    rc, out, _ = run(capsys, "maintain", root, "--once")
    assert rc == 1 and "1 failed" in out


def test_bad_cleaner_setting_is_named(root, capsys):
    LogManager(root).create_topic("t", 1)
    rc, _, err = run(capsys, "maintain", root, "--once", "--cleaner-config", "log.cleaner.io.max.bytes.per.second=-5")
    assert rc == 1 and "log.cleaner.io.max.bytes.per.second" in err


@pytest.mark.spark
def test_job_beside_a_live_streaming_writer_loses_nothing(spark_session, tmp_path):
    """Compaction and retention passes (plain and as a Spark job) while a streaming query writes:
    the log stays valid, offsets keep increasing, and the latest value of every key survives."""
    root, ckpt, src = str(tmp_path / "logs"), str(tmp_path / "ckpt"), str(tmp_path / "in")
    rows = spark_session.range(0, 6000, numPartitions=30).selectExpr(
        "CAST(id % 40 AS STRING) AS key", "CAST(id AS STRING) AS value"
    )
    rows.write.parquet(src)
    stream = spark_session.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1).parquet(src)
    q = (
        stream.writeStream.format("kafkalog")
        .option("topic", "kv")
        .option("partitions", "2")
        .option("cleanup.policy", "compact")
        .option("segment.bytes", "2000")
        .option("min.cleanable.dirty.ratio", "0.01")
        .option("file.delete.delay.ms", "0")
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="200 milliseconds")
        .start(root)
    )
    passes, cleanings = 0, 0
    try:
        while q.isActive and not q.exception():
            reports = run_once(root, spark=spark_session if passes % 3 == 2 else None)
            assert not [r.errors for r in reports if r.errors]
            cleanings += sum(r.cleaned for r in reports)
            passes += 1
            if len(q.recentProgress) and sum(p["numInputRows"] for p in q.recentProgress) >= 6000:
                break
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None and passes >= 3 and cleanings > 0
    run_once(root)
    got = {}
    for p in (0, 1):
        recs = records_of(root, "kv", p)
        offsets = [r[0] for r in recs]
        assert offsets == sorted(set(offsets))  # increasing, no duplicates
        values = [int(r[2]) for r in recs]
        assert len(values) == len(set(values))  # no record twice
        for _, k, v in recs:
            got[k] = max(got.get(k, -1), int(v))
    expected = {str(k).encode(): max(i for i in range(6000) if i % 40 == k) for k in range(40)}
    assert got == expected
    lm = LogManager(root)
    assert json.dumps(lm.describe(["kv"]).to_dict())  # loadable
