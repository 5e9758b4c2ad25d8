"""format("kafkalog") as a drop-in for format("kafka"): what a job written for Spark's Kafka connector
does, checked in one shared SparkSession (the option rules themselves: tests/spark/test_connector_options.py)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from storage.log_manager import LogManager
from storage.records.builder import build_records
from storage.topic_partition import TopicPartition

pytestmark = pytest.mark.spark


def values(root, topic):
    lm = LogManager(root)
    out = []
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            out += [v for b in log.read_records(log.log_start_offset) for v in b.column("value").to_pylist()]
    return out


def append(root, topic, vals):
    with LogManager(root).open_log(TopicPartition(topic, 0), writable=True) as log:
        log.append(build_records(pa.table({"value": [v.encode() for v in vals]})))


def test_a_kafka_job_runs_with_the_format_and_path_changed(spark_session, tmp_path):
    """Options of public Kafka jobs (a reader's checkpointLocation, consumer and fetch settings) are
    accepted; the topic option overrides a topic column; a user schema selects columns."""
    root = str(tmp_path / "logs")
    frame = spark_session.range(0, 50, numPartitions=2).selectExpr(
        "'ignored-column-topic' AS topic", "CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value"
    )
    (
        frame.write.format("kafkalog")
        .mode("append")
        .option("topic", "events")
        .option("kafka.bootstrap.servers", "broker:9092")
        .option("kafka.acks", "all")
        .save(root)
    )
    assert LogManager(root).topics() == ["events"]
    df = (
        spark_session.read.format("kafkalog")
        .option("subscribe", "events")
        .option("checkpointLocation", str(tmp_path / "unused"))
        .option("groupIdPrefix", "etl")
        .option("kafkaConsumer.pollTimeoutMs", "512")
        .option("fetchOffset.numRetries", "3")
        .option("fetchOffset.retryIntervalMs", "10")
        .option("spark.streaming.kafka.maxRatePerPartition", "9")
        .option("kafka.bootstrap.servers", "broker:9092")
        .option("startingOffsets", "earliest")
        .load(root)
    )
    assert sorted(int(r.value) for r in df.selectExpr("CAST(value AS STRING) AS value").collect()) == list(range(50))
    narrow = (
        spark_session.read.schema("value binary, offset long")
        .format("kafkalog")
        .option("subscribe", "events")
        .load(root)
    )
    assert narrow.columns == ["value", "offset"]
    rows = narrow.collect()
    assert sorted(int(r.value) for r in rows) == list(range(50)) and {r.offset for r in rows} <= set(range(50))
    with pytest.raises(Exception, match="with their Kafka types.*got value string"):
        spark_session.read.schema("value string").format("kafkalog").option("subscribe", "events").load(root).collect()


def test_a_reused_dataframe_sees_records_appended_since(spark_session, tmp_path):
    """pyspark keeps a DataFrame's planned read; earliest/latest are resolved by each task when it reads,
    so a DataFrame queried again sees what the log holds then (Spark's Kafka source plans every query)."""
    root = str(tmp_path / "logs")
    LogManager(root).create_topic("t", 1)
    append(root, "t", ["a", "b"])
    df = spark_session.read.format("kafkalog").option("subscribe", "t").load(root)
    assert df.count() == 2
    append(root, "t", ["c"])
    assert df.count() == 3
    assert sorted(r.value for r in df.selectExpr("CAST(value AS STRING) AS value").collect()) == ["a", "b", "c"]
    fixed = (
        spark_session.read.format("kafkalog")
        .option("subscribe", "t")
        .option("endingOffsets", '{"t":{"0":2}}')
        .load(root)
    )
    append(root, "t", ["d"])
    assert fixed.count() == 2  # an explicit end stays where it was put


def test_complete_mode_appends_the_whole_result_each_trigger_and_stream_errors_are_ours(spark_session, tmp_path):
    root, src = str(tmp_path / "logs"), str(tmp_path / "in")
    spark_session.range(0, 6).selectExpr("CAST(id % 2 AS STRING) AS k").write.parquet(src + "/1")
    counts = (
        spark_session.readStream.schema("k string")
        .parquet(src + "/*")
        .groupBy("k")
        .count()
        .selectExpr("k AS key", "CAST(count AS STRING) AS value")
    )
    q = (
        counts.writeStream.format("kafkalog")
        .outputMode("complete")
        .option("topic", "counts")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .start(root)
    )
    try:
        q.processAllAvailable()
        spark_session.range(0, 2).selectExpr("CAST(id % 2 AS STRING) AS k").write.parquet(src + "/2")
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    assert sorted(values(root, "counts")) == [b"3", b"3", b"4", b"4"]  # each trigger's whole table, as Kafka's sink

    bad = (
        spark_session.readStream.format("kafkalog")
        .option("subscribe", "counts")
        .option("endingOffsets", "latest")
        .load(root)
    )
    q = bad.writeStream.format("memory").queryName("bad_option").start()
    with pytest.raises(Exception) as err:
        q.awaitTermination(120)
    assert "ending offset not valid in streaming queries" in str(err.value)
    assert "UnboundLocalError" not in str(err.value).split("ending offset not valid")[0]
    with pytest.raises(Exception, match=r'Save mode Overwrite not allowed for kafkalog: use \.mode\("append"\)'):
        spark_session.range(1).selectExpr("'v' AS value").write.format("kafkalog").mode("overwrite").option(
            "topic", "t"
        ).save(root)
    assert os.path.isdir(root)
