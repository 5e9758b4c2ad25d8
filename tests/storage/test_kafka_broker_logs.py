"""Broker -> kafkalog (issue 22, part 2): kafkalog reads what a real Kafka broker wrote, as Kafka's own clients do.

Every scenario is written once per module and Kafka version (4.4.0, 3.9.1) by Kafka's Java producer on its KRaft broker
(tests/helpers/kafka_scenarios.py): all five codecs, null keys, null and empty values, headers with null values,
explicit and backwards timestamps, LogAppendTime, idempotent and transactional producers (committed and aborted),
segment rolls with an index entry per batch, two compacted topics after the broker's cleaner ran twice (tombstones
kept with their delete horizon, or removed past it), and deleteRecords. The broker's log dir is then read as
kafkalog's ROOT, first while the broker runs (`live`) and again after a clean SIGTERM stop (`stopped`), through
LogManager, the `kafkalog` CLI (consume, dump-log, describe) and Spark (live: a batch read and a readStream; stopped:
a batch read from a timestamp), and held to:

- Kafka's consumer (read_uncommitted: aborted data returned, control records never): record for record;
- Kafka's offsetsForTimes for many timestamps per partition;
- ListOffsets earliest/latest (the log start after deleteRecords, the log end);
- Kafka's DumpLogSegments over the same files.

Kafka's ListOffsets by timestamp counts transaction markers (they carry the broker's clock), so some answers here are
a marker's offset; tests/storage/test_log.py holds that rule with no broker.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import kafka_scenarios as S

pytestmark = pytest.mark.kafka

TIMESTAMP_TYPES = {"CreateTime": 0, "LogAppendTime": 1}
ONE_TIMESTAMP = S.ONE_TIMESTAMP  # the stopped phase's startingTimestamp: asked of offsetsForTimes for every topic


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def scenario(kafka_broker_session) -> S.Scenario:
    return S.build(kafka_broker_session.ensure_running())


@pytest.fixture(scope="module", params=["live", "stopped"])
def phase(request) -> str:
    """Module-scoped, so pytest runs every `live` test before the broker is stopped for the `stopped` ones."""
    return request.param


@pytest.fixture
def logs(scenario, phase) -> S.Scenario:
    """The scenario, with the broker running (live) or cleanly stopped (stopped), whatever ran before."""
    broker = scenario.broker
    if phase == "live" and not broker.running:
        broker.start()
    elif phase == "stopped" and broker.running:
        broker.stop()
    return scenario


def kafkalog(*argv: str) -> tuple[int, str, str]:
    """The `kafkalog` command, in process."""
    from kafkalog_ds.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv), stdin=io.BytesIO())
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- records, normalized


def kafka_row(topic: str, r: dict) -> tuple:
    """(topic, partition, offset, timestamp, timestampType, key, value, headers) of a Kafka consumer record."""
    return (
        topic,
        r["partition"],
        r["offset"],
        r["timestamp"],
        TIMESTAMP_TYPES[r["timestampType"]],
        r["key"],
        r["value"],
        tuple((k, v) for k, v in r["headers"]),
    )


def expected_rows(sc: S.Scenario, topics=None, starts: dict | None = None) -> list[tuple]:
    """The consumer's records; with `starts` {(topic, partition): offset or None} only those at or after it."""
    out = []
    for topic in topics or sc.topics:
        for r in sc.records[topic]:
            if starts is not None:
                start = starts[(topic, r["partition"])]
                if start is None or r["offset"] < start:
                    continue
            out.append(kafka_row(topic, r))
    return out


def arrow_rows(topic: str, partition: int, batch) -> list[tuple]:
    d = batch.to_pydict()
    return [
        (
            topic,
            partition,
            d["offset"][i],
            d["timestamp"][i],
            d["timestampType"][i],
            d["key"][i],
            d["value"][i],
            tuple((h["key"], h["value"]) for h in (d["headers"][i] or ())),
        )
        for i in range(batch.num_rows)
    ]


