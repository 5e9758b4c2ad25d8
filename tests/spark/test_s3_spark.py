"""format("kafkalog") on S3 (moto's server on 127.0.0.1, reached by the Spark workers over HTTP with
`fs.*` options): a streaming sink read back by kafka-python (objects fetched with s3fs) and by Spark,
replayed micro-batches, batch reads by offset and by timestamp (with a partition that never got a
record), readStream with availableNow, and a PUT that fails in the middle of a commit."""

import json
import os
import random

import pyarrow as pa
import pytest

from storage.log_manager import LogManager
from storage.records.builder import build_records
from storage.topic_partition import TopicPartition
from tests.helpers.s3_objects import check_kafka_files, partition_objects, s3fs_of
from tools.s3_server import ACCESS_KEY, REGION, SECRET_KEY

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def fs_options(server) -> dict:
    """The storage options as Spark options: the workers are other processes, so nothing comes from env."""
    return {
        "fs.endpoint_url": server.endpoint_url,
        "fs.key": ACCESS_KEY,
        "fs.secret": SECRET_KEY,
        "fs.client_kwargs": json.dumps({"region_name": REGION}),
    }


def log_records(server, url, topic, partitions, interval=4096):
    """{partition: [(offset, timestamp, key, value, headers)]} from kafka-python parsing every object."""
    s3 = s3fs_of(server)
    return {p: check_kafka_files(partition_objects(s3, url, topic, p), interval) for p in range(partitions)}


def segment_names(server, url, topic, partitions):
    s3 = s3fs_of(server)
    return {p: sorted(n for n in partition_objects(s3, url, topic, p) if n.endswith(".log")) for p in range(partitions)}


def write_input(spark, path, n, files):
    (
        spark.range(0, n, numPartitions=files)
        .selectExpr("CAST(id % 17 AS STRING) AS key", "CAST(id AS STRING) AS value")
        .write.parquet(path)
    )


def sink(spark, server, url, src, ckpt, **options):
    stream = spark.readStream.schema("key string, value string").option("maxFilesPerTrigger", 1).parquet(src)
    w = (
        stream.writeStream.format("kafkalog")
        .options(**fs_options(server))
        .option("topic", "events")
        .option("partitions", "3")
        .option("checkpointLocation", ckpt)
        .trigger(availableNow=True)
    )
    return w.options(**options).start(url)


def test_stream_sink_on_s3_writes_kafka_files_once_and_spark_reads_them(spark_session, s3_server, s3_root, tmp_path):
    url, _ = s3_root
    src, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_input(spark_session, src, 900, 3)
    q = sink(spark_session, s3_server, url, src, ckpt, **{"index.interval.bytes": "300"})
    q.awaitTermination(180)
    assert q.exception() is None
    got = log_records(s3_server, url, "events", 3, interval=300)
    assert sorted(int(r[3]) for rows in got.values() for r in rows) == list(range(900))
    from kafka.partitioner.default import murmur2

    assert all((murmur2(r[2]) & 0x7FFFFFFF) % 3 == p for p, rows in got.items() for r in rows)
    names = segment_names(s3_server, url, "events", 3)
    # per partition per micro-batch: its data object and its COMMIT marker object (the sink's transactions)
    assert all(len(n) == 6 for n in names.values())

    # Spark's micro-batch 2 again (its commit forgotten, as after a driver crash): every partition skips it
    for name in ("2", ".2.crc"):
        if os.path.exists(os.path.join(ckpt, "commits", name)):
            os.remove(os.path.join(ckpt, "commits", name))
    q = sink(spark_session, s3_server, url, src, ckpt, **{"index.interval.bytes": "300"})
    q.awaitTermination(180)
    assert q.exception() is None
    assert os.path.exists(os.path.join(ckpt, "commits", "2"))
    assert segment_names(s3_server, url, "events", 3) == names
    assert log_records(s3_server, url, "events", 3, interval=300) == got

    rows = (
        spark_session.read.format("kafkalog")
        .options(**fs_options(s3_server))
        .option("subscribe", "events")
        .load(url)
        .select("partition", "offset", "key", "value", "timestamp")
        .collect()
    )
    assert sorted((r.partition, r.offset, r.key, r.value) for r in rows) == sorted(
        (p, o, k, v) for p, recs in got.items() for o, _, k, v, _ in recs
    )
    assert {int(r.timestamp.timestamp() * 1000) for r in rows} == {
        ts for recs in got.values() for _, ts, _, _, _ in recs
    }


def build_topic(url, opts, seed=3):
    """Topic t with 3 partitions: 0 and 1 get 12 appends each (one segment object per append), with
    timestamps that go back now and then; partition 2 never gets a record."""
    rng = random.Random(seed)
    lm = LogManager(url, opts)
    lm.create_topic("t", 3, {"index.interval.bytes": "200"})
    for p in (0, 1):
        with lm.open_log(TopicPartition("t", p), writable=True) as log:
            ts = T0
            for b in range(12):
                n = rng.randint(3, 20)
                stamps = []
                for _ in range(n):
                    ts += rng.randint(-30, 60)
                    stamps.append(ts)
                log.append(
                    build_records(
                        pa.table(
                            {
                                "key": [b"k%d" % rng.randint(0, 9) for _ in range(n)],
                                "value": [b"t%d-%d-%d" % (p, b, i) for i in range(n)],
                                "timestamp": stamps,
                            }
                        )
                    )
                )


