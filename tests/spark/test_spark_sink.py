"""format("kafkalog") as a Spark sink, on local[2]: batch and streaming writes, failures, concurrency."""

import os

import pytest

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kafka_recovery_entries, kp_parse

pytestmark = pytest.mark.spark


def log_records(root, topic, *, markers: bool = False):
    """Every data record of a topic as kafka-python parses the files (what a consumer is given, so no
    transaction markers): {partition: [(offset, key, value, headers, timestamp)]}; markers=True: the
    control records instead."""
    lm = LogManager(root)
    out = {}
    for tp in lm.partitions(topic):
        d = lm.partition_dir(tp)
        data = b"".join(open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d)) if f.endswith(".log"))
        batches = kp_parse(data)
        assert all(b["crc_ok"] for b in batches)
        out[tp.partition] = [
            (r[0], r[2], r[3], r[4], r[1]) for b in batches if b["is_control"] == markers for r in b["records"]
        ]
    return out


def committed_values(root, topic) -> dict:
    """{partition: [value, ...]} as a read_committed consumer sees them (aborted transactions dropped; the
    storage reader's read_committed is checked against Kafka's consumer in tests/storage/transactions)."""
    lm = LogManager(root)
    out = {}
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            out[tp.partition] = [
                v
                for b in log.read_records(log.log_start_offset, isolation_level="read_committed")
                for v in b.column("value").to_pylist()
            ]
    return out


COMMIT_KEY = b"\x00\x00\x00\x01"  # a control record's key: version 0, type COMMIT


def assert_dense_with_commit_markers(root, topic):
    """Each partition's offsets are its data records' and its COMMIT markers' (one per micro-batch that wrote
    it: the sink's transactions), with no gap and no ABORT."""
    data, markers = log_records(root, topic), log_records(root, topic, markers=True)
    for p, rows in data.items():
        assert all(m[1] == COMMIT_KEY for m in markers[p]), markers[p]
        assert sorted([r[0] for r in rows] + [m[0] for m in markers[p]]) == list(range(len(rows) + len(markers[p])))


def rate_stream(spark, rows_per_second=200):
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", rows_per_second)
        .load()
        .selectExpr("CAST(value % 13 AS STRING) AS key", "CAST(value AS STRING) AS value", "timestamp")
    )


def test_batch_write_with_every_column_kafka_python_reads_it(spark_session, tmp_path):
    root = str(tmp_path / "logs")
    df = spark_session.createDataFrame(
        [
            ("k1", "v1", [("h", b"x")], 0, 1700000000000),
            (None, "v2", None, None, 1700000000001),
            ("k3", None, [], 2, 1700000000002),
        ],
        "key string, value string, headers array<struct<key:string,value:binary>>, partition int, ts long",
    ).withColumnRenamed("ts", "timestamp")
    (
        df.write.format("kafkalog")
        .mode("append")
        .option("topic", "t")
        .option("partitions", "3")
        .option("compression.type", "zstd")
        .option("segment.bytes", "4096")
        .save(root)
    )
    got = log_records(root, "t")
    assert (b"k1", b"v1", [("h", b"x")], 1700000000000) in [r[1:] for r in got[0]]  # explicit partitions win
    assert (b"k3", None, [], 1700000000002) in [r[1:] for r in got[2]]
    rest = [r for p in (0, 1, 2) for r in got[p] if r[2] == b"v2"]
    assert len(rest) == 1 and rest[0][1] is None and rest[0][4] == 1700000000001
    assert LogManager(root).topic("t").config.segment_bytes == 4096


def test_keyed_rows_land_where_kafkas_partitioner_puts_them(spark_session, tmp_path):
    from kafka.partitioner.default import murmur2  # kafka-python's port of the Java client's hash

    root = str(tmp_path / "logs")
    keys = [f"user-{i}" for i in range(200)]
    df = spark_session.createDataFrame([(k, f"v-{k}") for k in keys], "key string, value string")
    df.write.format("kafkalog").option("topic", "t").option("partitions", "5").mode("append").save(root)
    got = log_records(root, "t")
    for p, rows in got.items():
        for _, k, _, _, _ in rows:
            assert (murmur2(k) & 0x7FFFFFFF) % 5 == p
    assert sum(len(rows) for rows in got.values()) == 200