def cli_rows(stdout: str) -> list[tuple]:
    """`kafkalog consume` lines: text fields as UTF-8, those named in `base64` decoded."""
    out = []
    for line in stdout.splitlines():
        r = json.loads(line)
        b64 = set(r.get("base64", ()))

        def field(v, name, b64=b64):
            return None if v is None else base64.b64decode(v) if name in b64 else v.encode()

        out.append(
            (
                r["topic"],
                r["partition"],
                r["offset"],
                r["timestamp"],
                TIMESTAMP_TYPES[r["timestampType"]],
                field(r["key"], "key"),
                field(r["value"], "value"),
                tuple((k, field(v, f"headers.{j}")) for j, (k, v) in enumerate(r["headers"])),
            )
        )
    return out


def spark_rows(rows) -> list[tuple]:
    def b(v):
        return None if v is None else bytes(v)

    return [
        (
            r["topic"],
            r["partition"],
            r["offset"],
            r["ts"],
            r["timestampType"],
            b(r["key"]),
            b(r["value"]),
            tuple((h["key"], b(h["value"])) for h in (r["headers"] or ())),
        )
        for r in rows
    ]


FIELDS = ("timestamp", "timestampType", "key", "value", "headers")


def short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def record_differences(expected: list[tuple], got: list[tuple]) -> list[str]:
    """Every difference between two record lists, keyed by (topic, partition, offset); [] when equal."""
    exp = {r[:3]: r for r in expected}
    have: dict[tuple, tuple] = {}
    out = []
    for r in got:
        if r[:3] in have:
            out.append(f"{r[:3]}: returned twice")
        have[r[:3]] = r
    for k in sorted(exp.keys() - have.keys()):
        out.append(f"{k}: missing (Kafka's consumer returns it, timestamp {exp[k][3]}, key {short(exp[k][5])})")
    for k in sorted(have.keys() - exp.keys()):
        out.append(f"{k}: extra, Kafka's consumer does not return it (timestamp {have[k][3]}, key {short(have[k][5])})")
    for k in sorted(exp.keys() & have.keys()):
        for name, a, b in zip(FIELDS, exp[k][3:], have[k][3:], strict=False):
            if a != b:
                out.append(f"{k}: {name} {short(b)}, Kafka's consumer says {short(a)}")
    if len(expected) != len(exp):
        out.append("the expected records repeat an offset (a broken scenario)")
    return out


def assert_same_records(expected: list[tuple], got: list[tuple], what: str) -> None:
    assert expected, f"{what}: nothing expected (a broken scenario)"
    if not what.startswith("spark"):  # what Spark collects comes in no particular order
        out_of_order = [(a[:3], b[:3]) for a, b in zip(got, got[1:], strict=False) if a[:2] == b[:2] and b[2] <= a[2]]
        assert not out_of_order, f"{what}: offsets out of order within a partition: {out_of_order[:5]}"
    diffs = record_differences(expected, got)
    assert not diffs, f"{what}: {len(diffs)} difference(s) from Kafka's consumer:\n" + "\n".join(diffs[:25])


def control_offsets(sc: S.Scenario, topic: str, partition: int) -> set[int]:
    """Offsets in [log start, log end) that the consumer skipped in a topic nobody compacted: control records."""
    if topic in (S.KEPT_TOPIC, S.PURGED_TOPIC):
        return set()
    data = {r["offset"] for r in sc.records[topic] if r["partition"] == partition}
    return set(range(sc.earliest[(topic, partition)], sc.latest[(topic, partition)])) - data


# ---------------------------------------------------------------- the scenario itself (Kafka's own view)


def batch_fields(dump: str) -> list[dict]:
    """DumpLogSegments' batch lines as {field: value} (values as printed)."""
    out = []
    for line in dump.splitlines():
        if line.startswith("baseOffset: "):
            toks = line.split()
            out.append({toks[i].rstrip(":"): toks[i + 1] for i in range(0, len(toks) - 1, 2)})
    return out


