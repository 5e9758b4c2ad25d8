"""format("kafka") and format("kafkalog") side by side, on the same records.

One module-scoped setup puts the same records in a real Kafka broker (Kafka's own producer, explicit
partitions and timestamps) and in a kafkalog ROOT (`df.write.format("kafkalog")` with the same partition and
timestamp columns), so offsets, keys, values, headers and timestamps agree; then removes the same records
from both: delete-records on one topic (the broker's DeleteRecords, LogManager.delete_records), retention on
another (retention.ms on the topic; the broker's retention thread, a kafkalog retention pass).

Every documented source option and sink rule then runs with both formats, with the same options (the
connector gets `kafka.bootstrap.servers`, kafkalog `path` as well; each ignores the other's): rows, schemas
with nullability, and what fails, where (load() / the action / the stream) and with which words. Where the
two differ on purpose, the test says so and why (docs/spark.md, "Coming from format('kafka')", lists them).

Cheap on purpose: one setup for the module; each batch case is one small job per format (a union of them
costs more: each connector task pays for a consumer); the stream cases that read run as ONE query per format
over a union of their sources, grouped by a `case` column; most errors fail at planning, and the connector's
waits (offset-fetch retries, fetch.max.wait.ms, a poll past the log end) are cut by its own options, which
kafkalog ignores. Observed with pyspark 4.3.0 and the connector spark-sql-kafka-0-10_2.13 4.2.0 (the newest
Maven Central serves), Kafka 4.4.0.

Set KAFKALOG_SIDE_BY_SIDE_REPORT=<file> to get a table of every case and what each format did.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import re
import time
import uuid
from dataclasses import dataclass

import pytest

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers import open_transaction as OT
from tools.realkafka.broker import b64, unb64

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

T0 = 1_700_000_000_000  # the records' CreateTime (2023)
P = f"sbs{uuid.uuid4().hex[:6]}-"  # the session broker is shared: our topics carry a prefix of their own
EV, EVX, CUT, AGED, RULES, REUSE = P + "ev", P + "evx", P + "cut", P + "aged", P + "rules", P + "reuse"
PARTS, PER = 3, 8  # EV: 3 partitions of 8 records
# The connector retries a failed offset lookup 3 times, 1 s apart (KafkaOffsetReaderAdmin.withRetries): once is
# enough here; and its consumers' fetches wait up to fetch.max.wait.ms (500 ms) at a partition's end, which
# makes each of its tasks here cost 0.5 s. kafkalog accepts and ignores all three, as documented.
COMMON = {"fetchOffset.numRetries": "1", "fetchOffset.retryIntervalMs": "10", "kafka.fetch.max.wait.ms": "10"}
# A read past the log end waits for the connector's consumer poll (kafkaConsumer.pollTimeoutMs, default
# spark.network.timeout: 120 s) before it fails or, with failOnDataLoss=false, gives up: 3 s here.
PAST_END = {"kafkaConsumer.pollTimeoutMs": "3000"}
HEADERS_DDL = "array<struct<key:string,value:binary>>"
COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
REPORT: list[tuple[str, str, str, str]] = []  # (area, case, kafka, kafkalog)


def ev_records() -> list[dict]:
    """3 x 8 records: keys (every 4th null), a tombstone, headers (a null header value) on even offsets."""
    out = []
    for p in range(PARTS):
        for i in range(PER):
            n = p * 100 + i
            out.append(
                dict(
                    partition=p,
                    timestamp=T0 + 1000 * i + p,
                    key=None if i % 4 == 3 else f"k{n}".encode(),
                    value=None if i == 5 else f"value-{n}".encode(),
                    headers=[("h", f"v{n}".encode()), ("n", None)] if i % 2 == 0 else [],
                )
            )
    return out


def simple(topic_partitions: dict, ts) -> list[dict]:
    """`count` keyed records per partition, timestamps from ts(i)."""
    return [
        dict(partition=p, timestamp=ts(i), key=f"k{i}".encode(), value=f"{p}-{i}".encode(), headers=[])
        for p, count in topic_partitions.items()
        for i in range(count)
    ]


def sends(records: list[dict]) -> list[dict]:
    return [
        {
            "send": {
                "partition": r["partition"],
                "key": b64(r["key"]),
                "value": b64(r["value"]),
                "timestamp": r["timestamp"],
                "headers": [[k, b64(v)] for k, v in r["headers"]],
            }
        }
        for r in records
    ]


@dataclass
class Outcome:
    """What one format did: the rows, or where it failed (load / start / run) and the error."""

    rows: object = None
    stage: str | None = None
    error: BaseException | None = None

    @property
    def text(self) -> str:
        return "" if self.error is None else str(self.error)

    def gist(self) -> str:
        if self.error is None:
            return f"{len(self.rows)} rows" if isinstance(self.rows, list) else "ok"
        lines = [ln.strip() for ln in self.text.splitlines() if ln.strip()]
        # the line that says what went wrong: a Python error raised by kafkalog, the connector's exception
        key = next((ln for ln in lines if re.match(r"[\w.]+(Error|Exception): ", ln) and "Py4J" not in ln), None)
        key = key or next((ln for ln in lines if not ln.startswith(("File ", "at ", "Traceback", "An error"))), "")
        return f"{type(self.error).__name__} at {self.stage}: {key[:200]}"


class Sides:
    """The broker and the ROOT holding the same records, and one way to run a read or write on each."""

    def __init__(self, spark, broker, root: str, tmp):
        self.spark, self.broker, self.root, self.tmp = spark, broker, root, tmp

    def reader(self, fmt: str, stream: bool, opts: dict):
        r = (self.spark.readStream if stream else self.spark.read).format(fmt)
        r = r.option("kafka.bootstrap.servers", self.broker.bootstrap).options(**COMMON).options(**opts)
        return r.load(self.root) if fmt == "kafkalog" else r.load()

    def read(self, fmt: str, opts: dict) -> Outcome:
        try:
            df = self.reader(fmt, False, opts)
        except Exception as e:
            return Outcome(stage="load", error=e)
        try:
            return Outcome(rows=df.collect())
        except Exception as e:
            return Outcome(stage="run", error=e)

    def stream(self, fmt: str, df_or_opts, **trigger) -> tuple[Outcome, object]:
        """Run a streaming read to a memory table (Trigger.AvailableNow unless told otherwise) to its end."""
        name = f"sbs_{uuid.uuid4().hex[:10]}"
        try:
            df = self.reader(fmt, True, df_or_opts) if isinstance(df_or_opts, dict) else df_or_opts
        except Exception as e:
            return Outcome(stage="load", error=e), None
        try:
            q = (
                df.writeStream.format("memory")
                .queryName(name)
                .option("checkpointLocation", str(self.tmp / "ckpt" / name))
                .trigger(**(trigger or {"availableNow": True}))
                .start()
            )
        except Exception as e:
            return Outcome(stage="start", error=e), None
        try:
            q.awaitTermination(300)  # a guard against a hang; AvailableNow ends by itself
            assert not q.isActive, "the AvailableNow query did not end"
        except AssertionError:
            q.stop()
            raise
        except Exception as e:
            return Outcome(stage="run", error=e), q
        return Outcome(rows=self.spark.table(name).collect()), q

    def write(self, fmt: str, df, mode: str | None = "append", stream: bool = False, **opts) -> Outcome:
        w = df.writeStream if stream else df.write
        w = w.format(fmt).option("kafka.bootstrap.servers", self.broker.bootstrap).options(**opts)
        try:
            if stream:
                q = (
                    w.option("checkpointLocation", str(self.tmp / "wckpt" / uuid.uuid4().hex))
                    .trigger(availableNow=True)
                    .start(**({"path": self.root} if fmt == "kafkalog" else {}))
                )
            else:
                if mode:
                    w = w.mode(mode)
                w.save(**({"path": self.root} if fmt == "kafkalog" else {}))
                return Outcome(rows="ok")
        except Exception as e:
            return Outcome(stage="save" if not stream else "start", error=e)
        try:
            q.awaitTermination(300)
            assert not q.isActive, "the AvailableNow query did not end"
        except AssertionError:
            q.stop()
            raise
        except Exception as e:
            return Outcome(stage="run", error=e)
        return Outcome(rows="ok")


@pytest.fixture(scope="module")
def sides(kafka_broker_session, spark_session, tmp_path_factory):
    broker = kafka_broker_session.ensure_running()
    tmp = tmp_path_factory.mktemp("side-by-side")
    root = str(tmp / "logs")
    now = int(time.time() * 1000)
    ev = [dict(r, topic=EV) for r in ev_records()]
    evx = [dict(r, topic=EVX) for r in simple({0: 4}, lambda i: T0 + 500 * i)]
    cut = [dict(r, topic=CUT) for r in simple({0: 8, 1: 8}, lambda i: T0 + i)]
    aged_old = [dict(r, topic=AGED) for r in simple({0: 6}, lambda i: T0 + i)]
    aged_new = [
        dict(r, topic=AGED, key=f"k{i + 6}".encode(), value=f"0-{i + 6}".encode())
        for i, r in enumerate(simple({0: 4}, lambda i: now + i))
    ]
    reuse = [dict(r, topic=REUSE) for r in simple({0: 2}, lambda i: T0 + i)]  # its partition 1 stays empty
    small = {"internal.segment.bytes": "100"}  # Kafka 4 refuses segment.bytes < 1 MiB; this one it takes
    # the broker: Kafka's producer. The aged topic gets one record per batch (a flush after each: the broker
    # refuses a batch larger than a segment), so each batch is a segment and retention removes the old ones.
    one_by_one = [step for r in sends(aged_old + aged_new) for step in (r, {"flush": 1})]
    done = broker.tool(
        *[
            {"op": "createTopic", "topic": t, "partitions": n, "configs": c}
            for t, n, c in (
                (EV, PARTS, {}),
                (EVX, 1, {}),
                (CUT, 2, {}),
                (AGED, 1, small),
                (RULES, 2, {}),
                (REUSE, 2, {}),
            )
        ],
        {"op": "produce", "topic": EV, "config": {"linger.ms": "5"}, "steps": sends(ev)},
        {"op": "produce", "topic": EVX, "steps": sends(evx)},
        {"op": "produce", "topic": CUT, "steps": sends(cut)},
        {"op": "produce", "topic": AGED, "steps": one_by_one},
        {"op": "produce", "topic": REUSE, "steps": sends(reuse)},
        {"op": "deleteRecords", "topic": CUT, "offsets": {"0": 3}},
        {"op": "alterConfigs", "topic": AGED, "set": {"retention.ms": "3600000"}},
    )
    sent = [m for result in done[6:11] for m in result]
    assert len(sent) == len(ev + evx + cut + aged_old + aged_new + reuse) and not [m for m in sent if "error" in m]
    # kafkalog: the same records through its sink, with the same partition and timestamp columns
    lm = LogManager(root)
    for t, n, c in (
        (EV, PARTS, {}),
        (EVX, 1, {}),
        (CUT, 2, {}),
        (AGED, 1, {"segment.bytes": "100"}),
        (RULES, 2, {}),
        (REUSE, 2, {}),
    ):
        lm.create_topic(t, n, c)
    schema = f"topic string, partition int, timestamp long, key binary, value binary, headers {HEADERS_DDL}"

    def kafkalog_write(records):
        rows = [(r["topic"], r["partition"], r["timestamp"], r["key"], r["value"], r["headers"]) for r in records]
        # the broker's side is written by a plain (non-transactional) producer: so is this side, with no
        # COMMIT markers, so that both topics hold the same records at the same offsets
        spark_session.createDataFrame(rows, schema).coalesce(1).write.format("kafkalog").mode("append").option(
            "transactional", "false"
        ).save(root)

    kafkalog_write(ev + evx + cut + aged_old + reuse)
    kafkalog_write(aged_new)
    assert lm.delete_records(TopicPartition(CUT, 0), 3) == 3
    lm.alter_topic_config(AGED, {"retention.ms": "3600000"})
    assert [r.log_start_offset for r in lm.retention_pass([AGED])] == [6]
    # the broker's retention thread runs every second: wait until it has removed the same records
    deadline = time.monotonic() + 120
    while (
        broker.tool({"op": "listOffsets", "topic": AGED, "partitions": [0], "spec": "earliest"})[0]["0"]["offset"] != 6
    ):
        assert time.monotonic() < deadline, "the broker's retention did not move the aged topic's log start to 6"
        time.sleep(0.2)
    assert broker.tool({"op": "listOffsets", "topic": CUT, "partitions": [0, 1], "spec": "earliest"})[0] == {
        "0": {"offset": 3, "timestamp": -1},
        "1": {"offset": 0, "timestamp": -1},
    }
    sides = Sides(spark_session, broker, root, tmp)
    sides.kafkalog_write = kafkalog_write
    yield sides
    path = os.environ.get("KAFKALOG_SIDE_BY_SIDE_REPORT")
    if path:
        with open(path, "w") as f:
            f.write("| area | case | format('kafka') | format('kafkalog') |\n| --- | --- | --- | --- |\n")
            for row in REPORT:
                f.write("| " + " | ".join(c.replace("|", "/") for c in row) + " |\n")


def wait_for_rows(spark, query, name: str, bound_s: float = 900.0) -> int:
    """Poll a running query's memory table until it holds rows; fail (not hang) if the query dies. The bound
    only turns a hang into a failure: it is far beyond any run, busy or not."""
    deadline = time.monotonic() + bound_s
    while True:
        if not query.isActive:
            raise AssertionError(f"the query ended before delivering rows: {query.exception()}")
        n = spark.table(name).count()
        if n:
            return n
        assert time.monotonic() < deadline, f"no rows after {bound_s} s: {query.status}"
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def _broker_log(kafka_broker):
    """Every test here uses the broker (started again if another test stopped it); a failure quotes its log."""
    return kafka_broker


def by_case(rows) -> dict:
    """{case: [row tuple sorted by topic, partition, offset]}; timestamps compared as they come."""
    out: dict = {}
    for r in rows:
        d = r.asDict(recursive=True)
        out.setdefault(d.pop("case"), []).append(tuple(d[c] for c in (*COLUMNS, "headers")))
    return {k: sorted(v, key=lambda t: (t[2], t[3], t[4])) for k, v in out.items()}


def tagged_rows(rows, case: str) -> list:
    """Rows of one read, with the `case` field by_case() groups by (headers null when not read)."""
    from pyspark.sql import Row

    return [
        Row(case=case, headers=None, **r.asDict()) if "headers" not in r else Row(case=case, **r.asDict()) for r in rows
    ]


def tagged(df, case: str):
    from pyspark.sql import functions as F

    headers = F.col("headers") if "headers" in df.columns else F.lit(None).cast(HEADERS_DDL).alias("headers")
    return df.select(F.lit(case).alias("case"), *COLUMNS, headers)


def expected_offsets(rows) -> list:
    return [(r[2], r[3], r[4]) for r in rows]


# ---------------------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("stream", [False, True], ids=["batch", "stream"])
@pytest.mark.parametrize("headers", ["false", "true"])
def test_the_schema_with_nullability_is_the_connectors(sides, stream, headers):
    kafka = sides.reader("kafka", stream, {"subscribe": EV, "includeHeaders": headers}).schema
    kafkalog = sides.reader("kafkalog", stream, {"subscribe": EV, "includeHeaders": headers}).schema
    assert kafkalog == kafka  # StructType equality compares names, types and nullability, headers' elements too
    assert all(f.nullable for f in kafka.fields)
    REPORT.append(("schema", f"{'stream' if stream else 'batch'}, includeHeaders={headers}", "same", "same"))


# ---------------------------------------------------------------------------------------------- batch reads


def batch_cases() -> dict:
    aged2 = json.dumps({AGED: {"0": 2}})
    return {
        "subscribe (default earliest..latest)": {"subscribe": EV},
        "includeHeaders": {"subscribe": EV, "includeHeaders": "true"},
        "subscribe two topics": {"subscribe": f"{EV},{EVX}"},
        "subscribePattern": {"subscribePattern": f"^{re.escape(P)}ev"},
        "subscribePattern matching nothing": {"subscribePattern": f"^{re.escape(P)}zzz"},
        "assign": {"assign": json.dumps({EV: [0, 2]})},
        "assign a partition the topic lacks": {"assign": json.dumps({EV: [1, 7]})},
        "startingOffsets/endingOffsets earliest/latest": {
            "subscribe": EV,
            "startingOffsets": "earliest",
            "endingOffsets": "latest",
        },
        "offsets JSON, -2/-1 and explicit": {
            "subscribe": EV,
            "startingOffsets": json.dumps({EV: {"0": 2, "1": -2, "2": 5}}),
            "endingOffsets": json.dumps({EV: {"0": 4, "1": -1, "2": 6}}),
        },
        "startingTimestamp/endingTimestamp": {
            "subscribe": EV,
            "startingTimestamp": str(T0 + 3000),
            "endingTimestamp": str(T0 + 6000),
        },
        "startingTimestamp between records": {"subscribe": EV, "startingTimestamp": str(T0 + 3001)},
        "endingTimestamp past the end": {"subscribe": EV, "endingTimestamp": str(T0 + 99_000)},
        "ByTimestamp start and end": {
            "subscribe": EV,
            "startingOffsetsByTimestamp": json.dumps({EV: {"0": T0 + 2000, "1": T0, "2": T0 + 4002}}),
            "endingOffsetsByTimestamp": json.dumps({EV: {"0": T0 + 6000, "1": T0 + 2, "2": T0 + 99_000}}),
        },
        "startingTimestamp after the end, strategy latest": {
            "subscribe": EV,
            "startingTimestamp": str(T0 + 99_000),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        "ByTimestamp, one after the end, strategy latest": {
            "subscribe": EV,
            "startingOffsetsByTimestampStrategy": "latest",
            "startingOffsetsByTimestamp": json.dumps({EV: {"0": T0 + 2000, "1": T0, "2": T0 + 9000}}),
        },
        "earliest after retention and delete-records": {"subscribePattern": f"^{re.escape(P)}(cut|aged)$"},
        "delete-records, failOnDataLoss=false": {
            "subscribe": CUT,
            "failOnDataLoss": "false",
            "startingOffsets": json.dumps({CUT: {"0": 0, "1": 0}}),
        },
        "retention, failOnDataLoss=false": {"subscribe": AGED, "startingOffsets": aged2, "failOnDataLoss": "false"},
        "range wholly removed by retention, failOnDataLoss=false": {
            "subscribe": AGED,
            "startingOffsets": aged2,
            "endingOffsets": json.dumps({AGED: {"0": 4}}),
            "failOnDataLoss": "false",
        },
        "endingOffsets beyond the log end, failOnDataLoss=false": {
            "subscribe": EV,
            "endingOffsets": json.dumps({EV: {"0": 20, "1": -1, "2": -1}}),
            "failOnDataLoss": "false",
            **PAST_END,
        },
        "minPartitions=6": {"subscribe": EV, "minPartitions": "6"},
        "maxRecordsPerPartition=3": {"subscribe": EV, "maxRecordsPerPartition": "3"},
        "stream-only options (ignored, with a warning)": {
            "subscribe": EVX,
            "maxOffsetsPerTrigger": "1",
            "minOffsetsPerTrigger": "1",
            "maxTriggerDelay": "1s",
        },
        "kafka.group.id (ignored)": {"subscribe": EVX, "kafka.group.id": "g"},
        "a misspelled option (ignored; kafkalog warns)": {"subscribe": EVX, "startingOffset": "latest"},
    }


# what each case must read: (topic, partition, offset) triples, so that a case that reads the same wrong
# records with both formats still fails
def ev_offsets(ranges: dict) -> list:
    return [(EV, p, o) for p in sorted(ranges) for o in range(*ranges[p])]


BATCH_EXPECTED = {
    "subscribe (default earliest..latest)": ev_offsets({0: (0, 8), 1: (0, 8), 2: (0, 8)}),
    "subscribe two topics": ev_offsets({0: (0, 8), 1: (0, 8), 2: (0, 8)}) + [(EVX, 0, o) for o in range(4)],
    "subscribePattern matching nothing": [],
    "assign": ev_offsets({0: (0, 8), 2: (0, 8)}),
    "assign a partition the topic lacks": ev_offsets({1: (0, 8)}),
    "offsets JSON, -2/-1 and explicit": ev_offsets({0: (2, 4), 1: (0, 8), 2: (5, 6)}),
    "startingTimestamp/endingTimestamp": ev_offsets({0: (3, 6), 1: (3, 6), 2: (3, 6)}),
    "startingTimestamp between records": ev_offsets({0: (4, 8), 1: (3, 8), 2: (3, 8)}),
    "ByTimestamp start and end": ev_offsets({0: (2, 6), 1: (0, 1), 2: (4, 8)}),
    "startingTimestamp after the end, strategy latest": [],
    "ByTimestamp, one after the end, strategy latest": ev_offsets({0: (2, 8), 1: (0, 8)}),
    "earliest after retention and delete-records": [(AGED, 0, o) for o in range(6, 10)]
    + [(CUT, 0, o) for o in range(3, 8)]
    + [(CUT, 1, o) for o in range(8)],
    "delete-records, failOnDataLoss=false": [(CUT, 0, o) for o in range(3, 8)] + [(CUT, 1, o) for o in range(8)],
    "retention, failOnDataLoss=false": [(AGED, 0, o) for o in range(6, 10)],
    "range wholly removed by retention, failOnDataLoss=false": [],
    "endingOffsets beyond the log end, failOnDataLoss=false": ev_offsets({0: (0, 8), 1: (0, 8), 2: (0, 8)}),
    "a misspelled option (ignored; kafkalog warns)": [(EVX, 0, o) for o in range(4)],
}


@pytest.mark.parametrize("case", list(batch_cases()))
def test_a_batch_read_gives_the_same_rows(sides, case):
    """Each batch case that reads: the same rows with both, every column (a union of all cases in one job
    costs more than these small jobs, and would hide which case differs)."""
    opts = batch_cases()[case]
    out = {fmt: sides.read(fmt, opts) for fmt in ("kafka", "kafkalog")}
    assert out["kafka"].error is None and out["kafkalog"].error is None, (out["kafka"].gist(), out["kafkalog"].gist())
    kafka, kafkalog = (
        by_case(tagged_rows(out[fmt].rows, case))[case] if out[fmt].rows else [] for fmt in ("kafka", "kafkalog")
    )
    REPORT.append(("batch read", case, f"{len(kafka)} rows", "same rows" if kafkalog == kafka else "DIFFERENT"))
    assert kafkalog == kafka, "kafkalog read other rows than the connector"
    if case in BATCH_EXPECTED:
        assert expected_offsets(kafka) == BATCH_EXPECTED[case]
    if case == "includeHeaders":
        headers = {(r[4], r[3]): r[7] for r in kafka}
        assert headers[(0, 0)] == [{"key": "h", "value": b"v0"}, {"key": "n", "value": None}]
        assert headers[(1, 0)] is None  # a record without headers: null, not an empty list, with both
    if case == "subscribe (default earliest..latest)":
        tombstones = [r for r in kafka if r[1] is None]
        assert len(tombstones) == PARTS and all(r[0] is not None for r in tombstones)


def test_how_a_read_is_split_into_tasks(sides):
    """Same rows (above); the task counts differ. The connector cuts offset ranges anywhere; kafkalog cuts at
    the batch and index boundaries it can seek to (each of ev's partitions is one record batch here), and
    cuts by maxRecordsPerPartition alone, where the 4.2.0 connector's batch read applies it only when
    minPartitions already splits (KafkaOffsetReaderAdmin.getOffsetRangesFromUnresolvedOffsets)."""
    counts = {}
    for opts in ({}, {"minPartitions": "6"}, {"maxRecordsPerPartition": "3"}, {"minPartitions": "2"}):
        counts[json.dumps(opts)] = {
            fmt: sides.reader(fmt, False, {"subscribe": EV, **opts}).rdd.getNumPartitions()
            for fmt in ("kafka", "kafkalog")
        }
        REPORT.append(
            (
                "batch tasks",
                f"{opts or 'no option'}",
                str(counts[json.dumps(opts)]["kafka"]),
                str(counts[json.dumps(opts)]["kafkalog"]),
            )
        )
    assert counts == {
        "{}": {"kafka": 3, "kafkalog": 3},
        '{"minPartitions": "6"}': {"kafka": 6, "kafkalog": 3},
        '{"maxRecordsPerPartition": "3"}': {"kafka": 3, "kafkalog": 9},
        '{"minPartitions": "2"}': {"kafka": 3, "kafkalog": 3},
    }


# (options, where the connector fails, a regex of its error, where kafkalog fails, a regex of its error)
BATCH_ERRORS = {
    "no subscribe, subscribePattern or assign": (
        {},
        "load",
        "One of the following options must be specified for Kafka source",
        # kafkalog's schema() cannot tell a read from a write, so this check waits for the reader
        "run",
        "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be set",
    ),
    "both subscribe and assign": (
        {"subscribe": EV, "assign": json.dumps({EV: [0]})},
        "load",
        "Only one of the following options",
        "load",
        "exactly one of .* \\(got subscribe, assign\\)",
    ),
    "subscribe empty": (
        {"subscribe": " , "},
        "load",
        "No topics to subscribe to",
        "load",
        "option 'subscribe' names no topic",
    ),
    "assign not a JSON object": (
        {"assign": "[1]"},
        "load",
        "No topicpartitions to assign",
        "load",
        "option 'assign' must look like",
    ),
    "subscribePattern not a regex": ({"subscribePattern": "("}, "load", "Unclosed group", "load", "not a valid regex"),
    "startingOffsets not JSON": (
        {"subscribe": EV, "startingOffsets": "{nope"},
        "load",
        "Expected e.g. ",
        "load",
        "'startingOffsets' is not valid JSON",
    ),
    "startingOffsets with a string offset": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": "x"}})},
        "load",
        "Expected e.g. ",
        "load",
        "is not partition -> integer",
    ),
    "startingOffsets latest": (
        {"subscribe": EV, "startingOffsets": "latest"},
        "load",
        "starting offset can't be latest for batch queries",
        "run",
        "'latest' is not allowed for a batch query's start",
    ),
    "endingOffsets earliest": (
        {"subscribe": EV, "endingOffsets": "earliest"},
        "load",
        "ending offset can't be earliest for batch queries",
        "load",
        "'earliest' is not allowed for the end of a range",
    ),
    "startingOffsets JSON -1": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": -1, "1": -2, "2": -2}})},
        "load",
        "can't be latest for batch queries",
        "run",
        "offset -1 for .*ev-0 is not allowed",
    ),
    "endingOffsets JSON -2": (
        {"subscribe": EV, "endingOffsets": json.dumps({EV: {"0": -2, "1": -1, "2": -1}})},
        "load",
        "can't be earliest for batch queries",
        "load",
        "offset -2 for .*ev-0 is not allowed",
    ),
    "startingOffsets JSON missing a partition": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": 2, "1": -2}})},
        "run",
        "Partitions specified for Kafka start offsets don't match what are assigned",
        "run",
        "'startingOffsets' must give every partition the query reads, and no other; missing: .*ev-2",
    ),
    "startingOffsets JSON naming a partition not read": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": 0, "1": 0, "2": 0, "5": 0}})},
        "run",
        "Partitions specified for Kafka start offsets don't match what are assigned",
        "run",
        "not read by the query: .*ev-5",
    ),
    "endingOffsets JSON missing a partition": (
        {"subscribe": EV, "endingOffsets": json.dumps({EV: {"0": 2, "1": -1}})},
        "run",
        "don't match what are assigned",
        "run",
        "'endingOffsets' must give every partition",
    ),
    "start after end (JSON)": (
        {
            "subscribe": EV,
            "startingOffsets": json.dumps({EV: {"0": 5, "1": -2, "2": -2}}),
            "endingOffsets": json.dumps({EV: {"0": 3, "1": -1, "2": -1}}),
        },
        "load",
        "The specified start offset 5 is greater than the end offset 3",
        "run",
        "ev-0: starting offset 5 is after ending offset 3",
    ),
    "start after the log end": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": 20, "1": -2, "2": -2}}), "failOnDataLoss": "false"},
        "run",
        "The resolved start offset 20 is greater than the resolved end offset 8",
        "run",
        "ev-0: starting offset 20 is after ending offset 8",
    ),
    "start timestamp after end timestamp": (
        {
            "subscribe": EV,
            "startingOffsetsByTimestamp": json.dumps({EV: {"0": T0 + 5000, "1": T0, "2": T0}}),
            "endingOffsetsByTimestamp": json.dumps({EV: {"0": T0 + 2000, "1": T0 + 1, "2": T0 + 9000}}),
        },
        "load",
        "The specified start timestamp .* is greater than the end timestamp",
        "run",
        "ev-0: starting offset 5 is after ending offset 2",
    ),
    "startingTimestamp not a number": (
        {"subscribe": EV, "startingTimestamp": "abc"},
        "load",
        "Expected a single long value, got abc",
        "load",
        "'startingTimestamp' must be milliseconds since the epoch",
    ),
    "startingTimestamp after the end, strategy error": (
        {"subscribe": EV, "startingTimestamp": str(T0 + 99_000)},
        "run",
        "No offset matched from request of topic-partition .*ev-\\d and timestamp",
        "run",
        "no record at or after timestamp .* in .*ev-\\d.*startingOffsetsByTimestampStrategy=latest",
    ),
    "ByTimestamp missing a partition": (
        {"subscribe": EV, "startingOffsetsByTimestamp": json.dumps({EV: {"0": T0, "1": T0}})},
        "run",
        "Partitions specified for Kafka timestamp based start offsets don't match",
        "run",
        "'startingOffsetsByTimestamp' must give every partition .*missing: .*ev-2",
    ),
    "startingOffsetsByTimestampStrategy unknown": (
        {"subscribe": EV, "startingOffsetsByTimestampStrategy": "bogus"},
        "load",
        "No value found for 'BOGUS'",
        "load",
        "must be 'error' or 'latest'",
    ),
    "failOnDataLoss not a boolean": (
        {"subscribe": EV, "failOnDataLoss": "maybe"},
        "load",
        'For input string: "maybe"',
        "load",
        "'failOnDataLoss' must be true or false",
    ),
    "includeHeaders not a boolean": (
        {"subscribe": EV, "includeHeaders": "maybe"},
        "load",
        'For input string: "maybe"',
        "load",
        "'includeHeaders' must be true or false",
    ),
    "minPartitions 0": (
        {"subscribe": EV, "minPartitions": "0"},
        "load",
        "minPartitions must be positive",
        "load",
        "'minPartitions' must be an integer >= 1",
    ),
    "maxRecordsPerPartition 0": (
        {"subscribe": EV, "maxRecordsPerPartition": "0"},
        "load",
        "maxrecordsperpartition must be positive",
        "load",
        "'maxRecordsPerPartition' must be an integer >= 1",
    ),
    "minOffsetsPerTrigger above maxOffsetsPerTrigger": (
        {"subscribe": EV, "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "2"},
        "load",
        "minOffsetPerTrigger\\(9\\) is higher than the maxOffsetsPerTrigger\\(2\\)",
        "load",
        "minOffsetsPerTrigger\\(9\\) is higher than the maxOffsetsPerTrigger\\(2\\)",
    ),
    "kafka.auto.offset.reset": (
        {"subscribe": EV, "kafka.auto.offset.reset": "earliest"},
        "load",
        "Kafka option 'auto.offset.reset' is not supported",
        "load",
        "Kafka option 'auto.offset.reset' is not supported",
    ),
    "kafka.value.deserializer": (
        {"subscribe": EV, "kafka.value.deserializer": "x"},
        "load",
        "'value.deserializer' is not supported as values are deserialized",
        "load",
        "'value.deserializer' is not supported as values are deserialized",
    ),
    "subscribe a topic that does not exist": (
        {"subscribe": P + "nope"},
        "run",
        "UnknownTopicOrPartitionException",
        "run",
        "topic\\(s\\) .*nope do not exist in .*topics there: .*ev",
    ),
    "subscribe two topics, one missing": (
        {"subscribe": f"{EV},{P}nope"},
        "run",
        "UnknownTopicOrPartitionException",
        "run",
        "topic\\(s\\) .*nope do not exist",
    ),
    "assign a topic that does not exist": (
        {"assign": json.dumps({P + "nope": [0]})},
        "run",
        "UnknownTopicOrPartitionException",
        "run",
        "topic\\(s\\) .*nope do not exist",
    ),
    "delete-records, failOnDataLoss=true": (
        {"subscribe": CUT, "startingOffsets": json.dumps({CUT: {"0": 0, "1": 0}})},
        "run",
        "Some data may have been lost because they are not available in Kafka any more",
        "run",
        "offsets 0..2 of .*cut-0 are gone \\(log start offset is now 3.*failOnDataLoss=false",
    ),
    "retention, failOnDataLoss=true": (
        {"subscribe": AGED, "startingOffsets": json.dumps({AGED: {"0": 2}})},
        "run",
        "Some data may have been lost because they are not available in Kafka any more",
        "run",
        "offsets 2..5 of .*aged-0 are gone \\(log start offset is now 6",
    ),
    "endingOffsets beyond the log end, failOnDataLoss=true": (
        {"subscribe": EV, "endingOffsets": json.dumps({EV: {"0": 20, "1": -1, "2": -1}}), **PAST_END},
        "run",
        "Some data may have been lost because they are not available in Kafka any more",
        "run",
        "ending offset 20 of .*ev-0 is beyond its log end offset 8",
    ),
}


@pytest.mark.parametrize("case", list(BATCH_ERRORS))
def test_a_bad_batch_read_fails_with_both(sides, case):
    opts, k_stage, k_words, l_stage, l_words = BATCH_ERRORS[case]
    kafka, kafkalog = sides.read("kafka", opts), sides.read("kafkalog", opts)
    REPORT.append(("batch error", case, kafka.gist(), kafkalog.gist()))
    assert (kafka.stage, kafkalog.stage) == (k_stage, l_stage), (kafka.gist(), kafkalog.gist())
    assert re.search(k_words, kafka.text), kafka.gist()
    assert re.search(l_words, kafkalog.text), kafkalog.gist()
    # pyspark hands the connector's option errors over as IllegalArgumentException and a Python data
    # source's as AnalysisException (planning) or a wrapped PythonException (tasks): the words are the thing
    if l_stage == "load":
        assert type(kafkalog.error).__name__ == "AnalysisException"


def test_a_user_schema_and_continuous_processing_differ(sides):
    """Inherent differences, by a run: a user-specified schema selects columns in kafkalog, where the
    connector refuses any schema but its own on a stream and any other on a batch read; continuous
    processing runs with the connector and is refused by Spark for a Python data source."""
    got = {}
    for fmt in ("kafka", "kafkalog"):
        for stream in (False, True):
            r = (sides.spark.readStream if stream else sides.spark.read).format(fmt).schema("value binary, offset long")
            r = r.option("kafka.bootstrap.servers", sides.broker.bootstrap).option("subscribe", EVX)
            try:
                df = r.load(sides.root) if fmt == "kafkalog" else r.load()
                got[fmt, stream] = Outcome(rows=df.columns if stream else [tuple(x) for x in df.collect()])
            except Exception as e:
                got[fmt, stream] = Outcome(stage="load", error=e)
    for stream in (False, True):
        REPORT.append(
            (
                "schema",
                f"user-specified schema, {'stream' if stream else 'batch'}",
                got["kafka", stream].gist(),
                got["kafkalog", stream].gist(),
            )
        )
    assert re.search("USER_SPECIFIED_AND_ACTUAL_SCHEMA_MISMATCH", got["kafka", False].text)
    assert re.search("Kafka source has a fixed schema and cannot be set with a custom one", got["kafka", True].text)
    assert got["kafkalog", False].rows == [(f"0-{i}".encode(), i) for i in range(4)]
    assert got["kafkalog", True].rows == ["value", "offset"]
    cont = {}
    for fmt in ("kafka", "kafkalog"):
        name = f"sbs_{uuid.uuid4().hex[:10]}"
        try:
            q = (
                sides.reader(fmt, True, {"subscribe": EVX, "startingOffsets": "earliest"})
                .writeStream.format("memory")
                .queryName(name)
                .trigger(continuous="1 second")
                .start()
            )
        except Exception as e:
            cont[fmt] = Outcome(stage="start", error=e)
            continue
        # Stop only once the continuous job is running and has delivered rows: stop() issued while the
        # query is still starting can cancel its job group before the long-running job is submitted,
        # and then waits on that job for ever (a CI run hung here on a busy machine).
        try:
            rows = wait_for_rows(sides.spark, q, name)
        finally:
            q.stop()
        cont[fmt] = Outcome(rows=rows)
    REPORT.append(("stream read", "trigger(continuous=...)", cont["kafka"].gist(), cont["kafkalog"].gist()))
    assert cont["kafka"].error is None, cont["kafka"].gist()
    assert cont["kafka"].rows > 0
    assert re.search("Data source kafkalog does not support continuous processing", cont["kafkalog"].text)


def test_a_dataframe_queried_again(sides):
    """A DataFrame counted, then counted again after records were appended: the connector plans each action
    anew and sees them all; kafkalog's reused DataFrame (pyspark keeps its planned partitions) resolves
    earliest/latest when its tasks read, so it sees the new records of the partitions it planned, not
    those of a partition that was empty at planning, until load() is called again."""
    df = {fmt: sides.reader(fmt, False, {"subscribe": REUSE}) for fmt in ("kafka", "kafkalog")}
    first = {fmt: df[fmt].count() for fmt in df}
    added = [
        dict(r, key=b"k9", value=f"{r['partition']}-new".encode(), headers=[])
        for r in simple({0: 1, 1: 1}, lambda i: T0 + 100)
    ]
    sides.broker.tool({"op": "produce", "topic": REUSE, "steps": sends(added)})
    sides.kafkalog_write([dict(r, topic=REUSE) for r in added])
    again = {fmt: df[fmt].count() for fmt in df}
    fresh = {fmt: sides.reader(fmt, False, {"subscribe": REUSE}).count() for fmt in df}
    REPORT.append(
        (
            "batch read",
            "a DataFrame counted again after appends to a filled and an empty partition",
            f"{first['kafka']}, then {again['kafka']}",
            f"{first['kafkalog']}, then {again['kafkalog']} (a new load(): {fresh['kafkalog']})",
        )
    )
    assert first == {"kafka": 2, "kafkalog": 2}
    assert again == {"kafka": 4, "kafkalog": 3}
    assert fresh == {"kafka": 4, "kafkalog": 4}


# ---------------------------------------------------------------------------------------------- streams


def stream_cases() -> dict:
    return {
        "earliest, includeHeaders": {"subscribe": EV, "startingOffsets": "earliest", "includeHeaders": "true"},
        "latest (the default)": {"subscribe": EV},
        "offsets JSON, -2/-1 and explicit": {
            "subscribe": EV,
            "startingOffsets": json.dumps({EV: {"0": 2, "1": -2, "2": -1}}),
        },
        "startingTimestamp (endingTimestamp ignored)": {
            "subscribe": EV,
            "startingTimestamp": str(T0 + 3000),
            "endingTimestamp": str(T0 + 6000),
        },
        "startingOffsetsByTimestamp": {
            "subscribe": EV,
            "startingOffsetsByTimestamp": json.dumps({EV: {"0": T0 + 2000, "1": T0, "2": T0 + 7002}}),
        },
        "startingTimestamp after the end, strategy latest": {
            "subscribe": EV,
            "startingTimestamp": str(T0 + 99_000),
            "startingOffsetsByTimestampStrategy": "latest",
        },
        "subscribePattern": {"subscribePattern": f"^{re.escape(P)}ev", "startingOffsets": "earliest"},
        "subscribePattern matching nothing": {"subscribePattern": f"^{re.escape(P)}zzz", "startingOffsets": "earliest"},
        "assign a partition the topic lacks": {"assign": json.dumps({EV: [1, 7]}), "startingOffsets": "earliest"},
        "delete-records, failOnDataLoss=false": {
            "subscribe": CUT,
            "failOnDataLoss": "false",
            "startingOffsets": json.dumps({CUT: {"0": 0, "1": 0}}),
        },
        "retention, failOnDataLoss=false": {
            "subscribe": AGED,
            "failOnDataLoss": "false",
            "startingOffsets": json.dumps({AGED: {"0": 2}}),
        },
        "start beyond the log end, failOnDataLoss=false": {
            "subscribe": EV,
            "failOnDataLoss": "false",
            "startingOffsets": json.dumps({EV: {"0": 20, "1": -2, "2": -2}}),
        },
    }


STREAM_EXPECTED = {
    "earliest, includeHeaders": ev_offsets({0: (0, 8), 1: (0, 8), 2: (0, 8)}),
    "latest (the default)": [],
    "offsets JSON, -2/-1 and explicit": ev_offsets({0: (2, 8), 1: (0, 8)}),
    "startingTimestamp (endingTimestamp ignored)": ev_offsets({0: (3, 8), 1: (3, 8), 2: (3, 8)}),
    "startingTimestamp after the end, strategy latest": [],
    "subscribePattern matching nothing": [],
    "assign a partition the topic lacks": ev_offsets({1: (0, 8)}),
    "delete-records, failOnDataLoss=false": [(CUT, 0, o) for o in range(3, 8)] + [(CUT, 1, o) for o in range(8)],
    "retention, failOnDataLoss=false": [(AGED, 0, o) for o in range(6, 10)],
    "start beyond the log end, failOnDataLoss=false": ev_offsets({1: (0, 8), 2: (0, 8)}),
}


def test_stream_reads_give_the_same_rows(sides):
    """Every stream case that reads, as one query per format over a union of the sources, with
    Trigger.AvailableNow: the same rows, every column."""
    cases = stream_cases()
    got = {}
    for fmt in ("kafka", "kafkalog"):
        dfs = [tagged(sides.reader(fmt, True, opts), case) for case, opts in cases.items()]
        out, _ = sides.stream(fmt, functools.reduce(lambda a, b: a.unionByName(b), dfs))
        assert out.error is None, out.gist()
        got[fmt] = by_case(out.rows)
    for case in cases:
        kafka, kafkalog = got["kafka"].get(case, []), got["kafkalog"].get(case, [])
        REPORT.append(("stream read", case, f"{len(kafka)} rows", "same rows" if kafkalog == kafka else "DIFFERENT"))
        assert kafkalog == kafka, f"{case}: kafkalog read other rows than the connector"
        if case in STREAM_EXPECTED:
            assert expected_offsets(kafka) == STREAM_EXPECTED[case], case


@pytest.mark.parametrize("trigger", ["availableNow", "processingTime"])
def test_max_offsets_per_trigger_makes_the_same_micro_batches(sides, trigger):
    """maxOffsetsPerTrigger=10 over 3 partitions of 8: both split each trigger across partitions by lag."""
    opts = {"subscribe": EV, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "10"}
    batches = {}
    for fmt in ("kafka", "kafkalog"):
        if trigger == "availableNow":
            out, q = sides.stream(fmt, opts)
        else:  # a processing-time query, run until it has read everything there is
            name = f"sbs_{uuid.uuid4().hex[:10]}"
            q = (
                sides.reader(fmt, True, opts)
                .writeStream.format("memory")
                .queryName(name)
                .option("checkpointLocation", str(sides.tmp / "ckpt" / name))
                .trigger(processingTime="0 seconds")
                .start()
            )
            try:
                q.processAllAvailable()
                deadline = time.monotonic() + 120  # the last trigger's progress is reported just after it commits
                while sum(p["numInputRows"] for p in q.recentProgress) < PARTS * PER and time.monotonic() < deadline:
                    time.sleep(0.05)
            finally:
                q.stop()
            out = Outcome(rows=sides.spark.table(name).collect())
        assert out.error is None, out.gist()
        batches[fmt] = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
        assert len(out.rows) == PARTS * PER
    REPORT.append(
        (
            "stream read",
            f"maxOffsetsPerTrigger=10, {trigger}: rows per micro-batch",
            str(batches["kafka"]),
            str(batches["kafkalog"]),
        )
    )
    assert batches["kafkalog"] == batches["kafka"] == [9, 9, 6]


STREAM_ERRORS = {
    "endingOffsets on a stream": (
        # kafkalog's schema() does not know a stream from a batch read, so the stream refuses it when it starts
        {"subscribe": EV, "endingOffsets": "latest"},
        "load",
        "ending offset not valid in streaming queries",
        "run",
        "ending offset not valid in streaming queries",
    ),
    "subscribe a topic that does not exist": (
        {"subscribe": P + "nope", "startingOffsets": "earliest"},
        "run",
        "UnknownTopicOrPartitionException",
        "run",
        "topic\\(s\\) .*nope do not exist.*use subscribePattern",
    ),
    "startingTimestamp after the end, strategy error": (
        {"subscribe": EV, "startingTimestamp": str(T0 + 99_000)},
        "run",
        "No offset matched from request of topic-partition",
        "run",
        "no record at or after timestamp",
    ),
    "startingOffsets JSON missing a partition": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": 2, "1": -2}})},
        "run",
        "If startingOffsets contains specific offsets, you must specify all TopicPartitions",
        "run",
        "must give every partition the query reads, and no other; missing: .*ev-2",
    ),
    "delete-records, failOnDataLoss=true": (
        {"subscribe": CUT, "startingOffsets": json.dumps({CUT: {"0": 0, "1": 0}})},
        "run",
        "Some data may have been lost because they are not available in Kafka any more",
        "run",
        "offsets 0..2 of .*cut-0 are gone",
    ),
    "retention, failOnDataLoss=true": (
        {"subscribe": AGED, "startingOffsets": json.dumps({AGED: {"0": 2}})},
        "run",
        "Some data may have been lost because they are not available in Kafka any more",
        "run",
        "offsets 2..5 of .*aged-0 are gone",
    ),
    "start beyond the log end, failOnDataLoss=true": (
        {"subscribe": EV, "startingOffsets": json.dumps({EV: {"0": 20, "1": -2, "2": -2}})},
        "run",
        "the start offset is set beyond available offset",
        "run",
        "starting offset 20 is beyond its log end offset 8.*failOnDataLoss=false",
    ),
}


@pytest.mark.parametrize("case", list(STREAM_ERRORS))
def test_a_bad_stream_fails_with_both(sides, case):
    opts, k_stage, k_words, l_stage, l_words = STREAM_ERRORS[case]
    (kafka, _), (kafkalog, _) = sides.stream("kafka", opts), sides.stream("kafkalog", opts)
    REPORT.append(("stream error", case, kafka.gist(), kafkalog.gist()))
    assert (kafka.stage, kafkalog.stage) == (k_stage, l_stage), (kafka.gist(), kafkalog.gist())
    assert re.search(k_words, kafka.text, re.S), kafka.gist()
    assert re.search(l_words, kafkalog.text, re.S), kafkalog.gist()


# ---------------------------------------------------------------------------------------------- the sink


def sink_rows(sides, fmt: str, prefix: str) -> list:
    """What a format's own reader finds in the topics starting with `prefix`, sorted by topic, partition, offset."""
    df = sides.reader(fmt, False, {"subscribePattern": f"^{re.escape(prefix)}", "includeHeaders": "true"})
    rows = [r.asDict(recursive=True) for r in df.collect()]
    return sorted(rows, key=lambda r: (r["topic"], r["partition"], r["offset"]))


def create_topics(sides, topics: dict) -> None:
    sides.broker.tool(*[{"op": "createTopic", "topic": t, "partitions": n} for t, n in topics.items()])
    lm = LogManager(sides.root)
    for t, n in topics.items():
        lm.create_topic(t, n)


def test_the_sink_writes_the_same_records(sides):
    """The same DataFrames written with each format and read back with each one's reader: a topic column,
    explicit and hashed partitions (Kafka's murmur2 for keyed rows), headers with a null value, a tombstone;
    a topic option overrides the topic column and makes the topic when it is missing (the broker's
    auto-create, kafkalog's `partitions` default of 1). Differences, asserted: a `timestamp` column is
    written by kafkalog and ignored by the 4.2.0 connector (records get the producer's time); rows with
    neither key nor partition are spread by Kafka's sticky partitioner, by kafkalog round-robin, so they go
    to a topic of their own here (they would shift the offsets of the rows after them)."""
    spark = sides.spark
    pre = P + "out-"
    create_topics(sides, {pre + "a": 2, pre + "b": 3, pre + "loose": 3})
    ts = dt.datetime(2023, 5, 1, 12, 0, 0)
    rows = []
    for i in range(18):
        key = None if i % 4 == 3 or i >= 12 else f"key-{i}"
        partition = (i % 2) if i % 3 == 0 and i < 12 else None  # explicit for some, by key for the rest
        topic = pre + ("loose" if key is None and partition is None else "a" if i % 2 else "b")
        value = None if i == 4 else f"value-{i}"
        headers = [("h", f"{i}".encode()), ("null", None)] if i % 2 == 0 else None
        rows.append((topic, key, value, partition, headers, ts + dt.timedelta(seconds=i)))
    df = spark.createDataFrame(
        rows, f"topic string, key string, value string, partition int, headers {HEADERS_DDL}, timestamp timestamp"
    ).coalesce(1)
    other = spark.createDataFrame(
        [(pre + "ignored", f"k{i}", f"v{i}") for i in range(4)], "topic string, key string, value string"
    ).coalesce(1)
    before = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None) - dt.timedelta(minutes=1)
    for fmt in ("kafka", "kafkalog"):
        assert sides.write(fmt, df).error is None
        out = sides.write(fmt, other, topic=pre + "new")  # a topic option naming a topic neither has yet
        assert out.error is None, out.gist()
    got = {fmt: sink_rows(sides, fmt, pre) for fmt in ("kafka", "kafkalog")}
    assert pre + "ignored" not in LogManager(sides.root).topics()

    def fields(r, *names):
        return tuple(r[n] if not isinstance(r[n], list) else json.dumps(r[n], default=str) for n in names)

    for fmt in got:
        assert all(r["timestampType"] == 0 for r in got[fmt])
        assert {r["topic"] for r in got[fmt]} == {pre + "a", pre + "b", pre + "loose", pre + "new"}
    exact = ("topic", "partition", "offset", "key", "value", "headers")
    placed = {fmt: [fields(r, *exact) for r in got[fmt] if r["topic"] != pre + "loose"] for fmt in got}
    assert placed["kafkalog"] == placed["kafka"] and len(placed["kafka"]) == 10 + 4
    assert any(r[3] is None for r in placed["kafka"])  # a null key with an explicit partition is placed by both
    loose = {fmt: [r for r in got[fmt] if r["topic"] == pre + "loose"] for fmt in got}
    assert sorted(fields(r, "value", "headers") for r in loose["kafkalog"]) == sorted(
        fields(r, "value", "headers") for r in loose["kafka"]
    )
    spread = {fmt: [sum(r["partition"] == p for r in loose[fmt]) for p in range(3)] for fmt in got}
    assert sum(spread["kafkalog"]) == 8 and max(spread["kafkalog"]) - min(spread["kafkalog"]) <= 1  # round-robin
    # the timestamp column: kafkalog writes it, the 4.2.0 connector ignores it (the producer stamps the time)
    given = {f"value-{i}".encode(): ts + dt.timedelta(seconds=i) for i in range(18)}
    mine = [r for r in got["kafkalog"] if r["topic"] != pre + "new" and r["value"] is not None]
    assert mine and all(r["timestamp"] == given[r["value"]] for r in mine)
    theirs = [r for r in got["kafka"] if r["topic"] != pre + "new"]
    assert all(r["timestamp"] >= before for r in theirs)
    REPORT.extend(
        [
            ("sink", "keys, explicit partitions, headers, tombstone, topic column", "written", "same records"),
            ("sink", "topic option overrides the topic column; missing topic made", "written", "same records"),
            (
                "sink",
                "null key, no partition: rows per partition",
                f"{spread['kafka']} (sticky partitioner)",
                f"{spread['kafkalog']} (round-robin)",
            ),
            ("sink", "timestamp column", "ignored (the producer's time)", "written as CreateTime"),
        ]
    )