def test_batch_reads_by_offset_and_timestamp_on_s3_with_an_empty_partition(spark_session, s3_server, s3_root):
    url, opts = s3_root
    build_topic(url, opts)
    model = log_records(s3_server, url, "t", 3, interval=200)
    assert model[2] == [] and len(model[0]) > 50

    def read(**options):
        r = spark_session.read.format("kafkalog").options(**fs_options(s3_server)).option("subscribe", "t")
        rows = r.options(**options).load(url).select("partition", "offset", "value").collect()
        return sorted((x.partition, x.offset, x.value) for x in rows)

    def want(starts, ends=None):
        return sorted(
            (p, o, v)
            for p, recs in model.items()
            for o, _, _, v, _ in recs
            if o >= starts.get(p, 0) and (ends is None or o < ends.get(p, len(recs)))
        )

    assert read() == want({})
    assert read(minPartitions="5") == want({})
    assert read(startingOffsets='{"t":{"0":7,"1":-2,"2":-2}}', endingOffsets='{"t":{"0":40,"1":-1,"2":-1}}') == want(
        {0: 7}, {0: 40}
    )

    def first_at(p, ts):  # Kafka's ListOffsets by time, brute force: the earliest offset with timestamp >= ts
        return next((o for o, t, _, _, _ in model[p] if t >= ts), len(model[p]))

    stamps = sorted(t for p in (0, 1) for _, t, _, _, _ in model[p])
    T = stamps[len(stamps) // 2]
    # the empty partition has no record at or after T: an error naming it, or its end with strategy latest
    with pytest.raises(Exception, match="no record at or after timestamp .* in t-2"):
        read(startingTimestamp=str(T))
    assert read(startingTimestamp=str(T), startingOffsetsByTimestampStrategy="latest") == want(
        {0: first_at(0, T), 1: first_at(1, T)}
    )
    T0b, T1b, Tend = stamps[10], stamps[-30], stamps[-5]
    got = read(
        startingOffsetsByTimestamp=json.dumps({"t": {"0": T0b, "1": T1b, "2": T0b}}),
        startingOffsetsByTimestampStrategy="latest",
        endingTimestamp=str(Tend),
    )
    assert got == want({0: first_at(0, T0b), 1: first_at(1, T1b)}, {0: first_at(0, Tend), 1: first_at(1, Tend)})


def test_read_stream_available_now_from_s3_twice(spark_session, s3_server, s3_root, tmp_path):
    url, opts = s3_root
    build_topic(url, opts)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")

    def run():
        q = (
            spark_session.readStream.format("kafkalog")
            .options(**fs_options(s3_server))
            .option("subscribe", "t")
            .option("startingOffsets", "earliest")
            .load(url)
            .select("partition", "offset", "value")
            .writeStream.format("parquet")
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start(out)
        )
        q.awaitTermination(180)
        assert q.exception() is None
        return sorted((r.partition, r.offset, r.value) for r in spark_session.read.parquet(out).collect())

    first = run()
    with LogManager(url, opts).open_log(TopicPartition("t", 2), writable=True) as log:  # the empty one gets data
        log.append(
            build_records(pa.table({"key": [b"x", None], "value": [b"late-0", b"late-1"], "timestamp": [T0, T0 + 1]}))
        )
    second = run()
    model = log_records(s3_server, url, "t", 3, interval=200)
    assert first == sorted((p, o, v) for p in (0, 1) for o, _, _, v, _ in model[p])
    assert second == first + [(2, 0, b"late-0"), (2, 1, b"late-1")]


def test_put_failing_mid_commit_then_restart_leaves_every_row_once(spark_session, s3_faults, s3_root, tmp_path):
    """Partition 1's second segment PUT, micro-batch 0's COMMIT marker object, is refused (403): the commit
    fails after its decision (commit) and partition 0's marker. Restarted from the checkpoint, the writer
    rolls the transaction forward (the missing COMMIT markers go in, nothing is cut), Spark's replay of batch 0
    finds it committed, and batch 1 follows. A read_committed consumer gets every source row once."""
    server, (url, _) = s3_faults, s3_root
    src, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_input(spark_session, src, 600, 2)
    prefix = url[len("s3://") :]
    fault = server.add_fault("PUT", rf"^/{prefix}/events-1/\d{{20}}\.log$", after=1)
    q = sink(spark_session, server, url, src, ckpt)
    with pytest.raises(Exception, match="events-1"):
        q.awaitTermination(180)
    assert fault.failed == 1
    names = segment_names(server, url, "events", 3)
    # batch 0's data in every partition, its COMMIT marker in partition 0 only
    assert [len(names[p]) for p in range(3)] == [2, 1, 1]
    server.clear_faults()

    q = sink(spark_session, server, url, src, ckpt)
    q.awaitTermination(180)
    assert q.exception() is None
    got = log_records(server, url, "events", 3)  # read_committed, and no transaction left open
    values = sorted(int(r[3]) for rows in got.values() for r in rows)
    assert values == list(range(600))
    after = segment_names(server, url, "events", 3)
    assert all(set(names[p]) <= set(after[p]) for p in range(3))  # nothing was cut
    assert [len(after[p]) for p in range(3)] == [4, 4, 4]  # batch 0 once (rolled forward), then batch 1
