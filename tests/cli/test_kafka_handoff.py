"""kafkalog -> broker: `kafkalog export-to-broker` hands topics Spark wrote to a real Kafka broker (4.4.0 and 3.9.1).

Spark's kafkalog sink writes four topics (codecs none, zstd, lz4, gzip; three partitions; keys, null keys,
headers with null values, explicit out-of-order timestamps; one micro-batch big enough to be adopted as
staged segments between two small ones that are copied) and a compacted topic (snappy, tombstones) that
kafkalog's maintenance job then compacts; one partition's log start is moved into a segment with
delete-records (once: every broker version gets the same input). The same topics are created on the session's
broker, the broker is stopped cleanly, the command writes into its log dir, and the broker is started again.
Then:

- the broker's log since that start holds no recovery, index rebuild, truncation, stray directory or
  corrupt-data message, nor any WARN/ERROR naming the topics, and its "Completed load" lines give each
  partition the exported segment count, log start and log end;
- Kafka's DumpLogSegments finds no index mismatch, no invalid batch, and every index passes its sanity check;
- Kafka's consumer reads every record exactly as kafkalog reads it, and ListOffsets (earliest, latest,
  maxTimestamp, and many timestamps) gives kafkalog's answers;
- the broker appends on top (Kafka's producer) and compacts the compacted topic again; kafkalog reads the
  broker's log dir afterwards exactly as the consumer does.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import random
import re
import shutil
import struct
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kafkalog_ds.cli import main
from storage.log_manager import LogManager
from storage.metadata.checkpoint import LOG_START_OFFSET_CHECKPOINT_FILE, parse_checkpoint
from storage.records.record_batch import CONTROL_FLAG_MASK, DELETE_HORIZON_FLAG_MASK
from storage.staging.record_stager import ADOPT_MIN_BYTES
from storage.topic_partition import TopicPartition
from tests.helpers import broker_checks
from tests.helpers.broker_checks import LOAD_RE, bad_lines, differences, expected_loads, kafkalog_records, wait

PARTITIONS = 3
SEGMENT_BYTES = 128 * 1024  # adoption threshold: half of it, 64 KiB of a partition's staging log
CODECS = {"ho-none": "none", "ho-zstd": "zstd", "ho-lz4": "lz4", "ho-gzip": "gzip"}
COMPACT = "ho-compact"
COMPACT_SEGMENT_BYTES = 16 * 1024
TOPICS = [*CODECS, COMPACT]
T0 = 1_700_000_000_000
DELETED_TP = TopicPartition("ho-zstd", 1)  # its log start is moved into its second segment
STAGED = "ho-lz4"  # exported into a staging directory, then copied into the broker's log dir

# ---------------------------------------------------------------- input


def _rows(topic: str, batch: int, n: int, first: int, compact: bool) -> pa.Table:
    """n rows; `first` numbers them across the topic's batches, so every timestamp is unique per topic.
    Every fifth record's timestamp goes back 25 ms behind the one before it."""
    rng = random.Random(f"{topic}/{batch}")
    keys, values, headers, ts = [], [], [], []
    for i in range(first, first + n):
        if compact:
            keys.append(f"key-{rng.randrange(40)}".encode())
            values.append(None if rng.random() < 0.08 else f"state {i} ".encode() * rng.randrange(1, 8))
        else:
            keys.append(None if i % 4 == 0 else f"user-{rng.randrange(500)}".encode())
            values.append(rng.randbytes(160) if i % 3 else f"text value {batch}-{i}".encode())
        headers.append(
            [{"key": "trace", "value": f"t-{i}".encode()}, {"key": "empty", "value": None}]
            if i % 5 == 0
            else ([] if i % 5 == 1 else None)
        )
        ts.append(T0 + 10 * i - (25 if i % 5 == 3 else 0))
    header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": pa.array(headers, header_type),
            "ts": pa.array(ts, pa.int64()),
        }
    )


def _spark_write(spark, root: str, work, topic: str) -> None:
    """Three micro-batches through writeStream.format("kafkalog"): small (copied), big (adopted), small."""
    compact = topic == COMPACT
    src = work / f"in-{topic}"
    src.mkdir()
    sizes = [60, 2000, 60] if compact else [60, 3000, 60]
    first = 0
    for batch, n in enumerate(sizes):
        path = src / f"batch-{batch}.parquet"
        pq.write_table(_rows(topic, batch, n, first, compact), path)
        os.utime(path, (1_600_000_000 + batch, 1_600_000_000 + batch))  # the file source takes the oldest first
        first += n
    stream = (
        spark.readStream.schema("key binary, value binary, headers array<struct<key:string,value:binary>>, ts long")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(src))
        .selectExpr("key", "value", "headers", "timestamp_millis(ts) AS timestamp")
    )
    w = (
        stream.writeStream.format("kafkalog")
        .option("topic", topic)
        .option("partitions", str(PARTITIONS))
        .option("retention.ms", "-1")
        .option("checkpointLocation", str(work / f"ckpt-{topic}"))
        # the sink's default: each micro-batch one transaction (export carries the markers, .txnindex, snapshot)
    )
    if compact:
        w = (
            w.option("compression.type", "snappy")
            .option("segment.bytes", str(COMPACT_SEGMENT_BYTES))
            .option("cleanup.policy", "compact")
            .option("min.cleanable.dirty.ratio", "0.01")
        )
    else:
        w = w.option("compression.type", CODECS[topic]).option("segment.bytes", str(SEGMENT_BYTES))
    q = w.trigger(availableNow=True).start(root)
    q.awaitTermination()
    assert q.exception() is None, q.exception()


