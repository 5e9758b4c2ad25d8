"""`kafkalog export-to-broker` of topics Spark's kafkalog sink wrote over many micro-batches (docs/kafka-broker.md;
tests/cli/test_kafka_handoff.py hands over three-micro-batch topics of every codec).

- `xs-rolls`: 12 micro-batches (`trigger(availableNow=True)` over parquet files, `maxFilesPerTrigger=1`), each one
  transaction (the sink's default: data batches, then a COMMIT marker per partition). Small segments
  (segment.bytes 16 KiB, batches of at most 2 KiB through max.message.bytes) roll by size inside the big
  micro-batches (which the sink adopts as staged segments), and by time (segment.ms 10 min) between micro-batches:
  each micro-batch's records span 12 minutes, the next starts 15 minutes after. The records are stamped from an
  hour ahead of the wall clock on, so the COMMIT markers (stamped at their commit) lie behind them: a marker
  after data never rolls a segment, and Kafka's rule (each batch's largest timestamp against the segment's
  first batch's) fires between data batches.
- `xs-compact`: a compacted topic the sink writes in three queries on one checkpoint, `kafkalog maintain --once`
  between them at injected times: the tombstones of the first query are past their delete horizon at the second
  cleaning (dropped), those of the second query are stamped by it and inside their horizon, those of the last
  query are not cleaned yet. (test_kafka_handoff.py's compacted topic holds only tombstones inside the horizon:
  it is cleaned once.)

Both topics take one stop/export/start round of the session's broker. Then: (a) its log since the start has no
recovery, index rebuild, truncation, stray directory, WARN or ERROR naming them, and its "Completed load" lines
give each partition kafkalog's segment count, log start and log end; (b) Kafka's Java consumer returns exactly
what kafkalog's engine reads, read_committed and read_uncommitted; (c) Kafka's producer appends on top (plain
sends, a committed and an aborted transaction) and the consumer reads the exported records and the new ones.
"""

from __future__ import annotations

import os
import random
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import storage.log_maintenance
from storage.common.time import MockTime
from storage.log_manager import LogManager
from storage.records.record_batch import CONTROL_FLAG_MASK, DELETE_HORIZON_FLAG_MASK
from storage.topic_partition import TopicPartition
from tests.helpers.broker_checks import bad_lines, differences, expected_loads, kafkalog_records
from tests.helpers.export_rounds import (
    ISOLATIONS,
    append_on_top,
    check_appended,
    consume_commands,
    consumed_by_isolation,
    create_topics,
    loads,
    run_cli,
    wait_for_loads,
)

pytestmark = pytest.mark.long  # Spark writes and a broker round, a minute and more: the long tier, on both brokers

PARTITIONS = 3
ROLLS = "xs-rolls"
SEGMENT_BYTES = 16 * 1024
SEGMENT_MS = 10 * 60_000
MAX_MESSAGE_BYTES = 2048
SPAN_MS, STEP_MS = 12 * 60_000, 15 * 60_000  # a micro-batch's records span 12 minutes; the next starts 15 later
BATCH_ROWS = [30, 60, 600, 30, 60, 30, 600, 30, 60, 30, 600, 30]  # 600 rows: adopted, rolls by size
COMPACT = "xs-compact"
COMPACT_T0 = 1_700_000_000_000
DELETE_RETENTION_MS = 3_600_000
KEYS = 30  # key-0 .. key-29; tombstones: key % 5 == 0 past their horizon, 1 inside it, 2 not cleaned yet
SCHEMA = "key binary, value binary, headers array<struct<key:string,value:binary>>, ts long"
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# ---------------------------------------------------------------- the Spark writes


def _table(keys: list, values: list, ts: list, headers: list | None = None) -> pa.Table:
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array(headers or [None] * len(keys), HEADER_TYPE),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def _rolls_input(batch: int, n: int, t0: int) -> pa.Table:
    """n rows: keys (every 7th null), 100 random bytes, headers on some; timestamps spread over SPAN_MS."""
    rng = random.Random(f"{ROLLS}/{batch}")
    start = t0 + batch * STEP_MS
    return _table(
        [None if i % 7 == 0 else f"user-{rng.randrange(300)}".encode() for i in range(n)],
        [rng.randbytes(100) for _ in range(n)],
        [start + i * SPAN_MS // (n - 1) for i in range(n)],
        [
            [{"key": "b", "value": b"%d" % batch}, {"key": "null", "value": None}] if i % 5 == 0 else None
            for i in range(n)
        ],
    )


def _add_files(src, tables: list[pa.Table], first: int) -> None:
    for i, table in enumerate(tables, first):
        path = src / f"batch-{i:03d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_600_000_000 + i, 1_600_000_000 + i))  # the file source takes the oldest first


def _run_query(spark, src, root: str, checkpoint, topic: str, options: dict) -> None:
    """The files of `src` not taken yet, one micro-batch per file, through writeStream.format("kafkalog")."""
    stream = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src))
        .selectExpr("key", "value", "headers", "timestamp_millis(ts) AS timestamp")
    )
    w = (
        stream.writeStream.format("kafkalog")
        .option("topic", topic)
        .option("partitions", str(PARTITIONS))
        .option("checkpointLocation", str(checkpoint))
    )
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start(root)
    q.awaitTermination()
    assert q.exception() is None, q.exception()