def batches_of(sc: S.Scenario, dump: dict[str, str], topic: str, partition: int) -> list[dict]:
    d = f"{topic}-{partition}"
    return [b for f in sc.files if Path(f).parent.name == d and f.endswith(".log") for b in batch_fields(dump[f])]


def test_the_scenario_is_what_it_claims(scenario):
    """Checked on Kafka's own outputs (consumer, DumpLogSegments), so that the comparisons below mean something."""
    sc = scenario
    dump = sc.kafka_dump
    # every codec, really compressing: same records, far fewer bytes than the uncompressed partition
    sizes = {}
    for p, codec in enumerate(S.CODECS):
        batches = batches_of(sc, dump, S.CODEC_TOPIC, p)
        assert len(batches) >= 10 and {b["compresscodec"] for b in batches} == {codec}, (codec, batches[:2])
        assert {b["producerId"] for b in batches} == {"-1"}  # not idempotent
        sizes[codec] = sum(int(b["size"]) for b in batches)
        assert len(S.live_bases(sc.log_dir / f"{S.CODEC_TOPIC}-{p}")) >= 2, f"{codec}: no segment roll"
    assert all(sizes[c] < 0.6 * sizes["none"] for c in S.CODECS[1:]), sizes
    # keys, values, headers of every shape reached the log
    recs = sc.records[S.CODEC_TOPIC]
    assert any(r["key"] is None for r in recs) and any(r["value"] is None for r in recs)
    assert any(r["value"] == b"" for r in recs) and any(r["key"] and r["key"][0] == 0xFF for r in recs)
    assert any(("nullable", None) in r["headers"] for r in recs) and any(r["headers"] == [] for r in recs)
    # timestamps go backwards within a partition
    ts = [r["timestamp"] for r in recs if r["partition"] == 0]
    assert any(b < a for a, b in zip(ts, ts[1:], strict=False))
    # idempotent: two producer ids with sequences; many segments, an index entry per batch
    for p in range(2):
        batches = batches_of(sc, dump, S.IDEMPOTENT_TOPIC, p)
        assert len({b["producerId"] for b in batches}) == 2 and all(int(b["producerId"]) >= 0 for b in batches)
        assert all(int(b["baseSequence"]) >= 0 for b in batches)
        assert len(S.live_bases(sc.log_dir / f"{S.IDEMPOTENT_TOPIC}-{p}")) >= 4
        entries = sum(
            dump[f].count("\noffset: ") for f in sc.files if f"/{S.IDEMPOTENT_TOPIC}-{p}/" in f and f.endswith(".index")
        )
        assert entries >= 20, entries
    # LogAppendTime: the batch attribute, and the consumer sees the broker's clock
    for p in range(2):
        assert {b.get("LogAppendTime") is not None for b in batches_of(sc, dump, S.APPEND_TIME_TOPIC, p)} == {True}
    assert {r["timestampType"] for r in sc.records[S.APPEND_TIME_TOPIC]} == {"LogAppendTime"}
    assert min(r["timestamp"] for r in sc.records[S.APPEND_TIME_TOPIC]) > S.BASE_TS + 10**9
    # transactions: aborted data is in what read_uncommitted returns, the markers are not; a .txnindex has entries
    txn = sc.records[S.TXN_TOPIC]
    assert any(r["value"] and b"abort" in r["value"] for r in txn)
    assert any(r["value"] and b"commit" in r["value"] for r in txn)
    markers = [b for p in range(2) for b in batches_of(sc, dump, S.TXN_TOPIC, p) if b["isControl"] == "true"]
    assert len(markers) == 12 and all(b["isTransactional"] == "true" for b in markers)
    assert sum(dump[f].count("producerId:") for f in sc.files if f.endswith(".txnindex")) == 5  # 3 aborts, 5 partitions
    # compaction: keys overwritten; the tombstones of k3 and k7 kept in cleaned batches that carry a delete horizon,
    # or, past that horizon at the second cleaning, gone
    kept = sc.records[S.KEPT_TOPIC]
    assert sorted(r["key"] for r in kept if r["value"] is None) == [b"k3", b"k7"]
    assert [b for b in batches_of(sc, dump, S.KEPT_TOPIC, 0) if b["deleteHorizonMs"] != "OptionalLong.empty"]
    purged = sc.records[S.PURGED_TOPIC]
    assert [r["offset"] for r in purged] == [r["offset"] for r in kept if r["value"] is not None]
    for topic, recs in ((S.KEPT_TOPIC, kept), (S.PURGED_TOPIC, purged)):
        assert len({r["key"] for r in recs}) == len(recs), f"{topic}: a key overwritten but not compacted"
        assert sc.latest[(topic, 0)] - len(recs) >= 20, f"{topic}: not compacted"
        # two rolls, then the second cleaning merged the two cleaned segments into one
        assert len(S.live_bases(sc.log_dir / f"{topic}-0")) == 2, f"{topic}: rolls not where the scenario put them"
    # deleteRecords: inside a batch (partition 0) and at a segment's base (partition 1); segments below are gone
    for p, lw in S.LOW_WATERMARKS.items():
        assert sc.earliest[(S.DELETED_TOPIC, p)] == lw
        bases = S.live_bases(sc.log_dir / f"{S.DELETED_TOPIC}-{p}")
        assert bases[0] > 0 and (bases[0] == lw) == (p == 1), bases
    inside = [b for b in batches_of(sc, dump, S.DELETED_TOPIC, 0) if int(b["baseOffset"]) < 37 <= int(b["lastOffset"])]
    assert inside, "the low watermark of partition 0 is not inside a batch"
    assert S.read_checkpoint(sc.log_dir / "log-start-offset-checkpoint").get((S.DELETED_TOPIC, 0)) == 37


