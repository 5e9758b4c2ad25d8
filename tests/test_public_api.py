"""kafkalog_ds.write() and kafkalog_ds.read(), the Python API (docs/python.md), without Spark.

What write() appends is held to kafka-python's parse of the segment bytes and to `kafkalog consume`; keyed
rows to kafka-python's murmur2 partitioner; reads from offsets, from a timestamp and at read_committed to
brute-force models of Kafka's rules over those parsed bytes. DuckDB, pandas and Polars read the reader.
"""

from __future__ import annotations

import base64
import inspect
import io
import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from kafka.partitioner.default import murmur2 as kp_murmur2

import kafkalog_ds
from kafkalog_ds.consume import consume
from storage.errors import InvalidConfigError, InvalidTopicError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from storage.transactions.control_records import ControlRecordType, EndTransactionMarker
from tests.helpers import REPO
from tests.helpers.kafka_reference import kp_committed, kp_parse
from tests.storage.transactions.test_transaction_state import data as txn_batch

SCHEMA_NAMES = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def rows(n: int, *, start: int = 0, ts0: int | None = None, headers: bool = True) -> pa.Table:
    """n keyed rows (every 5th key null), values v<i>, one header each, timestamps ts0 + i."""
    ts0 = int(time.time() * 1000) if ts0 is None else ts0
    idx = range(start, start + n)
    cols = {
        "key": pa.array([None if i % 5 == 4 else f"k{i}".encode() for i in idx], pa.binary()),
        "value": pa.array([f"v{i}".encode() for i in idx], pa.binary()),
        "timestamp": pa.array([ts0 + i for i in idx], pa.int64()),
    }
    if headers:
        cols["headers"] = pa.array(
            [[{"key": "n", "value": str(i).encode()}] for i in idx],
            pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
        )
    return pa.table(cols)


def partition_bytes(root: str, topic: str, p: int) -> bytes:
    d = os.path.join(root, f"{topic}-{p}")
    return b"".join(open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d)) if f.endswith(".log"))


