"""spark.read / spark.readStream format("kafkalog") against a brute-force model of the files."""

import json
import os
import random
import struct

import pyarrow as pa
import pytest

from storage.log_manager import LogManager
from storage.records.builder import build_records
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch, kp_parse

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def build_root(root, seed=5):
    """Topic 'a' (3 partitions, small segments, timestamps that go backwards) and topic 'c' (one
    partition with compaction-style offset gaps, written as raw files like another implementation)."""
    rng = random.Random(seed)
    lm = LogManager(root)
    lm.create_topic("a", 3, {"segment.bytes": "3000", "index.interval.bytes": "200"})
    for p in range(3):
        with lm.open_log(TopicPartition("a", p), writable=True) as log:
            ts = T0
            for b in range(25):
                n = rng.randint(1, 12)
                stamps = []
                for _ in range(n):
                    ts += rng.randint(-40, 60)
                    stamps.append(ts)
                table = pa.table(
                    {
                        "key": [f"k{rng.randint(0, 9)}".encode() for _ in range(n)],
                        "value": [f"a{p}-{b}-{i}".encode() for i in range(n)],
                        "timestamp": stamps,
                    }
                )
                log.append(build_records(table))
    d = os.path.join(root, "c-0")
    os.makedirs(d)
    data, offset = bytearray(), 0
    for b in range(30):
        batch = bytearray(kp_batch([(T0 + b * 100 + i, b"k", b"c-%d-%d" % (b, i), []) for i in range(3)]))
        struct.pack_into(">q", batch, 0, offset)
        data += batch
        offset += 3 + rng.randint(1, 5)  # gaps, as compaction leaves them
    with open(os.path.join(d, "00000000000000000000.log"), "wb") as f:
        f.write(data)
    return lm


def model(root):
    """Every record per (topic, partition), read straight from the .log files with kafka-python."""
    out = {}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not os.path.isdir(path):
            continue
        topic, part = name.rsplit("-", 1)
        data = b"".join(
            open(os.path.join(path, f), "rb").read() for f in sorted(os.listdir(path)) if f.endswith(".log")
        )
        out[(topic, int(part))] = [(r[0], r[1], r[2], r[3]) for b in kp_parse(data) for r in b["records"]]
    return out


def first_at_or_after(records, ts):
    return next((o for o, t, _, _ in records if t >= ts), None)


def expected(m, topics, start_spec, end_spec):
    """Brute force of Spark's Kafka semantics for one query."""
    rows = []
    for (topic, p), recs in m.items():
        if topic not in topics:
            continue
        end_of_log = recs[-1][0] + 1 if recs else 0
        kind, v = start_spec
        if kind == "ts":
            start = first_at_or_after(recs, v)
            start = end_of_log if start is None else start
        elif kind == "offsets":
            start = v.get((topic, p), 0)
        else:
            start = 0
        kind, v = end_spec
        if kind == "ts":
            end = first_at_or_after(recs, v)
            end = end_of_log if end is None else end
        elif kind == "offsets":
            end = v.get((topic, p), end_of_log)
        else:
            end = end_of_log
        rows += [(topic, p, o, t, k, val) for o, t, k, val in recs if start <= o < end]
    return sorted(rows)


def collect(df):
    return sorted(
        (r.topic, r.partition, r.offset, int(r.timestamp.timestamp() * 1000 + 0.5), r.key, r.value)
        for r in df.collect()
    )


def test_batch_reads_match_brute_force_for_random_ranges(spark_session, tmp_path):
    root = str(tmp_path / "logs")
    build_root(root)
    m = model(root)
    assert len(os.listdir(os.path.join(root, "a-0"))) > 6  # many segments
    rng = random.Random(11)
    all_ts = sorted(t for recs in m.values() for _, t, _, _ in recs)
    for case in range(14):
        topics = rng.choice([["a"], ["c"], ["a", "c"]])
        reader = spark_session.read.format("kafkalog")
        reader = (
            reader.option("subscribe", ",".join(topics))
            if case % 3
            else reader.option("subscribePattern", "|".join(topics))
        )
        start_spec, end_spec = ("none", None), ("none", None)
        choice = case % 4
        if choice == 0:
            ts = rng.choice(all_ts) + rng.randint(-2, 2)
            reader = reader.option("startingTimestamp", str(ts))
            start_spec = ("ts", ts)
            if rng.random() < 0.5:
                te = ts + rng.randint(0, 1500)
                reader = reader.option("endingTimestamp", str(te)).option("startingOffsets", "earliest")
                end_spec = ("ts", te)
        elif choice == 1:
            starts = {(t, p): rng.randint(0, max(0, len(recs) - 1)) for (t, p), recs in m.items() if t in topics}
            ends = {k: min(v + rng.randint(0, 60), m[k][-1][0] + 1) for k, v in starts.items()}

            def js(d, topics=topics):
                return json.dumps({t: {str(p): o for (tt, p), o in d.items() if tt == t} for t in topics})

            reader = reader.option("startingOffsets", js(starts)).option("endingOffsets", js(ends))
            start_spec, end_spec = ("offsets", starts), ("offsets", ends)
        elif choice == 2:
            stamps = {(t, p): rng.choice([x[1] for x in recs]) for (t, p), recs in m.items() if t in topics}
            js = json.dumps({t: {str(p): s for (tt, p), s in stamps.items() if tt == t} for t in topics})
            reader = reader.option("startingOffsetsByTimestamp", js).option("startingOffsets", "earliest")
            start_spec = ("ts_per", stamps)
        reader = reader.option("minPartitions", str(rng.choice([1, 4, 9])))
        got = collect(reader.load(root))
        if start_spec[0] == "ts_per":
            want = []
            for (t, p), ts in start_spec[1].items():
                s = first_at_or_after(m[(t, p)], ts)
                want += [(t, p, o, tt, k, v) for o, tt, k, v in m[(t, p)] if o >= s]
            want = sorted(want)
        else:
            want = expected(m, topics, start_spec, end_spec)
        assert got == want, (case, topics, start_spec, end_spec)