# ---------------------------------------------------------------- reading both sides


def _dump_log_segments(broker, files: list[str], *flags: str) -> str:
    """The broker's version of Kafka's DumpLogSegments over the files: stdout and stderr (where it reports
    mismatches)."""
    return "".join(broker.dump_log_output(files, *flags))


def _tree(root: str) -> dict[str, tuple[int, int]]:
    """Every file under root: (size, mtime)."""
    files = [os.path.join(d, n) for d, _, names in os.walk(root) for n in names]
    return {os.path.relpath(f, root): (st.st_size, st.st_mtime_ns) for f in files for st in [os.stat(f)]}


def _run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _segment_bases(d) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(d) if n.endswith(".log") and len(n) == 24)


# ---------------------------------------------------------------- the handoff


@pytest.fixture
def broker(kafka_broker_session):
    """The session's broker, as the tests left it (not restarted)."""
    return kafka_broker_session


@pytest.fixture(scope="module")
def handoff_input(spark_session, tmp_path_factory):
    """What Spark and kafkalog write, once for every broker version: the topics, compacted and with a log start
    moved, and kafkalog's records and partition shapes. The export only reads the root (`handoff` checks)."""
    work = tmp_path_factory.mktemp("handoff")
    root = str(work / "logs")
    for topic in TOPICS:
        _spark_write(spark_session, root, work, topic)
    rc, out, err = _run_cli("maintain", root, "--once", "--topic", COMPACT)
    assert rc == 0, out + err
    with LogManager(root).open_log(DELETED_TP) as log:
        # into the second segment holding data (a COMMIT marker stamped now may sit alone in a segment: its
        # timestamp is years past the 2023 records', and Kafka's time-based roll rule rolls on it)
        second = next(seg for seg in log.segments[1:] if seg.size > 1000)
        deleted_to = second.base_offset + 3
    rc, out, err = _run_cli(
        "delete-records",
        root,
        "--topic",
        DELETED_TP.topic,
        "--partition",
        str(DELETED_TP.partition),
        "--offset",
        str(deleted_to),
    )
    assert rc == 0, out + err

    # what kafkalog holds: records, and the partitions' shape as the broker must load it
    records = {t: kafkalog_records(root, t) for t in TOPICS}
    # partition -> (segments the broker must load, its log start, log end, kafkalog's segment sizes)
    lm = LogManager(root)
    shape = {}
    for t in TOPICS:
        for tp, load in expected_loads(lm, t).items():
            with lm.open_log(tp) as log:
                shape[tp] = (*load, [s.size for s in log.segments])
    return dict(root=root, records=records, shape=shape, deleted_to=deleted_to)