def test_a_streaming_write_writes_the_same_records_and_update_mode_differs(sides):
    """writeStream in append mode (Trigger.AvailableNow) writes the same records; outputMode('update') is
    taken by the connector and refused by Spark itself for a Python data source."""
    spark = sides.spark
    pre = P + "st-"
    create_topics(sides, {pre + "a": 2})
    src = sides.tmp / "stream-in"
    spark.createDataFrame(
        [(f"k{i}", f"v{i}", i % 2) for i in range(10)], "key string, value string, partition int"
    ).coalesce(1).write.json(str(src))
    for fmt in ("kafka", "kafkalog"):
        df = spark.readStream.schema("key string, value string, partition int").json(str(src))
        out = sides.write(fmt, df, stream=True, topic=pre + "a")
        assert out.error is None, out.gist()
    got = {
        fmt: [(r["partition"], r["offset"], r["key"], r["value"]) for r in sink_rows(sides, fmt, pre)]
        for fmt in ("kafka", "kafkalog")
    }
    assert got["kafkalog"] == got["kafka"] and len(got["kafka"]) == 10
    counts = (
        spark.readStream.schema("key string, value string, partition int")
        .json(str(src))
        .groupBy("partition")
        .count()
        .selectExpr("CAST(partition AS STRING) AS key", "CAST(count AS STRING) AS value")
    )
    outcome = {}
    for fmt in ("kafka", "kafkalog"):
        w = (
            counts.writeStream.format(fmt)
            .outputMode("update")
            .option("topic", pre + "a")
            .option("kafka.bootstrap.servers", sides.broker.bootstrap)
            .option("checkpointLocation", str(sides.tmp / "wckpt" / uuid.uuid4().hex))
            .trigger(availableNow=True)
        )
        try:
            q = w.start(sides.root) if fmt == "kafkalog" else w.start()
        except Exception as e:
            outcome[fmt] = Outcome(stage="start", error=e)
            continue
        try:
            q.awaitTermination(300)
            outcome[fmt] = Outcome(rows="ok")
        except Exception as e:
            outcome[fmt] = Outcome(stage="run", error=e)
    REPORT.extend(
        [
            ("sink", "writeStream append, AvailableNow", "written", "same records"),
            ("sink", "outputMode('update')", outcome["kafka"].gist(), outcome["kafkalog"].gist()),
        ]
    )
    assert outcome["kafka"].error is None, outcome["kafka"].gist()
    assert outcome["kafkalog"].stage == "run"  # Spark refuses it when the query runs: a Python data source
    assert re.search("kafkalog does not support Update mode", outcome["kafkalog"].text), outcome["kafkalog"].gist()