def test_streaming_write_is_read_back_once_and_by_the_cli(spark_session, tmp_path, capsys):
    root, ckpt = str(tmp_path / "logs"), str(tmp_path / "ckpt")
    src = spark_session.range(0, 3000, numPartitions=4).selectExpr(
        "CAST(id % 17 AS STRING) AS key", "CAST(id AS STRING) AS value"
    )
    src.write.parquet(str(tmp_path / "in"))
    stream = (
        spark_session.readStream.schema("key string, value string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "in"))
    )
    q = (
        stream.writeStream.format("kafkalog")
        .option("topic", "events")
        .option("partitions", "3")
        .option("segment.bytes", "4096")
        .option("index.interval.bytes", "300")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
        .start(root)
    )
    q.awaitTermination(120)
    assert q.exception() is None
    got = log_records(root, "events")
    values = sorted(int(r[2]) for rows in got.values() for r in rows)
    assert values == list(range(3000))
    assert_dense_with_commit_markers(root, "events")
    # every segment's .index is what Kafka's recovery would rebuild from its .log
    segments = 0
    for p in range(3):
        d = os.path.join(root, f"events-{p}")
        for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
            base = int(name[:20])
            data = open(os.path.join(d, name), "rb").read()
            index = open(os.path.join(d, name[:20] + ".index"), "rb").read()
            assert index == kafka_recovery_entries(kp_parse(data), 300, base)[0]
            segments += 1
    assert segments > 6
    from kafkalog_ds.cli import main

    assert main(["consume", root, "--topic", "events", "--partition", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(got[1])


def test_failed_commit_is_replayed_exactly_once_after_restart(spark_session, tmp_path):
    """Partition 1 is locked by another writer: the commit appends partition 0's data, then fails on 1, so
    the micro-batch's transaction never commits. Restarted from the checkpoint, the same writer aborts it (an
    ABORT marker: nothing is cut) and Spark's replay appends the batch as a new transaction: a read_committed
    reader sees every row once, a read_uncommitted one sees the aborted attempt too."""
    root, ckpt = str(tmp_path / "logs"), str(tmp_path / "ckpt")
    lm = LogManager(root)
    lm.create_topic("t", 2)
    df = spark_session.range(0, 400, numPartitions=2).selectExpr(
        "CAST(id AS STRING) AS value", "CAST(id % 2 AS INT) AS partition"
    )
    df.write.parquet(str(tmp_path / "in"))

    def run():
        stream = spark_session.readStream.schema("value string, partition int").parquet(str(tmp_path / "in"))
        return (
            stream.writeStream.format("kafkalog")
            .option("topic", "t")
            .option("lockTimeoutMs", "2000")
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start(root)
        )

    with lm.open_log(TopicPartition("t", 1), writable=True):
        q = run()
        with pytest.raises(Exception, match="locked"):
            q.awaitTermination(120)
    got = log_records(root, "t")
    assert len(got[0]) == 200 and got[1] == []
    assert committed_values(root, "t") == {0: [], 1: []}  # data with no COMMIT: not read_committed
    q = run()
    q.awaitTermination(120)
    assert q.exception() is None
    got = committed_values(root, "t")
    assert sorted(int(v) for v in got[0]) == list(range(0, 400, 2))
    assert sorted(int(v) for v in got[1]) == list(range(1, 400, 2))
    markers = log_records(root, "t", markers=True)
    assert [m[1] for m in markers[0]] == [b"\x00\x00\x00\x00", COMMIT_KEY]  # the first attempt aborted


def test_task_failure_then_restart_leaves_every_row_once(spark_session, tmp_path):
    """A task dies in the middle of write(); the batch is retried after restart; nothing twice."""
    from pyspark.sql.functions import udf

    root, ckpt, marker = str(tmp_path / "logs"), str(tmp_path / "ckpt"), str(tmp_path / "fail-once")
    open(marker, "w").close()
    spark_session.range(0, 1000, numPartitions=4).selectExpr("CAST(id AS STRING) AS value").write.parquet(
        str(tmp_path / "in")
    )

    @udf("string")
    def explode_once(v):
        if v == "777" and os.path.exists(marker):
            os.remove(marker)
            raise RuntimeError("injected task failure")
        return v

    def run():
        stream = spark_session.readStream.schema("value string").parquet(str(tmp_path / "in"))
        return (
            stream.select(explode_once("value").alias("value"))
            .writeStream.format("kafkalog")
            .option("topic", "t")
            .option("partitions", "2")
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start(root)
        )

    q = run()
    with pytest.raises(Exception, match="injected task failure"):
        q.awaitTermination(120)
    q = run()
    q.awaitTermination(120)
    got = committed_values(root, "t")
    assert sorted(int(v) for rows in got.values() for v in rows) == list(range(1000))
    assert not [f for f in os.listdir(root) if f.startswith(".kafkalog-staged-")]


def test_two_queries_on_one_topic_both_finish_with_dense_offsets(spark_session, tmp_path):
    root = str(tmp_path / "logs")
    LogManager(root).create_topic("t", 1)
    for name, lo in (("a", 0), ("b", 100000)):
        spark_session.range(lo, lo + 2000, numPartitions=3).selectExpr("CAST(id AS STRING) AS value").write.parquet(
            str(tmp_path / f"in-{name}")
        )
    queries = []
    for name in ("a", "b"):
        stream = (
            spark_session.readStream.schema("value string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(tmp_path / f"in-{name}"))
        )
        queries.append(
            stream.writeStream.format("kafkalog")
            .option("topic", "t")
            .option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
            .trigger(availableNow=True)
            .start(root)
        )
    for q in queries:
        q.awaitTermination(180)
        assert q.exception() is None
    rows = log_records(root, "t")[0]
    assert_dense_with_commit_markers(root, "t")
    assert sorted(int(r[2]) for r in rows) == list(range(2000)) + list(range(100000, 102000))


@pytest.mark.parametrize(
    "frame, options, message",
    [
        ("SELECT 1 AS id", {"topic": "t"}, "needs a 'value' column"),
        ("SELECT 1 AS value", {"topic": "t"}, "column 'value' has type int"),
        ("SELECT 'v' AS value, 'x' AS partition", {"topic": "t"}, "column 'partition' has type string"),
        ("SELECT 'v' AS value", {}, "no topic"),
        ("SELECT 'v' AS value", {"topic": "bad topic!"}, "bad topic!"),
        ("SELECT 'v' AS value", {"topic": "t", "segment.bytes": "3"}, "segment.bytes"),
        ("SELECT 'v' AS value", {"topic": "t", "compression.type": "brotli"}, "compression.type"),
        ("SELECT 'v' AS value", {"topic": "t", "kafka.value.serializer": "x"}, "'value.serializer' is not supported"),
    ],
)
def test_bad_input_is_named_before_anything_is_written(spark_session, tmp_path, frame, options, message):
    root = str(tmp_path / "logs")
    w = spark_session.sql(frame).write.format("kafkalog").mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    with pytest.raises(Exception, match=message.replace("!", "!").replace("(", r"\(")):
        w.save(root)
    assert not os.path.exists(root) or not [f for f in os.listdir(root) if not f.startswith(".")]


def test_a_row_for_a_partition_the_topic_lacks_fails_the_write_once_and_no_task(spark_session, tmp_path):
    """The error reaches the user once, from the driver's commit, naming the partition and the topic; no task
    failed, so Spark logged no task error and retried nothing (docs/spark.md, "What Spark prints when a write
    fails"), and nothing was written."""
    root = str(tmp_path / "logs")
    LogManager(root).create_topic("events", 1)
    sc = spark_session.sparkContext
    group = f"kafkalog-out-of-range-{os.getpid()}-{id(tmp_path)}"
    sc.setJobGroup(group, "a row for a partition the topic lacks")
    try:
        frame = spark_session.createDataFrame([("a", 0), ("b", 7)], "value string, partition int").repartition(2)
        with pytest.raises(Exception) as info:
            frame.write.format("kafkalog").option("topic", "events").mode("append").save(root)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    text = str(info.value)
    assert text.count("partition 7 does not exist: topic 'events' has 1 partition(s)") == 1, text
    assert "nothing of this write was committed" in text, text
    tracker = sc.statusTracker()
    stages = [s for job in tracker.getJobIdsForGroup(group) for s in tracker.getJobInfo(job).stageIds]
    assert stages and [tracker.getStageInfo(s).numFailedTasks for s in stages] == [0] * len(stages)
    assert log_records(root, "events") == {0: []}
    assert not [f for f in os.listdir(root) if f.startswith(".kafkalog-staged-")]


def test_register_makes_the_format_available_explicitly(spark_session, tmp_path):
    import kafkalog_ds

    kafkalog_ds.register(spark_session)  # for sessions where data source discovery is off
    root = str(tmp_path / "logs")
    spark_session.createDataFrame([("v",)], "value string").write.format("kafkalog").option("topic", "r").mode(
        "append"
    ).save(root)
    assert log_records(root, "r")[0][0][2] == b"v"
