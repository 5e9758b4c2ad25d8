"""Readers of a topic's table (storage/tables/readers.py, docs/tables.md "Readers") return exactly the rows
`spark.read.format("kafkalog")` returns at read_committed for the table's range: pyiceberg's scan into Arrow,
pandas and Polars, and DuckDB's iceberg_scan (duckdb 1.4.4 with the duckdb-ext-iceberg wheel, nothing
downloaded). Iceberg's Spark runtime is held to the same rows in test_table_spark_iceberg.py (pyspark 4.1).

The topic: three partitions of plain batches and of transactions committed, aborted and left open, headers
(several, a null header value), null keys, null values, timestamps over weeks; two passes, records after
the second. What differs between the readers, asserted here so a change shows:
- pyiceberg 0.12 reads a null `headers` (a record without headers) as [] (apache/iceberg-python#3833);
  readers.restore_null_headers puts the nulls back (Kafka has no empty headers distinct from none).
- pyiceberg's Arrow has large_binary / large_string / large_list where Spark's has binary / string / list;
  the values are the same, and pandas and Polars get the same dtypes either way.
- DuckDB's TIMESTAMP WITH TIME ZONE comes to Arrow in DuckDB's TimeZone setting (the machine's by default):
  the same instants.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyiceberg")
pytest.importorskip("duckdb")

import pyarrow.parquet as pq  # noqa: E402
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan  # noqa: E402

from storage.errors import TableError  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402
from storage.records.builder import build_records  # noqa: E402
from storage.tables import readers  # noqa: E402
from storage.tables.materializer import materialize_topic  # noqa: E402
from storage.tables.readers import duckdb_connection, restore_null_headers, static_table  # noqa: E402
from storage.tables.table_offsets import NEXT_OFFSETS  # noqa: E402
from storage.tables.table_schema import KAFKA_ARROW  # noqa: E402
from storage.topic_partition import TopicPartition  # noqa: E402
from tests.helpers.table_model import DAY, T0, Rec, TopicModel, Workload  # noqa: E402

COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
DUCKDB_TYPES = [
    "BLOB",
    "BLOB",
    "VARCHAR",
    "INTEGER",
    "BIGINT",
    "TIMESTAMP WITH TIME ZONE",
    "INTEGER",
    'STRUCT("key" VARCHAR, "value" BLOB)[]',
]
HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
#: pyiceberg 0.12's scan().to_arrow(): Spark's Arrow types (table_schema.KAFKA_ARROW) as their large variants
PYICEBERG_ARROW = pa.schema(
    [
        ("key", pa.large_binary()),
        ("value", pa.large_binary()),
        ("topic", pa.large_string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.large_list(pa.struct([("key", pa.large_string()), ("value", pa.large_binary())]))),
    ]
)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


# ---- the topic and its table ----


def _headers_batch(work: Workload, p: int) -> None:
    """A plain batch of the rarer shapes: several headers with a null header value, no key and no value."""
    shapes = [
        (b"k-many", b"v", [("x", b"1"), ("y", None), ("x", b"")]),
        (None, None, [("only", None)]),
        (None, b"no key", []),
        (b"k-tomb", None, []),
    ]
    rows = []
    for key, value, headers in shapes:
        work.now += 1000
        rows.append(Rec(p, -1, work.now, key, value, headers))
    table = pa.table(
        {
            "key": pa.array([r.key for r in rows], pa.binary()),
            "value": pa.array([r.value for r in rows], pa.binary()),
            "timestamp": pa.array([r.ts for r in rows], pa.int64()),
            "headers": pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in rows], pa.list_(HEADER)),
        }
    )
    work._append(p, build_records(table), rows)


def _next_offsets(metadata_location: str) -> dict[int, int]:
    summary = static_table(metadata_location).current_snapshot().summary.additional_properties
    return {int(p): o for p, o in json.loads(summary[NEXT_OFFSETS]).items()}


def _pass(lm, topic: str) -> str:
    rep = materialize_topic(lm, topic)
    assert rep.error is None and rep.committed, rep.line()
    return rep.metadata_location


def build_events_topic(root: str) -> tuple[TopicModel, list[tuple[str, dict[int, int]]]]:
    """Topic "events" under `root` (see the module doc) with two passes: (its model, [(metadata location, next
    offsets) of each pass]). test_table_spark_iceberg.py reads the same topic."""
    lm = LogManager(root)
    lm.create_topic("events", 3, {"table.mode": "append"})
    model = TopicModel("events", 3)
    work = Workload(lm, model, 30, keys=15)
    passes = []
    for round_ in range(2):
        for i in range(70):
            work.step()
            if i % 30 == 0:
                _headers_batch(work, (i // 30 + round_) % 3)
        location = _pass(lm, "events")
        passes.append((location, _next_offsets(location)))
    for _ in range(15):  # past the table: the readers must not have them, Spark's endingOffsets leaves them out
        work.step()

    # the workload has what the test is about (seed 30 was chosen for it; these guard a change to the model)
    offsets = passes[-1][1]
    below = [r for r in model.records if r.offset < offsets[r.partition]]
    fates = {model.outcome.get(r.txn, "open") for r in below if r.txn is not None}
    assert fates == {"commit", "abort"}, fates
    assert any(r.txn is not None and r.txn not in model.outcome for r in model.records)  # open at the end
    ends = {}
    for p in range(3):
        with lm.open_log(TopicPartition("events", p)) as log:
            ends[p] = log.log_end_offset
    assert passes[0][1] != offsets and any(o < ends[p] for p, o in offsets.items())  # records past the table
    committed = model.committed(offsets)
    assert {r.key is None for r in committed} == {True, False} and {r.value is None for r in committed} == {True, False}
    assert {bool(r.headers) for r in committed} == {True, False}
    assert max(r.ts for r in committed) - min(r.ts for r in committed) > 7 * DAY
    return model, passes


@pytest.fixture(scope="module")
def topic_table(tmp_path_factory):
    """(root, model, passes) of build_events_topic."""
    root = str(tmp_path_factory.mktemp("readers") / "logs")
    model, passes = build_events_topic(root)
    return root, model, passes


# ---- rows as plain tuples, from each reader ----


def _headers(h) -> tuple | None:
    return None if h is None else tuple((x["key"], x["value"]) for x in h)


def _micros(t) -> int:
    if hasattr(t, "value") and hasattr(t, "tz_convert"):  # pandas Timestamp: ns
        return int(t.value) // 1000
    return (t - EPOCH) // dt.timedelta(microseconds=1)


def arrow_rows(t) -> list[tuple]:
    """(key, value, topic, partition, offset, timestamp µs, timestampType, headers) by partition, offset."""
    t = t.select(COLUMNS)
    cols = [t.column(c).to_pylist() for c in COLUMNS]
    cols[5] = t.column("timestamp").cast(pa.int64()).to_pylist()  # µs since the epoch, whatever the time zone
    rows = [(*r[:7], _headers(r[7])) for r in zip(*cols, strict=True)]
    return sorted(rows, key=lambda r: (r[3], r[4]))


def _pandas_rows(df) -> list[tuple]:
    rows = []
    for r in df[COLUMNS].itertuples(index=False, name=None):
        k, v, topic, p, o, ts, tt, h = r
        rows.append((k, v, topic, int(p), int(o), _micros(ts), int(tt), _headers(h)))
    return sorted(rows, key=lambda r: (r[3], r[4]))


def _polars_rows(df) -> list[tuple]:
    rows = [
        (k, v, topic, p, o, _micros(ts), tt, _headers(h)) for k, v, topic, p, o, ts, tt, h in df.select(COLUMNS).rows()
    ]
    return sorted(rows, key=lambda r: (r[3], r[4]))


def model_rows(model: TopicModel, offsets: dict[int, int]) -> list[tuple]:
    rows = [
        (r.key, r.value, model.topic, r.partition, r.offset, r.ts * 1000, 0, tuple(r.headers) or None)
        for r in model.committed(offsets)
    ]
    return sorted(rows, key=lambda r: (r[3], r[4]))


def _as_pyiceberg_reads(rows: list[tuple]) -> list[tuple]:
    """The rows as pyiceberg 0.12 reads them: a null headers as () (apache/iceberg-python#3833)."""
    return [(*r[:7], () if r[7] is None else r[7]) for r in rows]


def _small(schema):
    """The schema with large_binary / large_string / large_list as binary / string / list."""

    def small(t):
        if pa.types.is_large_binary(t):
            return pa.binary()
        if pa.types.is_large_string(t):
            return pa.string()
        if pa.types.is_large_list(t) or pa.types.is_list(t):
            return pa.list_(pa.field(t.value_field.name, small(t.value_type), t.value_field.nullable))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, small(f.type), f.nullable) for f in t])
        return t

    return pa.schema([pa.field(f.name, small(f.type), f.nullable) for f in schema])