@pytest.fixture(scope="module")
def handoff(handoff_input, kafka_broker_session, tmp_path_factory):
    """The input exported to this version's broker (its log dir, and one topic through a staging directory),
    Kafka's DumpLogSegments over what was written, and the broker started on it."""
    b = kafka_broker_session.ensure_running()
    root, records, shape = handoff_input["root"], handoff_input["records"], handoff_input["shape"]
    input_files = _tree(root)
    created = b.tool(
        *(
            {
                "op": "createTopic",
                "topic": t,
                "partitions": PARTITIONS,
                "configs": (
                    {
                        "cleanup.policy": "compact",
                        "min.cleanable.dirty.ratio": "0.01",
                        "internal.segment.bytes": str(COMPACT_SEGMENT_BYTES),
                    }
                    if t == COMPACT
                    else {"retention.ms": "-1"}
                ),
            }
            for t in TOPICS
        )
    )
    topic_ids = {t: r["topicId"] for t, r in zip(TOPICS, created, strict=False)}
    log_dir = b.log_dir
    wait(
        lambda: all((log_dir / f"{t}-{p}" / "partition.metadata").exists() for t in TOPICS for p in range(PARTITIONS)),
        "the new topics' partition directories",
        b,
    )
    b.stop()
    exports = {}
    for i, t in enumerate(TOPICS):
        if t == STAGED:  # the staging route, as docs/kafka-broker.md does it: export, then replace the broker's dirs
            staging = tmp_path_factory.mktemp(f"handoff-staging-{b.version}") / "staging"
            rc, out, err = _run_cli(
                "export-to-broker", root, "--topic", t, "--topic-id", topic_ids[t], "--to", str(staging)
            )
            assert rc == 0, out + err
            for p in range(PARTITIONS):
                shutil.rmtree(log_dir / f"{t}-{p}")
                shutil.copytree(staging / f"{t}-{p}", log_dir / f"{t}-{p}")
        else:  # half name the topic id, half let the command read it from the broker's partition directories
            argv = ["export-to-broker", root, "--topic", t, "--to", str(log_dir)]
            if i % 2:
                argv += ["--topic-id", topic_ids[t]]
            rc, out, err = _run_cli(*argv)
            assert rc == 0, out + err
        exports[t] = out
    exported = [
        str(log_dir / f"{t}-{p}" / n)
        for t in TOPICS
        for p in range(PARTITIONS)
        for n in sorted(os.listdir(log_dir / f"{t}-{p}"))
    ]
    indexes = [f for f in exported if f.endswith((".index", ".timeindex"))]
    dumps = {
        "verify": _dump_log_segments(b, indexes, "--verify-index-only"),
        "sanity": _dump_log_segments(b, indexes, "--index-sanity-check"),
        "logs": _dump_log_segments(b, [f for f in exported if f.endswith(".log")]),
    }
    assert _tree(root) == input_files, "the export changed the root it read (the next broker's input)"
    checkpoints = {
        name: parse_checkpoint((log_dir / name).read_bytes())
        for name in (LOG_START_OFFSET_CHECKPOINT_FILE, "cleaner-offset-checkpoint")
    }
    partition_files = {}
    for tp in shape:
        d = log_dir / f"{tp.topic}-{tp.partition}"
        with open(d / f"{_segment_bases(d)[0]:020d}.log", "rb") as f:
            first_batch = int.from_bytes(f.read(8), "big")
        partition_files[tp] = dict(
            names=sorted(os.listdir(d)),
            first_batch=first_batch,
            **{
                n: (d / n).read_text() if (d / n).exists() else None
                for n in ("partition.metadata", "leader-epoch-checkpoint")
            },
        )

    b.start()
    for t in TOPICS:
        for p in range(PARTITIONS):
            # (the name may go on with `.<id>-stray`: a directory the broker set aside is loaded first)
            b.wait_for_log(f"Completed load of Log(dir={log_dir / f'{t}-{p}'}", f"the load of {t}-{p}")
    return dict(
        root=root,
        records=records,
        shape=shape,
        topic_ids=topic_ids,
        exports=exports,
        dumps=dumps,
        checkpoints=checkpoints,
        files=partition_files,
        deleted_to=handoff_input["deleted_to"],
        n_indexes=len(indexes),
        broker_log=b.log_since_start(),
        log_dir=log_dir,
    )