# ---------------------------------------------------------------- LogManager / Log


def test_log_manager_reads_what_kafkas_consumer_returns(logs, phase):
    from storage.log_manager import LogManager
    from storage.topic_partition import TopicPartition

    lm = LogManager(str(logs.log_dir))
    assert set(logs.topics) <= set(lm.topics()) and S.TRIGGER_TOPIC not in lm.topics()  # a deleted topic is gone
    got = []
    offsets = []
    with lm.snapshot():
        for topic, n in logs.topics.items():
            for p in range(n):
                with lm.open_log(TopicPartition(topic, p)) as log:
                    offsets.append(((topic, p), log.log_start_offset, log.log_end_offset))
                    for batch in log.read_records(log.log_start_offset):
                        got += arrow_rows(topic, p, batch)
    assert offsets == [(tp, logs.earliest[tp], logs.latest[tp]) for tp, _, _ in offsets], (
        "log start / end offsets differ from ListOffsets earliest / latest"
    )
    assert_same_records(expected_rows(logs), got, f"LogManager read ({phase})")


def test_timestamp_lookups_match_offsets_for_times(logs, phase):
    """Log.offset_for_timestamp against the consumer's offsetsForTimes: before the first record, exact hits, between
    records, after the last, timestamps that went backwards, LogAppendTime, compacted and truncated logs."""
    from storage.log_manager import LogManager
    from storage.topic_partition import TopicPartition

    lm = LogManager(str(logs.log_dir))
    wrong, markers, asked = [], 0, 0
    with lm.snapshot():
        for topic, n in logs.topics.items():
            for p in range(n):
                controls = control_offsets(logs, topic, p)
                with lm.open_log(TopicPartition(topic, p)) as log:
                    for t in logs.queries[topic]:
                        want = logs.offsets_for_times[(topic, t)][p]
                        got = log.offset_for_timestamp(t)
                        asked += 1
                        markers += want in controls
                        if got != want:
                            wrong.append(f"{topic}-{p} T={t}: kafkalog {got}, Kafka {want}")
    assert asked >= 300 and markers >= 10  # Kafka answers a transaction marker's offset for some of them
    assert not wrong, f"{len(wrong)} of {asked} lookups differ ({phase}):\n" + "\n".join(wrong[:25])