def kafkalog_read(spark, root: str, topic: str, offsets: dict[int, int]):
    return (
        spark.read.format("kafkalog")
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .option("endingOffsets", json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}}))
        .load(root)
    )


# ---- the readers against Spark's kafkalog source ----


@pytest.mark.spark
def test_every_reader_returns_the_rows_of_spark_read_committed(spark_session, topic_table):
    import polars as pl

    root, model, passes = topic_table
    con = duckdb_connection()
    for n, (location, offsets) in enumerate(passes):  # each pass's metadata file: the table as that pass left it
        spark = kafkalog_read(spark_session, root, "events", offsets).toArrow()
        want = arrow_rows(spark)
        assert want == model_rows(model, offsets), f"pass {n + 1}: Spark's kafkalog source"
        assert len(want) > 100 * (n + 1)

        # pyiceberg: Arrow, pandas, Polars, each with the nulls restored, and as pyiceberg gives them
        scan = static_table(location).scan()
        arrow = scan.to_arrow()
        assert arrow_rows(restore_null_headers(arrow)) == want, f"pass {n + 1}: pyiceberg to_arrow"
        assert arrow_rows(arrow) in (_as_pyiceberg_reads(want), want)  # exactly one or the other
        assert _pandas_rows(restore_null_headers(arrow).to_pandas()) == want, f"pass {n + 1}: pandas"
        assert _polars_rows(pl.from_arrow(restore_null_headers(arrow))) == want, f"pass {n + 1}: Polars"
        assert _pandas_rows(scan.to_pandas()) in (_as_pyiceberg_reads(want), want)
        assert _polars_rows(scan.to_polars()) in (_as_pyiceberg_reads(want), want)

        # DuckDB, straight from the metadata file
        duck = con.execute("SELECT * FROM iceberg_scan(?)", [location])
        duck_arrow = duck.fetch_arrow_table()
        assert arrow_rows(duck_arrow) == want, f"pass {n + 1}: DuckDB"

        # types: Spark's Arrow is the table's Kafka columns; pyiceberg's is the same in large types; pandas and
        # Polars get the same dtypes from both; DuckDB has the Iceberg types' SQL names
        assert spark.schema.equals(KAFKA_ARROW), spark.schema
        assert arrow.schema.equals(PYICEBERG_ARROW) and _small(arrow.schema).equals(spark.schema), arrow.schema
        assert dict(restore_null_headers(arrow).to_pandas().dtypes) == dict(spark.to_pandas().dtypes)
        assert dict(scan.to_polars().schema) == dict(pl.from_arrow(spark).schema)
        types = con.execute("DESCRIBE SELECT * FROM iceberg_scan(?)", [location]).fetchall()
        assert [(c[0], c[1]) for c in types] == list(zip(COLUMNS, DUCKDB_TYPES, strict=True))
        zone = con.execute("SELECT current_setting('TimeZone')").fetchone()[0]
        assert duck_arrow.schema.field("timestamp").type == pa.timestamp("us", tz=zone)
        assert _small(duck_arrow.schema).equals(
            _small(spark.schema.set(5, pa.field("timestamp", pa.timestamp("us", tz=zone))))
        )