COMMIT_KEY = b"\x00\x00\x00\x01"  # a control record's key: version 0, type COMMIT (Kafka's EndTransactionMarker)


def test_a_streams_micro_batches_transaction_markers_and_timestamps(sides):
    """One stream of 3 micro-batches of 5 records (a file source, maxFilesPerTrigger=1), written by the
    connector, by kafkalog (default transactional=true) and by kafkalog with transactional=false, into a
    topic of one partition each: three queries in all. Differences, asserted (docs/spark.md, "Coming from
    format('kafka')"):
    - each kafkalog micro-batch ends with a COMMIT marker (a control batch, one offset): after the first
      micro-batch the connector's topic ends at 5 and kafkalog's at 6, offset 5 being the marker; each
      later micro-batch puts kafkalog's data one offset further from the connector's. transactional=false
      writes no markers: the connector's offsets exactly.
    - the `timestamp` column (of type timestamp here, as a stream carries it): kafkalog writes it as each
      record's CreateTime, the 4.2.0 connector ignores it (its producer stamps the time of the write).
    The connector's topic is read with Kafka's own consumer, kafkalog's through the log engine with control
    batches kept (no Spark job for either)."""
    spark = sides.spark
    pre = P + "mb-"
    txn, plain = pre + "txn", pre + "plain"
    create_topics(sides, {txn: 1, plain: 1})
    src = sides.tmp / "micro-batches-in"
    src.mkdir()
    batches, per = 3, 5
    given = {}  # value -> the input's timestamp (ms)
    for b in range(batches):
        lines = []
        for i in range(per):
            value, ms = f"b{b}-{i}", T0 + 1000 * b + i
            given[value.encode()] = ms
            lines.append(json.dumps({"key": f"k{i}", "value": value, "ts": ms}))
        f = src / f"b{b}.json"
        f.write_text("\n".join(lines) + "\n")
        os.utime(f, (1_700_000_000 + b, 1_700_000_000 + b))  # the file source takes the oldest first

    def stream():
        return (
            spark.readStream.schema("key string, value string, ts long")
            .option("maxFilesPerTrigger", 1)
            .json(str(src))
            .selectExpr("key", "value", "timestamp_millis(ts) AS timestamp")
        )

    before = int(time.time() * 1000) - 60_000
    for fmt, topic, opts in (
        ("kafka", txn, {}),
        ("kafkalog", txn, {}),
        ("kafkalog", plain, {"transactional": "false"}),
    ):
        out = sides.write(fmt, stream(), stream=True, topic=topic, **opts)
        assert out.error is None, out.gist()

    # the connector's topic, as Kafka's consumer and ListOffsets see it
    listed, consumed = sides.broker.tool(
        {"op": "listOffsets", "topic": txn, "partitions": [0], "spec": "latest"},
        {"op": "consume", "topic": txn},
    )
    kafka_end = listed["0"]["offset"]
    kafka = [(r["offset"], unb64(r["value"]), r["timestamp"], r["timestampType"]) for r in consumed]

    def engine(topic):
        """(log end offset, [(offset, key, value, timestamp)] of every record, control records included)."""
        with LogManager(sides.root).open_log(TopicPartition(topic, 0)) as log:
            rows = [
                r
                for b in log.read_records(log.log_start_offset, skip_control=False)
                for r in zip(*(b.column(c).to_pylist() for c in ("offset", "key", "value", "timestamp")), strict=True)
            ]
            return log.log_end_offset, rows

    txn_end, txn_rows = engine(txn)
    plain_end, plain_rows = engine(plain)
    markers = [r for r in txn_rows if r[1] == COMMIT_KEY]
    data = [r for r in txn_rows if r[1] != COMMIT_KEY]
    REPORT.extend(
        [
            (
                "sink",
                f"writeStream, {batches} micro-batches of {per} records: log end offset",
                f"{kafka_end} (no markers)",
                f"{txn_end} (a COMMIT marker at {[m[0] for m in markers]}); transactional=false: {plain_end}",
            ),
            ("sink", "writeStream, timestamp column", "ignored (the producer's time)", "written as CreateTime"),
        ]
    )
    # the connector: dense data offsets, the topic ending at 5 records a micro-batch
    assert kafka_end == batches * per
    assert [r[0] for r in kafka] == list(range(batches * per))
    # kafkalog's default: each micro-batch's data, then its COMMIT marker, one offset each
    assert txn_end == batches * (per + 1)
    assert [m[0] for m in markers] == [per + b * (per + 1) for b in range(batches)]  # 5, 11, 17
    assert len(txn_rows) == txn_end and [r[0] for r in txn_rows] == list(range(txn_end))
    # the same values in the same order; micro-batch b's data (values b<b>-<i>) sits b offsets after the
    # connector's: the drift grows by one offset per micro-batch
    assert [r[2] for r in data] == [r[1] for r in kafka]
    assert [r[0] - int(r[2].decode().split("-")[0][1:]) for r in data] == [r[0] for r in kafka]
    # transactional=false: no marker, the connector's offsets and log end
    assert plain_end == kafka_end and not [r for r in plain_rows if r[1] == COMMIT_KEY]
    assert [(r[0], r[2]) for r in plain_rows] == [(r[0], r[1]) for r in kafka]
    # the timestamp column: kept by kafkalog, the time of the write for the connector's records
    assert all(r[3] == given[r[2]] for r in data + plain_rows)
    assert all(r[2] >= before and r[3] == "CreateTime" for r in kafka), kafka[:2]