def kp_records(root: str, topic: str, p: int) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every data record kafka-python finds in the partition."""
    return [r for b in kp_parse(partition_bytes(root, topic, p)) if not b["is_control"] for r in b["records"]]


def read_rows(reader: pa.RecordBatchReader) -> list[tuple]:
    """(partition, offset, timestamp ms, key, value, headers) of every record read."""
    t = reader.read_all()
    ts = t.column("timestamp").cast(pa.int64()).to_pylist()
    heads = t.column("headers").to_pylist() if "headers" in t.column_names else [None] * t.num_rows
    return [
        (p, o, s // 1000, k, v, None if h is None else [(x["key"], x["value"]) for x in h])
        for p, o, s, k, v, h in zip(
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            ts,
            t.column("key").to_pylist(),
            t.column("value").to_pylist(),
            heads,
            strict=True,
        )
    ]


def consumed(root: str, topic: str, **kw) -> list[tuple]:
    """What `kafkalog consume` prints, as (partition, offset, timestamp, key, value, headers)."""
    out = io.StringIO()
    consume(LogManager(root), topic, out, **kw)
    recs = []
    for line in out.getvalue().splitlines():
        r = json.loads(line)
        flags = set(r.get("base64", ()))

        def raw(v, name, flags=flags):
            return None if v is None else base64.b64decode(v) if name in flags else v.encode()

        heads = [(k, raw(v, f"headers.{i}")) for i, (k, v) in enumerate(r["headers"])]
        recs.append(
            (r["partition"], r["offset"], r["timestamp"], raw(r["key"], "key"), raw(r["value"], "value"), heads)
        )
    return recs


def test_write_then_read_is_what_kafka_python_and_consume_find(tmp_path):
    root = str(tmp_path / "logs")
    table = rows(600)
    result = kafkalog_ds.write(root, "events", table, partitions=3, compression="zstd")
    assert result.topic == "events" and result.records == 600
    assert set(result.partitions) == {0, 1, 2}
    got = read_rows(kafkalog_ds.read(root, "events", include_headers=True))
    assert sorted(got) == sorted(consumed(root, "events"))
    for p, w in result.partitions.items():
        theirs = [(p, o, t, k, v, h) for o, t, k, v, h in kp_records(root, "events", p)]
        ours = [r for r in got if r[0] == p]
        assert ours == theirs  # in offset order, every field, zstd-compressed batches
        assert (w.records, w.first_offset, w.last_offset) == (len(ours), ours[0][1], ours[-1][1])
    assert sorted(r[4] for r in got) == sorted(table.column("value").to_pylist())
    batches = [b for p in range(3) for b in kp_parse(partition_bytes(root, "events", p))]
    assert all(b["crc_ok"] for b in batches)
    assert {b["is_transactional"] for b in batches} == {True}  # one transaction: data, then a COMMIT per partition
    assert sum(b["is_control"] for b in batches) == 3


def test_read_has_spark_kafka_source_schema(tmp_path):
    root = str(tmp_path / "logs")
    kafkalog_ds.write(root, "t", rows(3))
    plain = kafkalog_ds.read(root, "t")
    assert plain.schema.names == SCHEMA_NAMES
    assert plain.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert [plain.schema.field(n).type for n in ("partition", "offset", "timestampType")] == [
        pa.int32(),
        pa.int64(),
        pa.int32(),
    ]
    t = kafkalog_ds.read(root, "t", include_headers=True).read_all()
    assert t.schema.names == [*SCHEMA_NAMES, "headers"]
    assert t.column("topic").to_pylist() == ["t"] * 3 and t.column("timestampType").to_pylist() == [0] * 3


def test_write_and_read_on_the_memory_store():
    root = f"memory://api-{time.time_ns()}"
    result = kafkalog_ds.write(root, "m", rows(50), partitions=2)
    got = read_rows(kafkalog_ds.read(root, "m", include_headers=True))
    assert len(got) == result.records == 50
    assert sorted(got) == sorted(consumed(root, "m"))


def test_keyed_rows_land_where_kafkas_partitioner_puts_them(tmp_path):
    """Keyed rows: kafka-python's murmur2 partitioner; an explicit partition wins; null keys go round robin."""
    root = str(tmp_path / "logs")
    rng = np.random.default_rng(3)
    n, parts = 2000, 7
    keys: list[bytes | None] = [bytes(rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(n)]
    keys[5::17] = [None] * len(keys[5::17])
    explicit = [int(p) if i % 10 == 3 else None for i, p in enumerate(rng.integers(0, parts, n))]
    values = [f"{i}".encode() for i in range(n)]
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": values, "partition": pa.array(explicit, pa.int32())})
    kafkalog_ds.write(root, "keyed", table, partitions=parts)
    got = kafkalog_ds.read(root, "keyed").read_all()
    where = dict(zip(got.column("value").to_pylist(), got.column("partition").to_pylist(), strict=True))
    assert len(where) == n
    nulls = []
    for i, key in enumerate(keys):
        if explicit[i] is None and key is None:
            nulls.append(where[values[i]])
            continue
        want = explicit[i] if explicit[i] is not None else (kp_murmur2(key) & 0x7FFFFFFF) % parts
        assert where[values[i]] == want, (i, key)
    assert len(nulls) > 100 and all((b - a) % parts == 1 for a, b in zip(nulls, nulls[1:], strict=False)), nulls


def test_null_keys_start_at_a_random_partition_each_call(tmp_path):
    """One keyless row per call does not pile up in partition 0 (chance of a false failure: 4 * 4**-16)."""
    root = str(tmp_path / "logs")
    for i in range(16):
        kafkalog_ds.write(root, "nokey", pa.table({"value": [f"{i}".encode()]}), partitions=4)
    assert len(set(kafkalog_ds.read(root, "nokey").read_all().column("partition").to_pylist())) > 1


def test_read_between_offsets_as_the_spark_source_does(tmp_path):
    root = str(tmp_path / "logs")
    table = rows(100, headers=False).append_column("partition", pa.array([i % 2 for i in range(100)], pa.int8()))
    kafkalog_ds.write(root, "o", table, partitions=2)
    got = read_rows(kafkalog_ds.read(root, "o", starting_offsets={0: 10, 1: -2}, ending_offsets={0: 20, 1: -1}))
    assert [(p, o) for p, o, *_ in got] == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(50)]
    assert [v for *_, v, _ in got[:2]] == [b"v20", b"v22"]  # partition 0 holds the even rows
    only = read_rows(kafkalog_ds.read(root, "o", partitions=[1], starting_offsets={1: 48}))
    assert [(p, o) for p, o, *_ in only] == [(1, 48), (1, 49)]  # offset 50 is the COMMIT marker: not a record