def _compact_input(tag: str, live: list[int], tombstones: list[int], filler: int, first_ts: int) -> pa.Table:
    """Values for some keys, then tombstones for others, then `filler` records of keys of their own, 90 random bytes
    each (segments roll past the tombstones within the micro-batch, so that a cleaning reaches them)."""
    rng = random.Random(f"{COMPACT}/{tag}")
    keys = [f"key-{k}".encode() for k in live + tombstones] + [f"fill-{tag}-{i}".encode() for i in range(filler)]
    values = [f"{tag} value of key-{k} ".encode() * 3 for k in live] + [None] * len(tombstones)
    values += [rng.randbytes(90) for _ in range(filler)]
    return _table(keys, values, [first_ts + i for i in range(len(keys))])


def _maintain_at(root: str, now_ms: int) -> str:
    """`kafkalog maintain ROOT --once --topic xs-compact` at now_ms: --once takes the time of its pass from the
    clock of storage/log_maintenance.py."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(storage.log_maintenance, "SYSTEM_TIME", MockTime(now_ms))
        rc, out, err = run_cli("maintain", root, "--once", "--topic", COMPACT)
    assert rc == 0, out + err
    return out


def _write_compacted(spark, root: str, work, now_ms: int) -> dict:
    src, ckpt = work / "in-compact", work / "ckpt-compact"
    src.mkdir()
    options = {  # batches of at most 600 bytes, segments of 1 KiB
        "compression.type": "lz4",
        "cleanup.policy": "compact",
        "segment.bytes": "1024",
        "max.message.bytes": "600",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": str(DELETE_RETENTION_MS),
    }
    past = [k for k in range(KEYS) if k % 5 == 0]
    inside = [k for k in range(KEYS) if k % 5 == 1]
    dirty = [k for k in range(KEYS) if k % 5 == 2]
    phases = [  # one micro-batch per query
        _compact_input("a", list(range(KEYS)), past, 30, COMPACT_T0),
        _compact_input("b", [3, 4], inside, 30, COMPACT_T0 + 1000),
        _compact_input("c", [4], dirty, 30, COMPACT_T0 + 2000),
    ]
    first = now_ms - DELETE_RETENTION_MS - 600_000  # its horizons are 10 minutes behind the second cleaning
    for i, table in enumerate(phases):
        _add_files(src, [table], i)
        _run_query(spark, src, root, ckpt, COMPACT, options)
        if i == 0:
            _maintain_at(root, first)
        elif i == 1:
            _maintain_at(root, now_ms)
    return dict(past=past, inside=inside, dirty=dirty, first=first, second=now_ms)


@pytest.fixture(scope="module")
def spark_topics(spark_session, tmp_path_factory):
    """Both topics, written once for every broker version, and what kafkalog holds of them."""
    work = tmp_path_factory.mktemp("spark-topics")
    root = str(work / "logs")
    t0 = (int(time.time() * 1000) // 60_000 + 60) * 60_000  # an hour ahead: every COMMIT marker lies behind
    src = work / "in-rolls"
    src.mkdir()
    _add_files(src, [_rolls_input(b, n, t0) for b, n in enumerate(BATCH_ROWS)], 0)
    _run_query(
        spark_session,
        src,
        root,
        work / "ckpt-rolls",
        ROLLS,
        {
            "retention.ms": "-1",
            "segment.bytes": str(SEGMENT_BYTES),
            "segment.ms": str(SEGMENT_MS),
            "max.message.bytes": str(MAX_MESSAGE_BYTES),
        },
    )
    compacted = _write_compacted(spark_session, root, work, int(time.time() * 1000))
    lm = LogManager(root)
    topics = [ROLLS, COMPACT]
    return dict(
        root=root,
        t0=t0,
        compacted=compacted,
        expected={t: {iso: kafkalog_records(root, t, isolation_level=iso) for iso in ISOLATIONS} for t in topics},
        shape={tp: v for t in topics for tp, v in expected_loads(lm, t).items()},
    )


# ---------------------------------------------------------------- the round on the session's broker

BROKER_CONFIGS = {
    ROLLS: {"retention.ms": "-1", "segment.ms": str(SEGMENT_MS), "max.message.bytes": str(MAX_MESSAGE_BYTES)},
    # the broker's cleaner held off (a dirty ratio never exceeds 1) while the exported records are compared
    COMPACT: {
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "1",
        "delete.retention.ms": str(DELETE_RETENTION_MS),
    },
}


@pytest.fixture(scope="module")
def handed(kafka_broker_session, spark_topics):
    b = kafka_broker_session.ensure_running()
    topics = list(BROKER_CONFIGS)
    ids = create_topics(b, {t: (PARTITIONS, configs) for t, configs in BROKER_CONFIGS.items()})
    b.stop()
    assert (b.log_dir / ".kafka_cleanshutdown").exists()
    outs = {}
    for t in topics:
        rc, out, err = run_cli("export-to-broker", spark_topics["root"], "--topic", t, "--to", str(b.log_dir))
        assert rc == 0, out + err
        outs[t] = out
    b.start()
    log = wait_for_loads(b, {t: PARTITIONS for t in topics})
    consumed = consumed_by_isolation(topics, PARTITIONS, b.tool(*consume_commands(topics)))
    return dict(broker=b, ids=ids, outs=outs, broker_log=log, consumed=consumed)


def _segment_ends(log) -> list[tuple]:
    """Per segment: (its size, its first batch's size, first and largest timestamps, whether that batch is a
    marker, whether its last batch is)."""
    out = []
    for seg in log.segments:
        chunks = list(seg.checked_chunks_from_start())
        if not chunks:  # an empty active segment
            continue
        first, last = chunks[0].scan.headers, chunks[-1].scan.headers
        out.append(
            (
                seg.size,
                int(chunks[0].scan.sizes[0]),
                int(first["base_timestamp"][0]),
                int(first["max_timestamp"][0]),
                bool(first["attributes"][0] & CONTROL_FLAG_MASK),
                bool(last["attributes"][-1] & CONTROL_FLAG_MASK),
            )
        )
    return out


@pytest.mark.kafka
@pytest.mark.spark
def test_the_sink_rolled_segments_by_size_and_by_time_in_many_transactions(spark_topics):
    """Every roll between two segments is accounted for: by segment.bytes (the segment and the next batch would
    exceed it, and segment.ms had not passed), by segment.ms (it had, counted between data batches: the next
    batch's largest timestamp against the segment's first batch's, and the size would fit), or by the adopting
    commit of a big micro-batch (its staged segments come in whole, from its first batch on). Both of Kafka's
    rules fire in every partition, none of the rolls is left unexplained, and each micro-batch is one committed
    transaction."""
    lm = LogManager(spark_topics["root"])
    t0, big = spark_topics["t0"], max(BATCH_ROWS)
    total = {"size": 0, "time": 0, "time after a marker": 0, "adopted": 0}
    for tp in lm.partitions(ROLLS):
        with lm.open_log(tp) as log:
            segs = _segment_ends(log)
            markers = sum(int(((c.scan.headers["attributes"] & CONTROL_FLAG_MASK) != 0).sum()) for c in log.read(0))
        assert markers == len(BATCH_ROWS), tp  # one COMMIT marker per micro-batch
        here = dict.fromkeys(total, 0)
        unexplained = []
        for (size, _, _, first_max, marker, ends_marker), (_, next_size, next_first, next_max, next_marker, _) in zip(
            segs, segs[1:], strict=False
        ):
            over_size = size + next_size > SEGMENT_BYTES
            over_time = next_max - first_max > SEGMENT_MS  # (a marker stamped now, before t0, counts backwards)
            # a micro-batch's first batch in the partition (the segment before ends with the last one's marker)
            if not next_marker and ends_marker and BATCH_ROWS[(next_first - t0) // STEP_MS] == big:
                here["adopted"] += 1
            elif over_size and not over_time:
                here["size"] += 1
            elif over_time and not over_size:  # from a segment whose first batch is data, or a marker
                here["time after a marker" if marker else "time"] += 1
            elif not over_size:  # (where both rules would roll, neither is counted)
                unexplained.append((size, next_size, next_first, next_max))
        assert unexplained == [], (tp, unexplained)
        assert here["adopted"] == BATCH_ROWS.count(big) and here["size"] >= 3 and here["time"] >= 5, (tp, here)
        assert all(size <= SEGMENT_BYTES for size, *_ in segs), tp
        for k in total:
            total[k] += here[k]
    rc = spark_topics["expected"][ROLLS]
    assert rc["read_committed"] == rc["read_uncommitted"]  # all committed
    print(
        f"\n{ROLLS}: {len(BATCH_ROWS)} micro-batches, {PARTITIONS} partitions; rolls by size {total['size']}, by time "
        f"{total['time']} (and {total['time after a marker']} from a segment a COMMIT marker began), at adopted "
        f"micro-batches {total['adopted']}"
    )


@pytest.mark.kafka
@pytest.mark.spark
def test_kafkalogs_cleaner_kept_the_tombstones_inside_their_horizon_and_dropped_those_past_it(spark_topics):
    """The tombstones of the first query were stamped at the first cleaning and were past that horizon at the
    second: no record of their keys is left. Those of the second query carry the second cleaning's time +
    delete.retention.ms; those of the last query are not cleaned yet (no horizon)."""
    c = spark_topics["compacted"]
    lm = LogManager(spark_topics["root"])
    horizon_of = {}  # (partition, offset) -> the delete horizon of its batch, for batches that carry one
    for tp in lm.partitions(COMPACT):
        with lm.open_log(tp) as log:
            for chunk in log.read(log.log_start_offset):
                h = chunk.scan.headers
                for base, last, attrs, ts in zip(
                    h["base_offset"], chunk.scan.last_offsets, h["attributes"], h["base_timestamp"], strict=True
                ):
                    if int(attrs) & DELETE_HORIZON_FLAG_MASK:
                        for o in range(int(base), int(last) + 1):
                            horizon_of[tp.partition, o] = int(ts)
    records = spark_topics["expected"][COMPACT]["read_uncommitted"]
    keys = {r[3] for rows in records.values() for r in rows}
    assert not keys & {f"key-{k}".encode() for k in c["past"]}
    tombstones = {r[3]: horizon_of.get((p, r[0])) for p, rows in records.items() for r in rows if r[4] is None}
    assert tombstones == {
        **{f"key-{k}".encode(): c["second"] + DELETE_RETENTION_MS for k in c["inside"]},
        **{f"key-{k}".encode(): None for k in c["dirty"]},
    }


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("topic", [ROLLS, COMPACT])
def test_the_broker_loads_kafkalogs_segments_without_recovery(spark_topics, handed, topic):
    log = handed["broker_log"]
    bad = bad_lines(log, [topic])
    assert bad == [], "\n".join(bad[:20])
    want = {tp: v for tp, v in spark_topics["shape"].items() if tp.topic == topic}
    assert want and loads(log, [topic]) == want
    lm = LogManager(spark_topics["root"])
    if topic == ROLLS:  # every segment kafkalog holds: none below the log start, none without a record
        for tp in lm.partitions(topic):
            with lm.open_log(tp) as log_:
                assert want[tp][0] == len(log_.segments) > 10, tp
    out = handed["outs"][topic].splitlines()[-1]
    assert f"(TopicId {handed['ids'][topic]})" in out and "into the broker's log dir" in out
    print(f"\n{topic}: {sum(v[0] for v in want.values())} segments loaded as kafkalog holds them")


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("topic", [ROLLS, COMPACT])
def test_kafkas_consumer_reads_what_kafkalog_reads(spark_topics, handed, topic):
    for iso in ISOLATIONS:
        expected, got = spark_topics["expected"][topic][iso], handed["consumed"][iso][topic]
        assert differences(expected, got) == [], (topic, iso)
        assert all(expected.values())
    if topic == COMPACT:  # the tombstones kafkalog kept, served
        assert any(r[4] is None for rows in handed["consumed"]["read_committed"][topic].values() for r in rows)


@pytest.fixture(scope="module")
def appended(handed):
    b = handed["broker"].ensure_running()
    return append_on_top(b, list(BROKER_CONFIGS), PARTITIONS, COMPACT_T0 + 10_000_000, compacted=(COMPACT,))


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.parametrize("topic", [ROLLS, COMPACT])
def test_the_broker_appends_on_top(spark_topics, handed, appended, topic):
    check_appended(spark_topics["expected"][topic], appended, topic, spark_topics["shape"])
    assert TopicPartition(topic, 0) in spark_topics["shape"]