# (SQL of the input, options, save mode, (stage, regex) for the connector, (stage, regex) for kafkalog);
# a stage of None: the write succeeds
SINK_CASES = {
    "no value column": (
        "SELECT 'k' AS key",
        {"topic": "T"},
        "append",
        ("save", "Required attribute 'value' not found"),
        ("save", "needs a 'value' column"),
    ),
    "value of a wrong type": (
        "SELECT 1 AS value",
        {"topic": "T"},
        "append",
        ("save", "value attribute unsupported type int"),
        ("save", "column 'value' has type int; the kafkalog sink takes string or binary"),
    ),
    "key of a wrong type": (
        "SELECT 'v' AS value, 1 AS key",
        {"topic": "T"},
        "append",
        ("save", "key attribute unsupported type int"),
        ("save", "column 'key' has type int"),
    ),
    "no topic option or column": (
        "SELECT 'v' AS value",
        {},
        "append",
        ("save", "topic option required when no 'topic' attribute is present"),
        ("save", "no topic: set .option\\('topic', ...\\) or provide a 'topic' column"),
    ),
    "topic column of a wrong type": (
        "SELECT 'v' AS value, 5 AS topic",
        {},
        "append",
        ("save", "topic attribute unsupported type int"),
        ("save", "column 'topic' has type int"),
    ),
    "a null topic in the data": (
        "SELECT 'v' AS value, CAST(NULL AS STRING) AS topic",
        {},
        "append",
        ("save", "null topic"),
        ("save", "null topic and no 'topic' option"),
    ),
    "partition column of a wrong type": (
        "SELECT 'v' AS value, 'x' AS partition",
        {"topic": "T"},
        "append",
        ("save", "partition attribute unsupported type string"),
        ("save", "column 'partition' has type string"),
    ),
    "a partition the topic lacks": (
        "SELECT 'v' AS value, 7 AS partition",
        {"topic": "T", "kafka.max.block.ms": "1000"},
        "append",
        ("save", "Partition 7 of topic .* with partition count 2 is not present in metadata"),
        ("save", "partition 7 does not exist: topic '.*' has 2 partition"),
    ),
    "headers of a wrong type": (
        "SELECT 'v' AS value, 'h' AS headers",
        {"topic": "T"},
        "append",
        ("save", "headers attribute unsupported type string"),
        ("save", "column 'headers' has type string"),
    ),
    "headers with a non-string key": (
        "SELECT 'v' AS value, array(named_struct('key', 1, 'value', binary('b'))) AS headers",
        {"topic": "T"},
        "append",
        ("save", "headers attribute unsupported type"),
        ("save", "column 'headers' has type"),
    ),
    "kafka.key.serializer": (
        "SELECT 'v' AS value",
        {"topic": "T", "kafka.key.serializer": "x"},
        "append",
        ("save", "Kafka option 'key.serializer' is not supported as keys are serialized"),
        ("save", "Kafka option 'key.serializer' is not supported as keys are serialized"),
    ),
    "kafka.value.serializer": (
        "SELECT 'v' AS value",
        {"topic": "T", "kafka.value.serializer": "x"},
        "append",
        ("save", "'value.serializer' is not supported"),
        ("save", "'value.serializer' is not supported"),
    ),
    "an illegal topic name": (
        "SELECT 'v' AS value",
        {"topic": "bad topic!"},
        "append",
        ("save", "InvalidTopicException"),
        ("save", "Topic name 'bad topic!' is illegal"),
    ),
    "mode('overwrite')": (
        "SELECT 'v' AS value",
        {"topic": "T"},
        "overwrite",
        ("save", "Save mode Overwrite not allowed for Kafka"),
        ("save", "Save mode Overwrite not allowed for kafkalog"),
    ),
    "mode('ignore')": (
        "SELECT 'v' AS value",
        {"topic": "T"},
        "ignore",
        ("save", "Save mode Ignore not allowed for Kafka"),
        ("save", 'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"Ignore" mode'),
    ),
    # differences, on purpose or inherent
    "default mode (ErrorIfExists)": (
        "SELECT 'v' AS value",
        {"topic": "T"},
        None,
        (None, ""),
        ("save", 'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"ErrorIfExists" mode'),
    ),
    "partition column of type bigint": (
        "SELECT 'v' AS value, CAST(1 AS BIGINT) AS partition",
        {"topic": "T"},
        "append",
        ("save", "partition attribute unsupported type bigint"),
        (None, ""),
    ),
    "header values of type string": (
        "SELECT 'v' AS value, array(named_struct('key', 'a', 'value', 'b')) AS headers",
        {"topic": "T"},
        "append",
        ("save", "headers attribute unsupported type array<struct<key:string,value:string>>"),
        (None, ""),
    ),
    "timestamp column of a type kafkalog does not take": (
        "SELECT 'v' AS value, 'yesterday' AS timestamp",
        {"topic": "T"},
        "append",
        (None, ""),
        ("save", "column 'timestamp' has type string; the kafkalog sink takes timestamp"),
    ),
}