@pytest.mark.parametrize("seed", [0, 1])
def test_read_from_a_timestamp_starts_at_kafkas_first_offset_at_or_after_it(tmp_path, seed):
    """Kafka's ListOffsets by time: the first offset whose timestamp is >= T, over many segments and time index
    entries, timestamps out of order; a partition with none reads nothing."""
    root = str(tmp_path / "logs")
    rng = np.random.default_rng(seed)
    n = 3000
    ts = (1_700_000_000_000 + np.cumsum(rng.integers(-400, 1000, n))).tolist()
    table = pa.table(
        {"value": [f"v{i}".encode() for i in range(n)], "timestamp": ts, "partition": pa.array([0] * n, pa.int32())}
    )
    config = {"segment.bytes": "4096", "max.message.bytes": "1024", "index.interval.bytes": "256"}  # many segments
    kafkalog_ds.write(root, "ts", table, partitions=2, config=config)
    assert len([f for f in os.listdir(os.path.join(root, "ts-0")) if f.endswith(".log")]) > 10
    probes = [ts[0] - 1, ts[n // 3], int(np.median(ts)), max(ts), max(ts) + 1, *rng.choice(ts, 5).tolist()]
    for t in probes:
        first = next((i for i, x in enumerate(ts) if x >= t), None)
        want = [] if first is None else [(0, o) for o in range(first, n)]
        got = read_rows(kafkalog_ds.read(root, "ts", starting_timestamp=int(t)))
        assert [(p, o) for p, o, *_ in got] == want, t


def test_read_committed_hides_an_aborted_transaction_and_stops_at_an_open_one(tmp_path):
    """Committed rows of write(), then another producer's aborted transaction and one left open, then
    write() again: read_committed gives what Kafka's consumer does (kp_committed over kafka-python's parse),
    up to the last stable offset; read_uncommitted gives every data record."""
    root = str(tmp_path / "logs")
    now = int(time.time() * 1000)
    kafkalog_ds.write(root, "tx", rows(5, ts0=now, headers=False))
    lm = LogManager(root)
    with lm.open_log(TopicPartition("tx", 0), writable=True) as log:
        log.append(txn_batch(900, [b"aborted-0", b"aborted-1"], ts0=now + 10))
        log.append(
            EndTransactionMarker(ControlRecordType.ABORT, 0).to_batch(
                base_offset=0, timestamp=now + 11, producer_id=900, producer_epoch=0
            )
        )
        log.append(txn_batch(901, [b"open-0"], ts0=now + 12))
    later = now + 600_000  # past every marker's timestamp (markers carry the clock)
    kafkalog_ds.write(root, "tx", rows(3, start=5, ts0=later - 5, headers=False))

    batches = kp_parse(partition_bytes(root, "tx", 0))
    given, still_open = kp_committed(batches)
    lso = min(r[0] for r in still_open)
    want = [r[3] for r in given if r[0] < lso]
    everything = [r[3] for b in batches if not b["is_control"] for r in b["records"]]

    def values(**kw) -> list[bytes]:
        return kafkalog_ds.read(root, "tx", **kw).read_all().column("value").to_pylist()

    assert values(isolation_level="read_committed") == want == [f"v{i}".encode() for i in range(5)]
    assert values() == everything and b"aborted-0" in everything and b"v7" in everything
    # a timestamp found at or past the last stable offset finds nothing at read_committed (Kafka's ListOffsets)
    assert values(starting_timestamp=later, isolation_level="read_committed") == []
    assert values(starting_timestamp=later) == [b"v5", b"v6", b"v7"]
    with pytest.raises(
        OffsetOutOfRangeError, match=rf"ending_offsets: offset {lso + 1} of tx-0 is past its last stable"
    ):
        values(ending_offsets={0: lso + 1}, isolation_level="read_committed")


def test_duckdb_pandas_and_polars_read_the_reader(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    root = str(tmp_path / "logs")
    result = kafkalog_ds.write(root, "d", rows(1000), partitions=4)
    counts = (
        duckdb.from_arrow(kafkalog_ds.read(root, "d"))
        .aggregate('partition, count(*), min("offset"), max("offset")', "partition")
        .order("partition")
        .fetchall()
    )
    assert counts == [(p, w.records, w.first_offset, w.last_offset) for p, w in sorted(result.partitions.items())]
    frame = kafkalog_ds.read(root, "d").read_pandas()
    assert len(frame) == 1000 and str(frame["timestamp"].dtype) == "datetime64[us, UTC]"
    polars = pl.from_arrow(kafkalog_ds.read(root, "d").read_all())
    assert polars.height == 1000 and polars["value"].dtype == pl.Binary


def test_polars_and_duckdb_frames_are_written_as_arrow_streams(tmp_path):
    """Anything with __arrow_c_stream__; Polars exports string_view columns, written as the strings they hold."""
    duckdb = pytest.importorskip("duckdb")
    pl = pytest.importorskip("polars")
    root = str(tmp_path / "logs")
    frame = pl.DataFrame({"key": ["a", None], "value": ["1", "2"], "headers": [[{"key": "h", "value": "x"}], []]})
    assert kafkalog_ds.write(root, "pl", frame).records == 2
    rel = duckdb.sql("SELECT 'k' || i AS key, 'v' || i AS value FROM range(3) t(i)")
    assert kafkalog_ds.write(root, "pl", rel).records == 3
    got = kafkalog_ds.read(root, "pl", include_headers=True).read_all()
    assert got.column("value").to_pylist() == [b"1", b"2", b"v0", b"v1", b"v2"]
    assert got.column("headers").to_pylist()[:2] == [[{"key": "h", "value": b"x"}], None]


def test_a_pandas_frame_round_trips(tmp_path):
    pd = pytest.importorskip("pandas")
    root = str(tmp_path / "logs")
    when = pd.to_datetime(["2026-01-01T00:00:00.001Z", "2026-01-01T00:00:00.002Z", "2026-01-01T00:00:00.003Z"])
    frame = pd.DataFrame(
        {
            "key": ["a", None, "c"],  # str: written as UTF-8
            "value": [b"\x00\xff", b"text", None],  # None: a tombstone
            "timestamp": when,
            "partition": pd.array([1, None, 0], dtype="Int64"),
            "headers": [[{"key": "h", "value": b"1"}], [], None],
        },
        index=[10, 20, 30],  # dropped: not a column
    )
    result = kafkalog_ds.write(root, "pd", frame, partitions=2)
    assert result.records == 3
    back = kafkalog_ds.read(root, "pd", include_headers=True).read_pandas().sort_values("timestamp")
    assert back["key"].tolist() == [b"a", None, b"c"]
    assert back["value"].tolist() == [b"\x00\xff", b"text", None]
    assert back["timestamp"].tolist() == when.tolist()
    assert back["partition"].tolist()[0::2] == [1, 0]  # explicit partitions; the null one went by its key
    headers = [None if h is None else list(h) for h in back["headers"]]
    assert headers == [[{"key": "h", "value": b"1"}], None, None]  # no headers: null, as Spark's Kafka source


def test_a_read_streams_bounded_batches(tmp_path):
    """40 MiB of values come back in several batches (the engine's 16 MiB decode budget), not one table."""
    root = str(tmp_path / "logs")
    blob = b"x" * (128 * 1024)
    kafkalog_ds.write(root, "big", pa.table({"value": pa.array([blob] * 320, pa.binary())}))
    sizes = [b.column("value").nbytes for b in kafkalog_ds.read(root, "big")]
    assert len(sizes) >= 3 and sum(sizes) >= 320 * len(blob)
    assert max(sizes) <= 17 * 1024 * 1024, sizes


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_read_errors_name_the_topic_partition_and_option(tmp_path):
    root = str(tmp_path / "logs")
    kafkalog_ds.write(root, "t", rows(10, headers=False).append_column("partition", pa.array([0] * 10)), partitions=2)
    LogManager(root).delete_records(TopicPartition("t", 0), 4)
    unknown, bad_config, out_of_range = UnknownTopicOrPartitionError, InvalidConfigError, OffsetOutOfRangeError
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        (dict(topic="nope"), unknown, "topic 'nope' does not exist in .*topics there: t"),
        (dict(topic="bad/name"), InvalidTopicError, "bad/name"),
        (dict(partitions=[5]), unknown, "partitions: partition 5 does not exist: topic 't' has 2"),
        (dict(starting_offsets={0: 5}), bad_config, r"starting_offsets must give every partition.*missing: \[1\]"),
        (
            dict(starting_offsets={0: 2, 1: -2}),
            out_of_range,
            "starting_offsets: offset 2 of t-0 is below its log start offset 4",
        ),
        (
            dict(starting_offsets={0: 12, 1: -2}),
            out_of_range,
            "starting_offsets: offset 12 of t-0 is past its log end offset 11",
        ),
        (
            dict(ending_offsets={0: 99, 1: -1}),
            out_of_range,
            "ending_offsets: offset 99 of t-0 is past its log end offset 11",
        ),
        (
            dict(starting_offsets={0: 8, 1: -2}, ending_offsets={0: 6, 1: -1}),
            out_of_range,
            "t-0: starting offset 8 is after",
        ),
        (dict(starting_offsets="latest"), bad_config, "starting_offsets: 'latest' is not allowed"),
        (dict(starting_offsets={0: -1, 1: -2}), bad_config, "starting_offsets: offset -1 for t-0 is not allowed"),
        (dict(ending_offsets={0: "5", 1: -1}), bad_config, "ending_offsets: entry 0"),
        (dict(isolation_level="READ_COMMITTED"), bad_config, "invalid value 'READ_COMMITTED' for isolation_level"),
        (dict(starting_timestamp=-1), bad_config, "starting_timestamp: expected milliseconds"),
        (
            dict(starting_timestamp=5, starting_offsets={0: 4, 1: 0}),
            bad_config,
            "starting_offsets or starting_timestamp",
        ),
    ]
    for kw, error, message in cases:
        topic = kw.pop("topic", "t")
        with pytest.raises(error, match=message) as e:
            kafkalog_ds.read(root, topic, **kw)
        one_line(e)
    with pytest.raises(UnknownTopicOrPartitionError, match="log dir .*missing does not exist"):
        kafkalog_ds.read(str(tmp_path / "missing"), "t")
    assert not os.path.exists(tmp_path / "missing")


def test_write_errors_write_nothing(tmp_path):
    root = str(tmp_path / "logs")
    kafkalog_ds.write(root, "t", pa.table({"value": [b"first"]}), partitions=2)
    headers = pa.array([[("k", 1)]], pa.list_(pa.struct([("k", pa.string()), ("v", pa.int64())])))
    bad = InvalidConfigError
    cases: list[tuple[object, dict[str, Any], type[Exception], str]] = [
        (pa.table({"key": [b"k"]}), {}, bad, "needs a 'value' column.*input columns: key"),
        (pa.table({"value": [1]}), {}, bad, "column 'value' has type int64; write.. takes string or binary"),
        (pa.table({"value": [b"v"], "partition": [1.0]}), {}, bad, "column 'partition' has type double"),
        (pa.table({"value": [b"v"], "timestamp": ["now"]}), {}, bad, "column 'timestamp' has type string"),
        (pa.table({"value": [b"v"], "headers": headers}), {}, bad, "column 'headers' has type"),
        (
            pa.table({"value": [b"v", b"w"], "partition": [0, 9]}),
            {},
            bad,
            "partition 9 does not exist: topic 't' has 2",
        ),
        (pa.table({"value": [b"v"]}), {"partitions": 3}, bad, "partitions=3: topic 't' exists with 2 partition"),
        (pa.table({"value": [b"v"]}), {"compression": "brotli"}, bad, "compression: unknown compression type 'brotli'"),
        ([{"value": b"v"}], {}, TypeError, "write.. takes a pyarrow Table.*got list"),
    ]
    for data, kw, error, message in cases:
        with pytest.raises(error, match=message) as e:
            kafkalog_ds.write(root, "t", data, **kw)
        one_line(e)

    def broken_source():  # a first batch big enough to be staged, then the source fails
        yield pa.record_batch({"value": pa.array([b"v"] * 70_000, pa.binary())})
        raise OSError("the source broke")

    stream = pa.RecordBatchReader.from_batches(pa.schema([("value", pa.binary())]), broken_source())
    with pytest.raises(OSError, match="the source broke"):
        kafkalog_ds.write(root, "t", stream)
    assert kafkalog_ds.read(root, "t").read_all().column("value").to_pylist() == [b"first"]
    assert not [n for n in os.listdir(root) if n.startswith(".kafkalog-staged-")]  # no staging left behind


def test_import_kafkalog_ds_loads_no_arrow_engine_or_spark_and_submodules_shadow_nothing():
    code = (
        "import sys, kafkalog_ds\n"
        "heavy = ('numpy', 'pyarrow', 'numba', 'fsspec', 'pandas', 'pyspark', 'storage', 'python_datasource')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
        "from storage import errors\n"
        "assert kafkalog_ds.OffsetOutOfRangeError is errors.OffsetOutOfRangeError\n"
        "import kafkalog_ds.cli, kafkalog_ds.produce, kafkalog_ds.consume  # submodules must not shadow the API\n"
        "shadowed = [n for n in kafkalog_ds.__all__ if type(getattr(kafkalog_ds, n)).__name__ == 'module']\n"
        "assert not shadowed and callable(kafkalog_ds.write) and callable(kafkalog_ds.read), shadowed\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_api_is_typed():
    hints = {name: inspect.signature(getattr(kafkalog_ds, name)) for name in ("write", "read", "register")}
    assert hints["register"].parameters["spark"].annotation == "SparkSession"
    assert hints["register"].return_annotation == "None"
    assert hints["read"].return_annotation == "pa.RecordBatchReader"
    assert hints["write"].return_annotation == "WriteResult"
    for sig in hints.values():
        assert all(p.annotation is not inspect.Parameter.empty for p in sig.parameters.values())
    assert os.path.exists(os.path.join(REPO, "kafkalog_ds", "py.typed"))


def test_the_duckdb_example_runs_without_spark(tmp_path):
    start = time.monotonic()
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "duckdb_read.py"), str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO},
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("produced 5000 page views") and lines[1].split() == ["page", "views", "users", "avg_ms"]
    assert sum(int(line.split()[1]) for line in lines[2:7]) == 5000
    assert lines[-1].startswith("views in the last 10 minutes: ")
    assert "pyspark" not in p.stderr and not p.stderr.strip(), p.stderr
    assert time.monotonic() - start < 120