def test_same_rows_as_kafkalog_consume_and_headers(spark_session, tmp_path, capsys):
    root = str(tmp_path / "logs")
    lm = LogManager(root)
    lm.create_topic("h", 1)
    with lm.open_log(TopicPartition("h", 0), writable=True) as log:
        log.append(kp_batch([(T0, b"k", b"v", [("x", b"1"), ("y", None)]), (T0 + 1, None, None, [])]))
    rows = (
        spark_session.read.format("kafkalog")
        .option("subscribe", "h")
        .option("includeHeaders", "true")
        .load(root)
        .collect()
    )
    assert [r.headers for r in rows] == [[("x", b"1"), ("y", None)], None]
    from kafkalog_ds.cli import main

    assert main(["consume", root, "--topic", "h"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(x["offset"], x["key"], x["value"]) for x in lines] == [
        (r.offset, r.key and r.key.decode(), r.value and r.value.decode()) for r in rows
    ]


def test_data_loss_is_named_or_skipped(spark_session, tmp_path):
    root = str(tmp_path / "logs")
    lm = build_root(root)
    with lm.open_log(TopicPartition("a", 1), writable=True) as log:
        log.maybe_increment_log_start_offset(20)
    opts = {"assign": '{"a":[1]}', "startingOffsets": '{"a":{"1":5}}'}
    r = spark_session.read.format("kafkalog").options(**opts)
    with pytest.raises(Exception, match=r"offsets 5\.\.19 of a-1 are gone"):
        r.load(root).collect()
    got = r.option("failOnDataLoss", "false").load(root).selectExpr("min(offset)").collect()[0][0]
    assert got == 20
    # as Spark's Kafka source: an assigned partition the topic lacks is not read, a missing topic fails
    assert spark_session.read.format("kafkalog").option("assign", '{"a":[7]}').load(root).count() == 0
    with pytest.raises(Exception, match="topic.s. nosuch do not exist"):
        spark_session.read.format("kafkalog").option("assign", '{"nosuch":[0]}').load(root).collect()


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "exactly one of 'subscribe', 'subscribePattern' or 'assign'"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "got subscribe, assign"),
        ({"subscribe": "a", "startingOffsets": "latest"}, "'latest' is not allowed for a batch query's start"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, "'earliest' is not allowed for the end"),
        ({"subscribe": "a", "startingOffsets": "{nope"}, "not valid JSON"),
        ({"subscribe": "a", "startingOffsets": '{"a":{"0":1}}'}, "must give every partition"),
        ({"subscribe": "a", "startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"subscribe": "a", "startingTimestamp": "99999999999999"}, "startingOffsetsByTimestampStrategy=latest"),
        ({"subscribe": "a", "startingOffsetsByTimestampStrategy": "maybe"}, "'error' or 'latest'"),
        ({"subscribe": "a", "failOnDataLoss": "sometimes"}, "failOnDataLoss"),
        ({"subscribe": "a", "minPartitions": "0"}, "minPartitions"),
        (
            {
                "subscribePattern": "(",
            },
            "not a valid regex",
        ),
        ({"assign": '{"a": "0"}'}, "assign"),
        ({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "'auto.offset.reset' is not supported"),
        ({"subscribe": "a", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "2"}, "is higher than"),
    ],
)
def test_bad_options_get_clear_errors(spark_session, tmp_path, options, message):
    root = str(tmp_path / "logs")
    build_root(root)
    r = spark_session.read.format("kafkalog")
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception, match=message.replace("(", r"\(").replace(")", r"\)").replace("'", "'")):
        r.load(root).collect()


def test_latest_strategy_starts_at_the_end(spark_session, tmp_path):
    root = str(tmp_path / "logs")
    build_root(root)
    df = (
        spark_session.read.format("kafkalog")
        .option("subscribe", "a")
        .option("startingTimestamp", "99999999999999")
        .option("startingOffsetsByTimestampStrategy", "latest")
    )
    assert df.load(root).count() == 0