# ---------------------------------------------------------------- the CLI


def test_cli_consume_prints_what_kafkas_consumer_returns(logs, phase):
    got = []
    for topic in logs.topics:
        rc, out, err = kafkalog("consume", str(logs.log_dir), "--topic", topic)
        assert rc == 0, err
        got += cli_rows(out)
    assert_same_records(expected_rows(logs), got, f"kafkalog consume ({phase})")


def test_cli_consume_by_timestamp_starts_where_kafka_does(logs, phase):
    """`kafkalog consume --timestamp T` prints, per partition, what Kafka's consumer returns from offsetsForTimes(T)."""
    wrong, asked = [], 0
    for topic, n in logs.topics.items():
        qs = logs.queries[topic]
        for t in sorted({qs[0], qs[len(qs) // 3], qs[len(qs) // 2], qs[-2], ONE_TIMESTAMP}):
            starts = {(topic, p): logs.offsets_for_times[(topic, t)][p] for p in range(n)}
            rc, out, err = kafkalog("consume", str(logs.log_dir), "--topic", topic, "--timestamp", str(t))
            assert rc == 0, err
            got = cli_rows(out)
            for p in range(n):
                asked += 1
                diffs = record_differences(
                    [r for r in expected_rows(logs, [topic], starts) if r[1] == p], [r for r in got if r[1] == p]
                )
                if diffs:
                    wrong.append(f"{topic}-{p} --timestamp {t} (Kafka starts at {starts[(topic, p)]}): {diffs[0]}")
    assert not wrong, f"{len(wrong)} of {asked} partitions differ ({phase}):\n" + "\n".join(wrong[:20])


REPORT_HEADER = re.compile(
    r"^(Mismatches in :|Found timestamp mismatch in :|Found out of order timestamp in :|"
    r"The following indexed offsets are not found in|Non-consecutive offsets in )(.*)$"
)


def dump_report(stderr: str) -> Counter:
    """DumpLogSegments' end-of-run report as a multiset of (kind, file, entry). The `not found` header names the file
    in Kafka 4.4 (`... not found in :<file>`) and not in kafkalog (`... not found in the log.`, Kafka 3's words), so
    those entries are compared without their file. Kafka 4.4 also reports `-1 is followed by N` for every segment
    whose first offset N is not 0 (its lastOffset starts at -1), which no log makes non-consecutive; those are left
    out."""
    out: Counter = Counter()
    kind = file = None
    for line in stderr.splitlines():
        m = REPORT_HEADER.match(line)
        if m:
            kind, file = m.group(1), m.group(2)
            if kind.startswith("The following"):
                file = None
            continue
        if kind is None or re.match(r"^\s*-1 is followed by ", line):
            continue
        out[(kind, file, line.strip())] += 1
    return out


def test_dump_log_matches_kafkas_dump_log_segments(logs, phase):
    """Every .log (batch lines, and with --print-data-log a line per record with its key and payload), .index,
    .timeindex and .txnindex file of the topics, line for line, and the index checks' report on stderr."""
    files = [f for f in logs.files if os.path.exists(f)]
    assert len(files) == len(logs.files), "a segment file went away"
    if phase == "live":  # dumped by build() while the broker ran; a clean stop trims the indexes: dump them again
        theirs, kafka_err = logs.kafka_dump, logs.kafka_dump_err
    else:
        kafka_out, kafka_err = S.dump_log_segments(logs.broker, files, S.DUMP_FLAG)
        theirs = S.split_dump(kafka_out)
    rc, out, err = kafkalog("dump-log", S.DUMP_FLAG, "--files", ",".join(files))
    assert rc == 0, err
    ours = S.split_dump(out)
    assert list(theirs) == files, "DumpLogSegments did not dump every file"
    differ = [f for f in files if theirs[f] != ours.get(f)]
    detail = []
    for f in differ[:3]:
        a, b = theirs[f].splitlines(), ours.get(f, "").splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        detail.append(
            f"{f} line {first}:\n  Kafka:    {a[first] if first < len(a) else '(end)'}\n"
            f"  kafkalog: {b[first] if first < len(b) else '(end)'}"
        )
    assert not differ, f"{len(differ)} of {len(files)} files dump differently ({phase}):\n" + "\n".join(detail)
    text = "".join(theirs.values())
    assert sum(len(batch_fields(t)) for t in theirs.values()) > 200  # the batch lines were compared
    assert text.count("| offset: ") > 900 and "endTxnMarker: ABORT" in text  # and the record lines
    assert "payload: " in text and "\ufffd" in text  # binary keys print as replacement characters
    assert dump_report(err) == dump_report(kafka_err), f"Kafka:\n{kafka_err}\nkafkalog:\n{err}"


def test_describe_matches_the_broker(logs, phase):
    """describe's log start/end offsets against ListOffsets, its segments and sizes against the files, each segment's
    largest timestamp against the batches' max timestamps DumpLogSegments prints; the broker's own topics too (the
    KRaft metadata log, the transaction log), not other modules' topics, which share this broker."""
    internal = ["__cluster_metadata", "__transaction_state"]
    rc, out, err = kafkalog(
        "describe", str(logs.log_dir), "--json", *(a for t in [*logs.topics, *internal] for a in ("--topic", t))
    )
    assert rc == 0, err
    doc = json.loads(out)
    by_topic = {t["topic"]: t for t in doc["topics"]}
    assert set(by_topic) == {*logs.topics, *internal}
    assert len(by_topic["__transaction_state"]["partitions"]) == 50
    rc, listed, err = kafkalog("topics", str(logs.log_dir), "--list")
    assert rc == 0 and set(logs.topics) <= set(listed.split()) and S.TRIGGER_TOPIC not in listed.split(), err
    dump = logs.kafka_dump
    for topic, n in logs.topics.items():
        assert [p["partition"] for p in by_topic[topic]["partitions"]] == list(range(n))
        for part in by_topic[topic]["partitions"]:
            tp = (topic, part["partition"])
            d = logs.log_dir / f"{topic}-{part['partition']}"
            assert (part["logStartOffset"], part["logEndOffset"]) == (logs.earliest[tp], logs.latest[tp]), tp
            bases = S.live_bases(d)
            sizes = {b: (d / f"{b:020d}.log").stat().st_size for b in bases}
            # describe leaves out empty segments other than the active one (the cleaner leaves some)
            want = [b for b in bases if sizes[b] or b == bases[-1]]
            assert [s["baseOffset"] for s in part["segments"]] == want, tp
            assert [s["size"] for s in part["segments"]] == [sizes[b] for b in want], tp
            assert part["size"] == sum(sizes.values()), tp
            for s in part["segments"]:
                batches = batch_fields(dump[str(d / f"{s['baseOffset']:020d}.log")])
                largest = max((int(b.get("CreateTime", b.get("LogAppendTime"))) for b in batches), default=-1)
                assert s["largestTimestamp"] == largest, (tp, s)
    rc, text, err = kafkalog("describe", str(logs.log_dir), *(a for t in logs.topics for a in ("--topic", t)))
    assert rc == 0, err
    rows = [line.split() for line in text.splitlines()[3 : 3 + sum(logs.topics.values())]]
    assert sorted((r[0], int(r[1]), int(r[2]), int(r[3])) for r in rows) == sorted(
        (t, p, logs.earliest[(t, p)], logs.latest[(t, p)]) for t, n in logs.topics.items() for p in range(n)
    )
    if phase == "stopped":  # a clean stop trims the active segments' preallocated indexes
        assert all(os.path.getsize(f) < 10 << 20 for f in logs.files)


# ---------------------------------------------------------------- Spark


SPARK_COLUMNS = [
    "topic",
    "partition",
    "offset",
    "unix_millis(timestamp) AS ts",
    "timestampType",
    "key",
    "value",
    "headers",
]


def live_stream_timestamps(sc: S.Scenario) -> dict[tuple[str, int], int]:
    """A different starting timestamp per partition, taken from those asked of offsetsForTimes; the first codec
    partition's is after its last record (it starts at its end), the second's before its first."""
    out = {
        (topic, p): sc.queries[topic][(7 * p + 3 * len(topic)) % len(sc.queries[topic])]
        for topic, n in sc.topics.items()
        for p in range(n)
    }
    out[(S.CODEC_TOPIC, 0)], out[(S.CODEC_TOPIC, 1)] = sc.queries[S.CODEC_TOPIC][-1], 0
    return out


def assert_same_from_timestamps(sc: S.Scenario, timestamps: dict, got: list[tuple], what: str) -> None:
    """`got` holds, per partition, the consumer's records from offsetsForTimes(its timestamp) on (none where Kafka
    finds no record at or after it: startingOffsetsByTimestampStrategy=latest)."""
    starts = {tp: sc.offsets_for_times[(tp[0], t)][tp[1]] for tp, t in timestamps.items()}
    assert {s is None for s in starts.values()} == {True, False}  # some partitions start at their end
    assert_same_records(expected_rows(sc, starts=starts), got, what)


@pytest.mark.spark
def test_spark_reads_match_kafka(logs, phase, spark_session, tmp_path):
    """Live: spark.read of every topic from earliest (subscribePattern), then spark.readStream (Trigger.AvailableNow
    into a memory sink) from a different timestamp per partition (startingOffsetsByTimestamp). Stopped: spark.read
    from one timestamp for all partitions (startingTimestamp), and spark.readStream from earliest. Four Spark queries
    in all: they cost the most here."""

    def reader(r):
        return (
            r.format("kafkalog")
            .option("subscribePattern", S.PATTERN)
            .option("includeHeaders", "true")
            .option("startingOffsetsByTimestampStrategy", "latest")
        )

    def stream(r, name):
        q = (
            r.load(root)
            .selectExpr(*SPARK_COLUMNS)
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination()
            assert q.exception() is None, q.exception()
            return spark_rows(spark_session.table(name).collect())
        finally:
            q.stop()

    root = str(logs.log_dir)
    if phase == "stopped":
        rows = (
            reader(spark_session.read)
            .option("startingTimestamp", str(ONE_TIMESTAMP))
            .load(root)
            .selectExpr(*SPARK_COLUMNS)
            .collect()
        )
        assert_same_from_timestamps(
            logs,
            {tp: ONE_TIMESTAMP for tp in logs.earliest},
            spark_rows(rows),
            "spark.read, startingTimestamp (stopped)",
        )
        got = stream(reader(spark_session.readStream).option("startingOffsets", "earliest"), "b2k_stream_stopped")
        assert_same_records(expected_rows(logs), got, "spark.readStream, earliest (stopped)")
        return
    rows = reader(spark_session.read).load(root).selectExpr(*SPARK_COLUMNS).collect()
    assert_same_records(expected_rows(logs), spark_rows(rows), "spark.read (live)")

    timestamps = live_stream_timestamps(logs)
    by_topic: dict = {}
    for (topic, p), t in timestamps.items():
        by_topic.setdefault(topic, {})[str(p)] = t
    got = stream(
        reader(spark_session.readStream).option("startingOffsetsByTimestamp", json.dumps(by_topic)), "b2k_stream"
    )
    assert_same_from_timestamps(logs, timestamps, got, "spark.readStream, startingOffsetsByTimestamp (live)")