@pytest.mark.kafka
@pytest.mark.spark
def test_the_input_took_both_commit_paths_and_was_compacted(handoff_input):
    """Each partition's first micro-batch was copied into a segment that the adopting commit rolled early,
    and the last one was copied into the adopted tail; the compacted topic lost records to compaction and
    carries tombstones with a delete horizon (KIP-534). (The input of every broker version: it runs once.)"""
    handoff = handoff_input
    threshold = min(ADOPT_MIN_BYTES, SEGMENT_BYTES // 2)
    lm = LogManager(handoff["root"])
    for tp, (_kept, _start, end, sizes) in handoff["shape"].items():
        if tp.topic == COMPACT:
            continue
        assert len(sizes) >= 2, (tp, sizes)
        assert sizes[0] < SEGMENT_BYTES // 4, (tp, sizes)  # rolled by the adoption, not by segment.bytes
        assert sum(sizes[1:]) >= threshold, (tp, sizes)
        recs = handoff["records"][tp.topic][tp.partition]
        if tp != DELETED_TP:  # every offset is a record or a micro-batch's COMMIT marker (the sink's default)
            with lm.open_log(tp) as log:
                markers = [
                    int(b)
                    for chunk in log.read(0)
                    for b in chunk.scan.headers["base_offset"][
                        (chunk.scan.headers["attributes"] & CONTROL_FLAG_MASK) != 0
                    ]
                ]
            assert markers and sorted([r[0] for r in recs] + markers) == list(range(end)), tp
    compact = handoff["records"][COMPACT]
    cleaned = lm.checkpoint_file("cleaner-offset-checkpoint").read()
    for p, rows in compact.items():  # below kafkalog's cleaner checkpoint, one record per key
        to = cleaned[TopicPartition(COMPACT, p)]
        keys = [r[3] for r in rows if r[0] < to]
        assert to > 0 and len(keys) == len(set(keys)) and len(keys) < to, (p, to, len(keys))
    assert any(r[4] is None for rows in compact.values() for r in rows), "no tombstone left"
    horizons = 0
    for tp in lm.partitions(COMPACT):
        with lm.open_log(tp) as log:
            for chunk in log.read(log.log_start_offset):
                horizons += int(((chunk.scan.headers["attributes"] & DELETE_HORIZON_FLAG_MASK) != 0).sum())
    assert horizons > 0
    kept_segments, start, _, sizes = handoff["shape"][DELETED_TP]
    assert start == handoff["deleted_to"] and 1 < kept_segments < len(sizes)


@pytest.mark.kafka
@pytest.mark.spark
def test_the_command_writes_kafkas_files_only(handoff, broker):
    for tp, files in handoff["files"].items():
        extra = [f for f in files["names"] if not re.fullmatch(r"\d{20}\.(log|index|timeindex|snapshot|txnindex)", f)]
        assert extra == ["leader-epoch-checkpoint", "partition.metadata"], (tp, files["names"])
        assert files["partition.metadata"] == f"version: 0\ntopic_id: {handoff['topic_ids'][tp.topic]}"
        # the leader epoch starts at the first batch kept (below the log start in DELETED_TP)
        assert files["leader-epoch-checkpoint"] == f"0\n1\n0 {files['first_batch']}\n"
    starts = handoff["checkpoints"][LOG_START_OFFSET_CHECKPOINT_FILE]
    assert {tp: o for tp, o in starts.items() if tp.topic in TOPICS} == {DELETED_TP: handoff["deleted_to"]}
    cleaned = handoff["checkpoints"]["cleaner-offset-checkpoint"]
    assert {tp.topic for tp in cleaned if tp.topic in TOPICS} == {COMPACT}
    for t, out in handoff["exports"].items():
        lines = out.splitlines()
        assert lines[-1].startswith(
            f"Exported {PARTITIONS} partition(s) of topic {t} (TopicId {handoff['topic_ids'][t]})"
        ), out
        assert ("into the staging directory" if t == STAGED else "into the broker's log dir") in lines[-1]


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.every_broker
def test_the_broker_loads_every_partition_without_recovery_or_warnings(handoff, broker):
    log = handoff["broker_log"]
    bad = bad_lines(log, TOPICS)
    assert bad == [], "\n".join(bad[:20])
    assert "Skipping recovery of" in log
    loaded = {}
    for m in LOAD_RE.finditer(log):
        name = os.path.basename(m["dir"])
        topic, _, p = name.rpartition("-")
        if topic in TOPICS:
            loaded[TopicPartition(topic, int(p))] = (int(m["segments"]), int(m["start"]), int(m["end"]))
    expected = {tp: (kept, start, end) for tp, (kept, start, end, _) in handoff["shape"].items()}
    assert loaded == expected
    print(
        f"\nbroker loaded {len(loaded)} partitions, {sum(v[0] for v in loaded.values())} segments, "
        f"{sum(v[2] - v[1] for v in loaded.values())} offsets; 0 warnings"
    )


@pytest.mark.kafka
@pytest.mark.spark
def test_kafkas_dump_log_segments_finds_nothing_wrong(handoff, broker):
    dumps = handoff["dumps"]
    for word in (
        "Mismatches in",
        "timestamp mismatch",
        "out of order timestamp",
        "not found in",
        "isvalid: false",
        "invalid bytes",
        "Non-consecutive offsets",
        "Exception",
    ):
        assert word not in dumps["verify"] + dumps["logs"], word
    passed = dumps["sanity"].count("passed sanity check.")
    empty = dumps["sanity"].count(" is empty.")
    assert passed + empty == handoff["n_indexes"] and passed > 0, dumps["sanity"][-2000:]
    batches = dumps["logs"].count("baseOffset: ")
    assert batches > 0 and dumps["logs"].count("isvalid: true") == batches
    # no data batch has a producer id without a sequence (Kafka's cleaner refuses those; the command clears
    # them); a transaction's markers carry none, as Kafka's own do
    assert not re.search(r"baseSequence: -1 lastSequence: -?\d+ producerId: \d[^\n]*isControl: false", dumps["logs"])


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.every_broker
def test_kafkas_consumer_reads_what_kafkalog_reads(handoff, broker):
    consumed = broker_checks.consumed(broker, TOPICS, PARTITIONS)
    total = 0
    for t in TOPICS:
        assert differences(handoff["records"][t], consumed[t]) == [], t
        total += sum(len(rows) for rows in consumed[t].values())
    assert total > 12_000
    print(f"\n{total} records compared (offset, key, value, headers, timestamp, timestampType): 0 differences")


@pytest.mark.kafka
@pytest.mark.spark
def test_list_offsets_by_timestamp_gives_kafkalogs_offsets(handoff, broker):
    lm = LogManager(handoff["root"])
    commands, expected = [], []
    rng = random.Random(7)
    stamps_at = {}  # partition -> offset -> timestamp, markers included (stamped at their commit: now)
    for t in TOPICS:
        for tp in lm.partitions(t):
            with lm.open_log(tp) as log:
                stamps_at[tp] = {
                    o: ts
                    for b in log.read_records(log.log_start_offset, skip_control=False)
                    for o, ts in zip(b.column("offset").to_pylist(), b.column("timestamp").to_pylist(), strict=True)
                }
    for t in TOPICS:
        recs = handoff["records"][t]
        stamps = sorted(r[1] for rows in recs.values() for r in rows)
        picks = rng.sample(stamps, 10)
        wanted = sorted(
            {
                stamps[0] - 1,
                stamps[0],
                stamps[-1],
                stamps[-1] + 1,
                *picks,
                *(s + 1 for s in picks[:5]),
                *(s - 3 for s in picks[5:]),
            }
        )
        for ts in wanted:
            want = {}
            for tp in lm.partitions(t):
                with lm.open_log(tp) as log:
                    off = log.offset_for_timestamp(ts)
                if off is None:
                    want[tp.partition] = (-1, -1)
                else:  # a COMMIT marker's offset too, as Kafka's search over the time index finds it
                    want[tp.partition] = (off, stamps_at[tp][off])
            commands.append({"op": "listOffsets", "topic": t, "partitions": list(range(PARTITIONS)), "spec": ts})
            expected.append(want)
        for spec in ("earliest", "latest", "maxTimestamp"):
            want = {}
            for p in range(PARTITIONS):
                _, start, end, _ = handoff["shape"][TopicPartition(t, p)]
                if spec == "earliest":
                    want[p] = (start, -1)
                elif spec == "latest":
                    want[p] = (end, -1)
                else:  # markers included: Kafka's MAX_TIMESTAMP finds the latest COMMIT marker
                    at = stamps_at[TopicPartition(t, p)]
                    top = max(at.values())
                    want[p] = (min(o for o, ts in at.items() if ts == top), top)
            commands.append({"op": "listOffsets", "topic": t, "partitions": list(range(PARTITIONS)), "spec": spec})
            expected.append(want)
    got = broker.tool(*commands)
    diffs = []
    for cmd, want, answer in zip(commands, expected, got, strict=False):
        have = {int(p): (v["offset"], v["timestamp"]) for p, v in answer.items()}
        if have != want:
            diffs.append(f"{cmd['topic']} {cmd['spec']}: broker {have}, kafkalog {want}")
    assert diffs == [], "\n".join(diffs[:20])
    print(f"\n{len(commands)} ListOffsets requests x {PARTITIONS} partitions compared: 0 differences")


@pytest.mark.kafka
@pytest.mark.spark
def test_export_refuses_a_running_brokers_log_dir(handoff, broker):
    assert broker.running
    d = handoff["log_dir"] / "ho-none-0"
    before = sorted(os.listdir(d))
    rc, out, err = _run_cli("export-to-broker", handoff["root"], "--topic", "ho-none", "--to", str(handoff["log_dir"]))
    assert rc == 1
    assert err.startswith("kafkalog: error: ") and "is locked by another process: a Kafka broker is running" in err
    assert len(err.splitlines()) == 1 and out == ""
    assert sorted(os.listdir(d)) == before
    assert not [n for n in os.listdir(handoff["log_dir"]) if n.endswith("-delete")]


@pytest.fixture(scope="module")
def broker_work(handoff, kafka_broker_session):
    """The broker appends on top of every topic and compacts the compacted one; then it is stopped."""
    b = kafka_broker_session.ensure_running()
    commands = []
    for t in CODECS:
        steps = [
            {
                "send": {
                    "partition": p,
                    "key": base64.b64encode(f"broker-{p}-{i}".encode()).decode(),
                    "value": base64.b64encode(f"appended by the broker {i}".encode()).decode(),
                    "timestamp": T0 + 10_000_000 + i,
                    "headers": [["from", base64.b64encode(b"kafka").decode()]],
                }
            }
            for p in range(PARTITIONS)
            for i in range(10)
        ]
        commands.append({"op": "produce", "topic": t, "config": {"compression.type": "lz4"}, "steps": steps})
    rng = random.Random(3)  # new values for keys the export holds, enough to roll several 16 KiB segments
    steps = [
        {
            "send": {
                "key": base64.b64encode(f"key-{rng.randrange(40)}".encode()).decode(),
                "value": base64.b64encode(b"broker state " * 40).decode(),
                "timestamp": T0 + 20_000_000 + i,
            }
        }
        for i in range(400)
    ]
    commands.append(
        {"op": "produce", "topic": COMPACT, "config": {"batch.size": "2000", "linger.ms": "0"}, "steps": steps}
    )
    b.tool(*commands)
    log_dir = b.log_dir

    def cleaned_to_active():
        path = log_dir / "cleaner-offset-checkpoint"
        done = parse_checkpoint(path.read_bytes()) if path.exists() else {}
        return all(
            done.get(TopicPartition(COMPACT, p)) == _segment_bases(log_dir / f"{COMPACT}-{p}")[-1]
            and len(_segment_bases(log_dir / f"{COMPACT}-{p}")) > 1
            for p in range(PARTITIONS)
        )

    wait(cleaned_to_active, "the broker's cleaner to clean ho-compact up to its active segments", b)
    consumed = broker_checks.consumed(b, TOPICS, PARTITIONS)
    log = b.log_since_start()
    b.stop()  # indexes trimmed, a clean log dir for kafkalog to read
    return dict(consumed=consumed, log=log, read={t: kafkalog_records(str(log_dir), t) for t in TOPICS})


@pytest.mark.kafka
@pytest.mark.spark
def test_kafkalog_reads_the_brokers_log_dir_after_appends_and_compaction(handoff, broker_work, broker):
    consumed, read = broker_work["consumed"], broker_work["read"]
    total = 0
    for t in TOPICS:
        assert differences(consumed[t], read[t]) == [], t
        total += sum(len(rows) for rows in read[t].values())
    for t in CODECS:  # the exported records, then the broker's
        for p in range(PARTITIONS):
            rows = read[t][p]
            assert rows[:-10] == handoff["records"][t][p]
            assert [r[4] for r in rows[-10:]] == [f"appended by the broker {i}".encode() for i in range(10)]
    # the broker's cleaner dropped the exported records of the keys it got new values for below its active
    # segment, and kept the other exported records as they were
    dropped = 0
    for p in range(PARTITIONS):
        active = _segment_bases(handoff["log_dir"] / f"{COMPACT}-{p}")[-1]
        exported_end = handoff["shape"][TopicPartition(COMPACT, p)][2]
        new_keys = {r[3] for r in read[COMPACT][p] if r[0] >= exported_end and r[0] < active}
        old = [r for r in read[COMPACT][p] if r[0] < exported_end]
        assert not [r for r in old if r[3] in new_keys]
        assert set(old) <= set(handoff["records"][COMPACT][p])
        dropped += len(handoff["records"][COMPACT][p]) - len(old)
    assert dropped > 0
    bad = bad_lines(broker_work["log"], TOPICS)
    assert bad == [], "\n".join(bad[:20])
    # a partition that holds records now is not exported into again
    rc, out, err = _run_cli("export-to-broker", handoff["root"], "--topic", "ho-none", "--to", str(handoff["log_dir"]))
    assert rc == 1 and "already holds records" in err and len(err.splitlines()) == 1, err
    print(f"\n{total} records compared after the broker's appends and compaction: 0 differences")


# ---------------------------------------------------------------- quick checks, no broker or Spark


TOPIC_ID = "kq3WGgVRSgSDwBQJuv0r5w"


def _small_root(tmp_path, *, batches=12, producer_id=-1, base_sequence=-1) -> str:
    """A kafkalog topic `t` of 2 partitions and small segments, written through the engine."""
    from tests.helpers.kafka_reference import kp_batch

    root = str(tmp_path / "logs")
    lm = LogManager(root)
    lm.create_topic("t", 2, {"segment.bytes": "300", "index.interval.bytes": "100"})
    for p in range(2):
        with lm.open_log(TopicPartition("t", p), writable=True) as log:
            for i in range(batches):
                log.append(
                    kp_batch(
                        [
                            (T0 + 100 * i + j, f"k{j}".encode(), f"v{p}-{i}-{j}".encode(), [("h", None)])
                            for j in range(3)
                        ],
                        producer_id=producer_id,
                        producer_epoch=0,
                        base_sequence=base_sequence,
                    )
                )
    return root


def _fake_broker_dir(path, topic="t", partitions=2, topic_id=TOPIC_ID, clean=True):
    """What a stopped KRaft broker leaves for a topic it created and never wrote to."""
    path.mkdir(parents=True)
    (path / "meta.properties").write_text("version=1\nnode.id=1\ncluster.id=x\ndirectory.id=y\n")
    if clean:
        (path / ".kafka_cleanshutdown").write_text('{"version":0,"brokerEpoch":7}')
    for p in range(partitions):
        d = path / f"{topic}-{p}"
        d.mkdir()
        for sfx in (".log", ".index", ".timeindex"):
            (d / f"{0:020d}{sfx}").write_bytes(b"")
        (d / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}")
        (d / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    entries = "".join(f"{topic} {p} 0\n" for p in range(partitions)) + "other 0 5\n"
    for name in ("recovery-point-offset-checkpoint", "replication-offset-checkpoint"):
        (path / name).write_text(f"0\n{partitions + 1}\n" + entries)
    (path / "log-start-offset-checkpoint").write_text("0\n1\nother 0 3\n")
    return path


def test_export_into_a_broker_log_dir_writes_kafkas_files_and_checkpoints(tmp_path):
    root = _small_root(tmp_path, producer_id=12345)
    rc, out, err = _run_cli("delete-records", root, "--topic", "t", "--partition", "1", "--offset", "7")
    assert rc == 0, err
    broker_dir = _fake_broker_dir(tmp_path / "kafka")
    rc, out, err = _run_cli("export-to-broker", root, "--topic", "t", "--to", str(broker_dir))
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith("t-0: ") and "producer id without a sequence cleared in 12 batch(es)" in lines[0]
    assert lines[-1].startswith(f"Exported 2 partition(s) of topic t (TopicId {TOPIC_ID}): ")
    lm = LogManager(root)
    for p in range(2):
        d = broker_dir / f"t-{p}"
        names = sorted(os.listdir(d))
        with lm.open_log(TopicPartition("t", p)) as log:
            kept = [
                s
                for i, s in enumerate(log.segments)
                if i + 1 == len(log.segments) or log.segments[i + 1].base_offset > log.log_start_offset
            ]
            assert names == sorted(
                [f"{s.base_offset:020d}{sfx}" for s in kept for sfx in (".log", ".index", ".timeindex")]
                + ["leader-epoch-checkpoint", "partition.metadata", f"{log.log_end_offset:020d}.snapshot"]
            )
            for s in kept:  # the same batches, but for the producer fields and the epoch (and so the CRC)
                mine = (d / f"{s.base_offset:020d}.log").read_bytes()
                assert len(mine) == s.size
    check = lambda name: parse_checkpoint((broker_dir / name).read_bytes())  # noqa: E731
    assert check("log-start-offset-checkpoint") == {TopicPartition("other", 0): 3, TopicPartition("t", 1): 7}
    assert (
        check("recovery-point-offset-checkpoint")
        == check("replication-offset-checkpoint")
        == {TopicPartition("other", 0): 5, TopicPartition("t", 0): 36, TopicPartition("t", 1): 36}
    )
    assert not [n for n in os.listdir(broker_dir) if "delete" in n]
    # kafkalog reads the exported partitions as it reads its own (the broker's files are a log dir too)
    assert kafkalog_records(str(broker_dir), "t") == kafkalog_records(root, "t")


def test_export_into_a_staging_directory(tmp_path):
    root = _small_root(tmp_path)
    _run_cli("delete-records", root, "--topic", "t", "--partition", "0", "--offset", "5")
    rc, out, err = _run_cli("export-to-broker", root, "--topic", "t", "--to", str(tmp_path / "staging"))
    assert rc == 1 and err.startswith("kafkalog: error: --topic-id is required for a staging directory")
    rc, out, err = _run_cli(
        "export-to-broker", root, "--topic", "t", "--topic-id", TOPIC_ID, "--to", str(tmp_path / "staging")
    )
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path / "staging")) == ["t-0", "t-1", "t.delete-records.json"]
    assert '"offset": 5' in (tmp_path / "staging" / "t.delete-records.json").read_text()
    assert "kafka-delete-records.sh --offset-json-file" in out.splitlines()[-1]
    rc, out, err = _run_cli(
        "export-to-broker", root, "--topic", "t", "--topic-id", TOPIC_ID, "--to", str(tmp_path / "staging")
    )
    assert rc == 1 and "holds" in err and "already" in err