@pytest.mark.parametrize("case", list(SINK_CASES))
def test_the_sinks_column_and_option_rules(sides, case):
    sql, opts, mode, (k_stage, k_words), (l_stage, l_words) = SINK_CASES[case]
    opts = {k: (RULES if v == "T" else v) for k, v in opts.items()}
    df = sides.spark.sql(sql)
    kafka, kafkalog = sides.write("kafka", df, mode, **opts), sides.write("kafkalog", df, mode, **opts)
    REPORT.append(("sink rule", case, kafka.gist(), kafkalog.gist()))
    assert (kafka.stage, kafkalog.stage) == (k_stage, l_stage), (kafka.gist(), kafkalog.gist())
    assert re.search(k_words, kafka.text, re.S), kafka.gist()
    assert re.search(l_words, kafkalog.text, re.S), kafkalog.gist()


# ---------------------------------------------------------------------------------------------- read_committed

TXN = P + "txn"  # committed, aborted and one open transaction (tests/helpers/open_transaction.py)
RC = {"kafka.isolation.level": "read_committed"}


@pytest.fixture(scope="module")
def txn_sides(kafka_broker_session, spark_session, tmp_path_factory):
    """The broker's own log dir as kafkalog's ROOT (read live, as tests/storage/test_kafka_broker_logs.py does),
    holding TXN as Kafka's transactional producers left it: both formats read the very same partitions. (Not the
    `sides` setup: these cases need none of its topics.)"""
    broker = kafka_broker_session.ensure_running()
    t0 = OT.produce(broker, TXN, "sbs")
    return Sides(spark_session, broker, str(broker.log_dir), tmp_path_factory.mktemp("side-by-side-txn")), t0


