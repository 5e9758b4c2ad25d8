"""spark.readStream.format("kafkalog"): restarts, a live writer, read limits, new topics."""

import os
import time

import pytest

from storage.log_manager import LogManager
from tests.helpers.kafka_reference import kp_parse

pytestmark = pytest.mark.spark


def log_offsets(root, topic):
    lm = LogManager(root)
    out = set()
    for tp in lm.partitions(topic):
        d = lm.partition_dir(tp)
        data = b"".join(open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d)) if f.endswith(".log"))
        out |= {(tp.partition, r[0]) for b in kp_parse(data) if not b["is_control"] for r in b["records"]}
    return out


def read_output(spark, path):
    """What the parquet sink committed (Spark honours its _spark_metadata log; stray files are ignored)."""
    if not os.path.exists(path):
        return []
    return [(r.partition, r.offset) for r in spark.read.parquet(path).select("partition", "offset").collect()]


@pytest.mark.long
def test_reader_restarted_ten_times_beside_a_writer_sees_every_record_once(spark_session, tmp_path):
    root, out = str(tmp_path / "logs"), str(tmp_path / "out")
    writer = (
        spark_session.readStream.format("rate")
        .option("rowsPerSecond", 400)
        .load()
        .selectExpr("CAST(value % 11 AS STRING) AS key", "CAST(value AS STRING) AS value")
        .writeStream.format("kafkalog")
        .option("topic", "live")
        .option("partitions", "2")
        .option("segment.bytes", "20000")
        .option("checkpointLocation", str(tmp_path / "wckpt"))
        .trigger(processingTime="300 milliseconds")
        .start(root)
    )
    try:
        while not os.path.exists(os.path.join(root, "live.kafkalog-topic.json")):
            time.sleep(0.2)

        def reader(**trigger):
            return (
                spark_session.readStream.format("kafkalog")
                .option("subscribe", "live")
                .option("startingOffsets", "earliest")
                .load(root)
                .select("partition", "offset", "value")
                .writeStream.format("parquet")
                .option("checkpointLocation", str(tmp_path / "rckpt"))
                .trigger(**trigger)
                .start(out)
            )

        for _ in range(10):
            q = reader(processingTime="200 milliseconds")
            # stop once a micro-batch has committed: a query stopped before its first commit restarts at
            # batch 0 over a checkpoint that is not empty, which Spark refuses (a race with the clock)
            while not q.recentProgress and q.isActive:
                time.sleep(0.05)
            q.stop()
            assert q.exception() is None
    finally:
        writer.stop()
    q = reader(availableNow=True)
    q.awaitTermination(120)
    got = read_output(spark_session, out)
    assert len(got) == len(set(got)), "a record was read twice"
    assert set(got) == log_offsets(root, "live"), "a record was missed"
    assert len(got) > 1000


def test_max_offsets_per_trigger_is_split_by_lag_and_available_now_finishes(spark_session, tmp_path):
    root, out = str(tmp_path / "logs"), str(tmp_path / "out")
    (
        spark_session.range(0, 900, numPartitions=1)
        .selectExpr("CAST(id AS STRING) AS value", "CAST(CASE WHEN id < 600 THEN 0 ELSE 1 END AS INT) AS partition")
        .write.format("kafkalog")
        .option("topic", "t")
        .option("partitions", "2")
        .option("transactional", "false")  # no COMMIT markers: every offset a row, so triggers count rows
        .mode("append")
        .save(root)
    )
    q = (
        spark_session.readStream.format("kafkalog")
        .option("subscribe", "t")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "300")
        .load(root)
        .select("partition", "offset")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(out)
    )
    q.awaitTermination(120)
    batches = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert batches == [300, 300, 300]  # lag 600:300 -> 200 + 100 per trigger
    assert sorted(read_output(spark_session, out)) == sorted(log_offsets(root, "t"))


def test_a_new_topic_matching_the_pattern_is_read_from_earliest(spark_session, tmp_path):
    root, out = str(tmp_path / "logs"), str(tmp_path / "out")
    lm = LogManager(root)
    spark_session.createDataFrame([("x",)], "value string").write.format("kafkalog").option("topic", "ev-1").mode(
        "append"
    ).save(root)

    def run():
        q = (
            spark_session.readStream.format("kafkalog")
            .option("subscribePattern", "ev-.*")
            .option("startingOffsets", "earliest")
            .load(root)
            .select("topic", "partition", "offset")
            .writeStream.format("parquet")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start(out)
        )
        q.awaitTermination(120)

    run()
    spark_session.createDataFrame([("y",), ("z",)], "value string").write.format("kafkalog").option(
        "topic", "ev-2"
    ).mode("append").save(root)
    run()
    rows = spark_session.read.parquet(out).collect()
    assert sorted((r.topic, r.offset) for r in rows) == [("ev-1", 0), ("ev-2", 0), ("ev-2", 1)]
    assert lm.topics() == ["ev-1", "ev-2"]