@pytest.mark.parametrize(
    "case, message",
    [
        ("unclean", "has no .kafka_cleanshutdown: the broker did not shut down cleanly"),
        ("wrong-id", "is not the id of topic 't' on this broker"),
        ("bad-id", "is not a Kafka topic id"),
        ("records", "already holds records"),
        ("records-after-a-broker-ran", "already holds records"),
        ("missing-partition", "holds no directory for partition 1 of topic 't'"),
        ("more-partitions", "holds partition 2 of topic 't', which has 2 partition(s)"),
        ("not-a-log-dir", "is neither a Kafka broker's log dir"),
        ("locked", "is locked by another process: a Kafka broker is running"),
        ("damaged", "CRC mismatch"),
    ],
)
def test_export_refuses_and_changes_nothing(tmp_path, case, message):
    root = _small_root(tmp_path)
    broker_dir = _fake_broker_dir(
        tmp_path / "kafka", clean=case != "unclean", partitions=3 if case == "more-partitions" else 2
    )
    argv = ["export-to-broker", root, "--topic", "t", "--to", str(broker_dir)]
    if case == "wrong-id":
        argv += ["--topic-id", "AAAAAAAAAAAAAAAAAAAAAg"]
    elif case == "bad-id":
        argv += ["--topic-id", "not-an-id"]
    elif case.startswith("records"):
        (broker_dir / "t-1" / f"{0:020d}.log").write_bytes(b"x" * 100)
        if case == "records-after-a-broker-ran":  # a broker that ran leaves its (empty) lock file behind
            (broker_dir / ".lock").write_bytes(b"")
    elif case == "missing-partition":
        argv += ["--partition", "1"]
        shutil.rmtree(broker_dir / "t-1")
    elif case == "not-a-log-dir":
        (broker_dir / "meta.properties").unlink()
    elif case == "damaged":  # one byte of a record in a rolled segment of partition 1
        d = tmp_path / "logs" / "t-1"
        with open(d / f"{0:020d}.log", "r+b") as f:
            f.seek(70)
            byte = f.read(1)
            f.seek(70)
            f.write(bytes([byte[0] ^ 0xFF]))
    before = {
        p: sorted(os.listdir(broker_dir / p)) if (broker_dir / p).is_dir() else (broker_dir / p).read_bytes()
        for p in os.listdir(broker_dir)
    }
    holder = None
    if case == "locked":  # Kafka's lock: a POSIX (fcntl) lock on <log.dir>/.lock, held by another process
        holder = subprocess.Popen(
            [
                "python",
                "-c",
                "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.lockf(f, fcntl.LOCK_EX); "
                "print('locked', flush=True); sys.stdin.read()",
                str(broker_dir / ".lock"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline().strip() == "locked"
        before[".lock"] = b""
    try:
        rc, out, err = _run_cli(*argv)
    finally:
        if holder is not None:
            holder.stdin.close()
            holder.wait()
    assert rc == 1 and err.startswith("kafkalog: error: ") and message in err and len(err.splitlines()) == 1, err
    after = {
        p: sorted(os.listdir(broker_dir / p)) if (broker_dir / p).is_dir() else (broker_dir / p).read_bytes()
        for p in os.listdir(broker_dir)
    }
    # every name, dotfiles included: a `.lock` the export created is gone again, one that was there stays
    assert after == before


def test_an_object_store_root_is_read_through_the_engine(tmp_path):
    """Immutable segment objects (one per append, on fsspec's memory store here) come out as Kafka segments
    named by their base offsets, with Kafka's indexes."""
    import uuid

    import fsspec

    from storage.export import export_topic
    from storage.objects.object_store import ObjectStoreFileSystem
    from tests.helpers.kafka_reference import kafka_recovery_entries, kp_batch, kp_parse

    lm = LogManager(f"/obj-{uuid.uuid4().hex}", fs=ObjectStoreFileSystem(fsspec.filesystem("memory")))
    lm.create_topic("t", 1, {"index.interval.bytes": "100"})
    with lm.open_log(TopicPartition("t", 0), writable=True) as log:
        for i in range(5):
            log.append(kp_batch([(T0 + 10 * i + j, b"k", b"v%d" % j, []) for j in range(4)], codec="zstd"))
            log.append(kp_batch([(T0 + 10 * i + 5, None, b"x" * 200, [])]))
    result = export_topic(lm, "t", str(tmp_path / "staging"), topic_id=TOPIC_ID)
    assert [p.segments for p in result.partitions] == [10]
    d = tmp_path / "staging" / "t-0"
    bases = _segment_bases(d)
    with lm.open_log(TopicPartition("t", 0)) as log:
        assert bases == [s.base_offset for s in log.segments]
    for base in bases:
        batches = kp_parse((d / f"{base:020d}.log").read_bytes())
        offsets, times, (max_ts, max_off) = kafka_recovery_entries(batches, 100, base)
        assert (d / f"{base:020d}.index").read_bytes() == offsets
        final = struct.pack(">qi", max_ts, max_off - base)  # the max-timestamp entry a roll appends
        assert (d / f"{base:020d}.timeindex").read_bytes() in (times, times + final)
        assert batches[0]["base_offset"] == base and all(b["crc_ok"] for b in batches)
    assert kafkalog_records(str(tmp_path / "staging"), "t") == {0: kafkalog_records(lm, "t")[0]}


def test_a_broker_holding_some_partitions_gets_those_and_is_told_of_the_others(tmp_path):
    root = _small_root(tmp_path)
    broker_dir = _fake_broker_dir(tmp_path / "kafka")
    shutil.rmtree(broker_dir / "t-1")  # another broker (or another of its log.dirs) holds partition 1
    rc, out, err = _run_cli("export-to-broker", root, "--topic", "t", "--to", str(broker_dir))
    assert rc == 0, err
    assert [line.split(":")[0] for line in out.splitlines()[:-1]] == ["t-0"]
    assert "Partition(s) 1 have no directory in this log dir and were not exported here" in out.splitlines()[-1]
    assert sorted(n for n in os.listdir(broker_dir) if n.startswith("t-")) == ["t-0"]