def txn_batch_cases(t0: int) -> dict:
    inside = str(OT.open_ts(t0))
    return {
        "read_uncommitted (the default)": {"subscribe": TXN},
        "read_committed": {"subscribe": TXN, **RC},
        "read_committed, startingTimestamp before everything": {"subscribe": TXN, "startingTimestamp": str(t0), **RC},
        "read_committed, startingTimestamp inside the open transaction, strategy latest": {
            "subscribe": TXN,
            "startingTimestamp": inside,
            "startingOffsetsByTimestampStrategy": "latest",
            **RC,
        },
        "read_committed, endingOffsets past the LSO, failOnDataLoss=false": {
            "subscribe": TXN,
            "endingOffsets": json.dumps({TXN: {"0": 14, "1": -1}}),
            "failOnDataLoss": "false",
            **PAST_END,
            **RC,
        },
    }


def _values(rows) -> list[str]:
    return [r[1].decode() for r in rows]


@pytest.mark.parametrize("case", list(txn_batch_cases(0)))
def test_read_committed_batch_reads_give_the_same_rows(txn_sides, case):
    """A partition behind an open transaction (partition 0: committed, aborted, committed, OPEN, then producer B's
    committed records past it) and one whose LSO is its log end (partition 1): the same rows with both formats."""
    sides, t0 = txn_sides
    opts = txn_batch_cases(t0)[case]
    out = {fmt: sides.read(fmt, opts) for fmt in ("kafka", "kafkalog")}
    assert out["kafka"].error is None and out["kafkalog"].error is None, (out["kafka"].gist(), out["kafkalog"].gist())
    kafka, kafkalog = (
        by_case(tagged_rows(out[fmt].rows, case))[case] if out[fmt].rows else [] for fmt in ("kafka", "kafkalog")
    )
    REPORT.append(("read_committed", case, f"{len(kafka)} rows", "same rows" if kafkalog == kafka else "DIFFERENT"))
    assert kafkalog == kafka, "kafkalog read other rows than the connector"
    values = _values(kafka)
    if case.startswith("read_committed"):  # the case reaches what it is about
        assert not [v for v in values if "-abort-" in v or "-leaveOpen-" in v], values
        assert not [r for r in kafka if r[3] == 0 and r[4] > 9], "partition 0 read past its LSO (10)"
    else:
        assert len([v for v in values if "-abort-" in v]) == 4 and len([v for v in values if "-leaveOpen-" in v]) == 2
    if case == "read_committed":
        assert len(kafka) == 9 and [r[4] for r in kafka if r[3] == 1] == [0, 1, 6, 7]


def test_read_committed_stream_gives_the_same_rows(txn_sides):
    """readStream from earliest with Trigger.AvailableNow: each micro-batch ends at the LSO, with both formats."""
    sides, _ = txn_sides
    got = {}
    for fmt in ("kafka", "kafkalog"):
        out, _ = sides.stream(fmt, {"subscribe": TXN, "startingOffsets": "earliest", **RC})
        assert out.error is None, out.gist()
        got[fmt] = by_case(tagged_rows(out.rows, "stream")).get("stream", [])
    REPORT.append(
        (
            "read_committed",
            "stream, AvailableNow",
            f"{len(got['kafka'])} rows",
            "same rows" if got["kafkalog"] == got["kafka"] else "DIFFERENT",
        )
    )
    assert got["kafkalog"] == got["kafka"], "kafkalog's stream read other rows than the connector's"
    assert len(got["kafka"]) == 9 and not [v for v in _values(got["kafka"]) if "-abort-" in v or "-leaveOpen-" in v]