def test_within_a_file_rows_are_ordered_by_partition_and_offset(topic_table):
    _, model, passes = topic_table
    table = static_table(passes[-1][0])
    files = [t.file.file_path for t in table.scan().plan_files()]
    assert len(files) > 10
    rows = 0
    for path in files:
        t = pq.read_table(path.removeprefix("file://"), columns=["partition", "offset"])
        keys = list(zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(), strict=True))
        assert keys == sorted(set(keys)), path  # ascending, none twice
        rows += len(keys)
    assert rows == len(model.committed(passes[-1][1])) and rows > 2 * len(files)


def test_a_one_day_filter_plans_few_files(tmp_path):
    """A table partitioned by day(timestamp) over ten days: a one-day timestamp range plans at most a fifth of
    the data files (pyiceberg prunes by partition values and column bounds), and still returns that day's rows."""
    root = str(tmp_path / "logs")
    lm = LogManager(root)
    lm.create_topic("days", 2, {"table.mode": "append"})
    start = (T0 // DAY + 1) * DAY
    stamps = {p: [start + h * 3_600_000 + p for h in range(0, 240, 3)] for p in range(2)}  # 10 days, 8 a day
    for p, ts in stamps.items():
        with lm.open_log(TopicPartition("days", p), writable=True) as log:
            log.append(
                build_records(
                    pa.table({"key": [b"k"] * len(ts), "value": [b"%d" % t for t in ts], "timestamp": ts}),
                )
            )
    table = static_table(_pass(lm, "days"))
    every = list(table.scan().plan_files())
    assert len(every) >= 10
    lo, hi = start + 4 * DAY, start + 5 * DAY
    day = And(
        GreaterThanOrEqual("timestamp", _iso(lo)),
        LessThan("timestamp", _iso(hi)),
    )
    planned = list(table.scan(row_filter=day).plan_files())
    assert 0 < len(planned) <= len(every) / 5, (len(planned), len(every))
    got = sorted(table.scan(row_filter=day).to_arrow().column("value").to_pylist())
    assert got == sorted(b"%d" % t for ts in stamps.values() for t in ts if lo <= t < hi)


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


# ---- the helpers ----


def test_restore_null_headers():
    t = pa.table(
        {
            "offset": [0, 1, 2],
            "headers": pa.array([[{"key": "a", "value": None}], [], None], pa.large_list(HEADER)),
        }
    )
    fixed = restore_null_headers(t)
    assert fixed.column("headers").to_pylist() == [[{"key": "a", "value": None}], None, None]
    assert fixed.schema == t.schema
    batch = restore_null_headers(t.to_batches()[0])
    assert isinstance(batch, pa.RecordBatch) and batch.column("headers").null_count == 2
    no_headers = t.drop_columns(["headers"])
    assert restore_null_headers(no_headers) is no_headers


def test_static_table_reads_with_the_logs_storage_options(topic_table):
    _, _, passes = topic_table
    table = static_table(passes[0][0], {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "s"})
    assert table.metadata_location == passes[0][0] and table.current_snapshot() is not None
    assert {k: table.io.properties[k] for k in ("s3.endpoint", "s3.access-key-id", "s3.secret-access-key")} == {
        "s3.endpoint": "http://127.0.0.1:9",
        "s3.access-key-id": "k",
        "s3.secret-access-key": "s",
    }


def test_duckdb_connection_loads_iceberg_from_site_packages_only():
    con = duckdb_connection()
    settings = dict(
        con.execute(
            "SELECT name, value FROM duckdb_settings() WHERE name IN "
            "('autoinstall_known_extensions', 'extension_directory')"
        ).fetchall()
    )
    assert settings["autoinstall_known_extensions"] == "false"
    assert settings["extension_directory"].endswith("/duckdb_ext/extensions")
    loaded = dict(con.execute("SELECT extension_name, install_path FROM duckdb_extensions() WHERE loaded").fetchall())
    assert loaded["iceberg"].startswith(settings["extension_directory"] + "/")
    assert loaded["avro"].startswith(settings["extension_directory"] + "/")


def test_duckdb_connection_names_the_extra_when_something_is_missing(monkeypatch, tmp_path):
    real = readers.importlib.util.find_spec

    for missing in ("duckdb", "duckdb_ext"):
        monkeypatch.setattr(
            readers.importlib.util, "find_spec", lambda name, m=missing: None if name == m else real(name)
        )
        with pytest.raises(TableError) as e:
            duckdb_connection()
        assert "kafkalog-ds[tables]" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(readers.importlib.util, "find_spec", real)

    # the iceberg extension without avro (or built for another DuckDB): LOAD fails, in one line
    import duckdb

    lone = tmp_path / "extensions" / "v0.0.0" / "linux_amd64"
    lone.mkdir(parents=True)
    (lone / "iceberg.duckdb_extension").write_bytes(b"")
    monkeypatch.setattr(readers, "_extension_directory", lambda: str(tmp_path / "extensions"))
    with pytest.raises(TableError) as e:
        duckdb_connection()
    assert f"duckdb {duckdb.__version__} cannot load the iceberg extension" in str(e.value)
    assert "kafkalog-ds[tables]" in str(e.value) and "\n" not in str(e.value)
