"""The Java side of the Iceberg tests (tools/iceberg): Iceberg's REST catalog server and Iceberg's Spark runtime.

pyiceberg writes a topic-shaped table (the kafkalog columns, partitioned by day(timestamp), format v2) through
Iceberg's own REST catalog server, and a fresh client sees its rows and its snapshot summary. Commits from one
base snapshot race: exactly one wins and the others get CommitFailedException, which the exactly-once design
relies on; it holds only on a table with `commit.retry.num-retries=0`, because by default pyiceberg retries a
lost append on the new base (the second test shows that too). The `iceberg_spark` test reads what pyiceberg
wrote with Spark 4.1 and Iceberg's Spark runtime, three ways: a REST catalog, a JDBC catalog on pyiceberg's
SqlCatalog file, and the metadata file's path with no catalog.

Without Java or Maven these tests skip with one line saying what is missing, unless KAFKALOG_REQUIRE_ICEBERG=1
(then they fail). The `iceberg_spark` test also skips on a pyspark that is not 4.1.x (the only Spark that
Iceberg 1.12.0 has a runtime for), unless KAFKALOG_REQUIRE_ICEBERG_SPARK=1.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyiceberg")

from pyiceberg.catalog import load_catalog  # noqa: E402
from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402
from pyiceberg.exceptions import CommitFailedException  # noqa: E402
from pyiceberg.expressions import LessThan  # noqa: E402
from pyiceberg.partitioning import PartitionField, PartitionSpec  # noqa: E402
from pyiceberg.schema import Schema  # noqa: E402
from pyiceberg.transforms import DayTransform  # noqa: E402
from pyiceberg.types import (  # noqa: E402
    BinaryType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from tools.iceberg import jars  # noqa: E402
from tools.iceberg.rest_catalog import RestCatalogServer  # noqa: E402

SPARK_TIMEOUT_S = 600  # a hang guard only

SCHEMA = Schema(
    NestedField(1, "key", BinaryType(), required=False),
    NestedField(2, "value", BinaryType(), required=False),
    NestedField(3, "topic", StringType(), required=False),
    NestedField(4, "partition", IntegerType(), required=False),
    NestedField(5, "offset", LongType(), required=False),
    NestedField(6, "timestamp", TimestamptzType(), required=False),
    NestedField(7, "timestampType", IntegerType(), required=False),
    NestedField(
        8,
        "headers",
        ListType(
            9,
            StructType(
                NestedField(10, "key", StringType(), required=False),
                NestedField(11, "value", BinaryType(), required=False),
            ),
            element_required=False,
        ),
        required=False,
    ),
)
SPEC = PartitionSpec(PartitionField(source_id=6, field_id=1000, transform=DayTransform(), name="timestamp_day"))
SPARK_SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
    "timestampType:int,headers:array<struct<key:string,value:binary>>>"
)
NEXT_OFFSETS = "kafkalog.next-offsets"


REQUIRE = "KAFKALOG_REQUIRE_ICEBERG"
REQUIRE_SPARK = "KAFKALOG_REQUIRE_ICEBERG_SPARK"


def _unavailable(e: Exception, *required_by: str):
    """Skip with the reason's first line, or fail if one of these variables says the test must run."""
    if any(os.environ.get(var) == "1" for var in required_by):
        pytest.fail(f"the Iceberg tests cannot run: {e}", pytrace=False)
    pytest.skip(str(e).splitlines()[0])


@pytest.fixture(scope="module")
def rest_server(tmp_path_factory):
    server = RestCatalogServer(tmp_path_factory.mktemp("iceberg-rest"))
    error = None
    try:
        server.start()
    except jars.Unavailable as e:
        error = e
    if error is not None:  # outside the except: a failure then quotes no traceback of the skip's cause
        _unavailable(error, REQUIRE)
    yield server
    server.stop()


def _rows(offsets, day_of=lambda o: 1 + o // 3) -> pa.Table:
    """Records of topic "t" partition 0: three per day from 2024-01-01; key None at offset 3, headers on odd ones."""
    return pa.Table.from_pylist(
        [
            {
                "key": None if o == 3 else b"k%d" % o,
                "value": b"v%d" % o,
                "topic": "t",
                "partition": 0,
                "offset": o,
                "timestamp": dt.datetime(2024, 1, day_of(o), 12, 0, 0, o, tzinfo=dt.timezone.utc),
                "timestampType": 0,
                "headers": [{"key": "h", "value": b"x%d" % o}] if o % 2 else [],
            }
            for o in offsets
        ],
        schema=SCHEMA.as_arrow(),
    )


def _create(catalog, name: str, **properties: str):
    catalog.create_namespace_if_not_exists("kl")
    return catalog.create_table(
        f"kl.{name}", schema=SCHEMA, partition_spec=SPEC, properties={"format-version": "2", **properties}
    )


def _offsets(table) -> list[int]:
    return sorted(table.scan().to_arrow()["offset"].to_pylist())


# ---- the REST catalog server, with pyiceberg ----


def test_rest_catalog_serves_pyiceberg(rest_server):
    assert rest_server.config()["overrides"]["namespace-separator"]  # GET /v1/config, as start() waited for
    writer = load_catalog("w", type="rest", uri=rest_server.uri)
    table = _create(writer, "round_trip")
    table.append(_rows(range(6)), snapshot_properties={NEXT_OFFSETS: '{"0": 6}'})

    fresh = load_catalog("r", type="rest", uri=rest_server.uri).load_table("kl.round_trip")
    assert fresh.metadata.format_version == 2
    assert str(fresh.spec().fields[0].transform) == "day"
    assert fresh.scan().to_arrow().sort_by("offset").equals(_rows(range(6)))
    assert fresh.current_snapshot().summary[NEXT_OFFSETS] == '{"0": 6}'
    # the catalog's state is in the SQLite file and the warehouse in the server's work directory
    assert rest_server.catalog_db.stat().st_size > 0
    assert fresh.metadata_location.startswith("file:" + str(rest_server.warehouse_dir.resolve()))


def _race(tables, batch_of) -> list[object]:
    """Each table (loaded at the same snapshot) appends its batch at once; "ok" or the exception, per table."""
    start = threading.Barrier(len(tables))
    results: list[object] = [None] * len(tables)

    def commit(i):
        start.wait()
        try:
            tables[i].append(batch_of(i), snapshot_properties={NEXT_OFFSETS: f"writer {i}"})
            results[i] = "ok"
        except Exception as e:  # noqa: BLE001 - the test asserts which
            results[i] = e

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(tables))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("catalog_kind", ["rest", "sql"])
def test_commits_from_one_base_exactly_one_wins(catalog_kind, request, tmp_path):
    """Four writers load the table at one snapshot and append at once: one commit lands, three fail with
    CommitFailedException and leave nothing behind, on Iceberg's REST server and on pyiceberg's SqlCatalog."""
    if catalog_kind == "rest":
        uri = request.getfixturevalue("rest_server").uri

        def catalog(name):
            return load_catalog(name, type="rest", uri=uri)
    else:

        def catalog(name):
            return SqlCatalog("kafkalog", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")

    table = _create(catalog("w"), "race", **{"commit.retry.num-retries": "0"})
    table.append(_rows([0]), snapshot_properties={NEXT_OFFSETS: "base"})
    base = table.current_snapshot().snapshot_id
    writers = [catalog(f"w{i}").load_table("kl.race") for i in range(4)]
    assert {w.current_snapshot().snapshot_id for w in writers} == {base}

    results = _race(writers, lambda i: _rows([10 + i]))

    winners = [i for i, r in enumerate(results) if r == "ok"]
    assert len(winners) == 1, results
    assert all(isinstance(r, CommitFailedException) for r in results if r != "ok"), results
    after = catalog("r").load_table("kl.race")
    assert after.current_snapshot().parent_snapshot_id == base
    assert after.current_snapshot().summary[NEXT_OFFSETS] == f"writer {winners[0]}"
    assert _offsets(after) == [0, 10 + winners[0]]


def test_pyiceberg_retries_a_lost_append_by_default(rest_server):
    """Without commit.retry.num-retries=0 the loser does not fail: pyiceberg (0.12) logs "Commit failed due to a
    concurrent update, retrying" and appends its files on the winner's snapshot, with its own summary
    properties, which it computed from the old base. A writer that must know it lost sets the property."""
    catalog = load_catalog("w", type="rest", uri=rest_server.uri)
    table = _create(catalog, "retried")
    table.append(_rows([0]), snapshot_properties={NEXT_OFFSETS: "base"})
    first, second = catalog.load_table("kl.retried"), catalog.load_table("kl.retried")
    first.append(_rows([1]), snapshot_properties={NEXT_OFFSETS: "first"})
    second.append(_rows([2]), snapshot_properties={NEXT_OFFSETS: "second"})  # no exception

    after = catalog.load_table("kl.retried")
    assert _offsets(after) == [0, 1, 2]
    assert after.current_snapshot().summary[NEXT_OFFSETS] == "second"
    assert [s.summary[NEXT_OFFSETS] for s in after.snapshots()] == ["base", "first", "second"]


# ---- Spark 4.1 with Iceberg's runtime reads what pyiceberg wrote ----

# Runs in its own process: pytest-spark's shared SparkSession has its spark.jars fixed when it starts, and the
# Iceberg runtime is for Spark 4.1 only.
SPARK_DRIVER = r"""
import json, sys
from pyspark.sql import SparkSession

job = json.load(sys.stdin)
builder = SparkSession.builder.master("local[2]")
for k, v in job["conf"].items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
out = {}
for name, source in job["reads"].items():
    df = spark.read.format("iceberg").load(source["path"]) if "path" in source else spark.table(source["table"])
    rows = df.selectExpr(
        "offset", "hex(key) AS key", "hex(value) AS value", "topic", "partition", "unix_micros(timestamp) AS ts",
        "timestampType", "transform(headers, h -> named_struct('key', h.key, 'value', hex(h.value))) AS headers",
    ).orderBy("offset").collect()
    out[name] = {
        "schema": df.schema.simpleString(),
        "nullable": [f.nullable for f in df.schema.fields],
        "rows": [[r.offset, r.key, r.value, r.topic, r.partition, r.ts, r.timestampType,
                  [[h.key, h.value] for h in r.headers]] for r in rows],
    }
    if "table" in source:
        snapshots = spark.sql(f"SELECT operation, summary FROM {source['table']}.snapshots ORDER BY committed_at")
        out[name]["snapshots"] = [[s.operation, s.summary.get("kafkalog.next-offsets")] for s in snapshots.collect()]
spark.stop()
print("RESULT " + json.dumps(out))
"""


def _spark_conf(jar_list: list[str], rest_uri: str, sqlite_file, warehouse: str) -> dict[str, str]:
    return {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.jars": ",".join(jar_list),
        # (a) Iceberg's REST catalog, any name
        "spark.sql.catalog.rest": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.rest.type": "rest",
        "spark.sql.catalog.rest.uri": rest_uri,
        # (b) pyiceberg's SqlCatalog file read by Iceberg's JdbcCatalog: the Spark catalog's NAME is the
        # catalog_name column pyiceberg wrote ("kafkalog"); the warehouse is required though reads never use it;
        # jdbc.schema-version needs no setting (pyiceberg 0.12 creates the V1 tables, with iceberg_type, and
        # JdbcCatalog detects that column); nothing is created or altered in the file.
        "spark.sql.catalog.kafkalog": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.kafkalog.type": "jdbc",
        "spark.sql.catalog.kafkalog.uri": f"jdbc:sqlite:{sqlite_file}",
        "spark.sql.catalog.kafkalog.warehouse": warehouse,
        "spark.sql.catalog.kafkalog.jdbc.init-catalog-tables": "false",
        # (c) needs no catalog: spark.read.format("iceberg").load(".../metadata/000NN-<uuid>.metadata.json")
    }


@pytest.mark.iceberg_spark
def test_spark_reads_what_pyiceberg_wrote(request, tmp_path):
    pyspark = pytest.importorskip("pyspark")
    runtime, error = [], None
    try:
        runtime = jars.spark_runtime_jars(pyspark.__version__)
    except jars.Unavailable as e:
        error = e
    if error is not None and not pyspark.__version__.startswith(jars.SPARK_MINOR + "."):
        _unavailable(error, REQUIRE_SPARK)  # the runtime is for Spark 4.1 only
    elif error is not None:
        _unavailable(error, REQUIRE, REQUIRE_SPARK)  # Java or Maven missing, or Maven failed
    rest_server = request.getfixturevalue("rest_server")

    sqlite_file = tmp_path / "catalog.db"
    warehouse = (tmp_path / "wh").as_uri()
    catalogs = {
        "rest": load_catalog("w", type="rest", uri=rest_server.uri),
        "kafkalog": SqlCatalog("kafkalog", uri=f"sqlite:///{sqlite_file}", warehouse=warehouse),
    }
    metadata = {}
    for name, catalog in catalogs.items():
        table = _create(catalog, "topic_t")
        table.append(_rows(range(6)), snapshot_properties={NEXT_OFFSETS: '{"0": 6}'})
        # copy-on-write: 2024-01-01's file (offsets 0-2) is rewritten without offset 0, an "overwrite" snapshot
        table.delete(LessThan("offset", 1))
        table = catalog.load_table("kl.topic_t")
        assert [s.summary.operation.value for s in table.snapshots()] == ["append", "overwrite"]
        assert _offsets(table) == [1, 2, 3, 4, 5]
        metadata[name] = table.metadata_location
    assert metadata["rest"].startswith("file:/") and metadata["kafkalog"].startswith("file:///")
    catalog_bytes = hashlib.sha256(sqlite_file.read_bytes()).hexdigest()

    job = {
        "conf": _spark_conf(runtime, rest_server.uri, sqlite_file, warehouse),
        "reads": {
            "a_rest": {"table": "rest.kl.topic_t"},
            "b_jdbc": {"table": "kafkalog.kl.topic_t"},
            "c_path_file_uri": {"path": metadata["kafkalog"]},  # file:///...
            "c_path_plain": {"path": metadata["rest"].removeprefix("file:")},  # /...
        },
    }
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [sys.executable, "-c", SPARK_DRIVER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        timeout=SPARK_TIMEOUT_S,
    )
    result_lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and result_lines, f"the Spark driver failed ({done.returncode}):\n" + "\n".join(
        done.stderr.splitlines()[-40:]
    )
    reads = json.loads(result_lines[-1].removeprefix("RESULT "))

    expected = [
        [
            r["offset"],
            None if r["key"] is None else r["key"].hex().upper(),
            r["value"].hex().upper(),
            r["topic"],
            r["partition"],
            (r["timestamp"] - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1),
            r["timestampType"],
            [[h["key"], h["value"].hex().upper()] for h in r["headers"]],
        ]
        for r in _rows(range(1, 6)).to_pylist()
    ]
    assert sorted(reads) == sorted(job["reads"])
    for name, read in reads.items():
        assert read["schema"] == SPARK_SCHEMA, name
        assert all(read["nullable"]), name
        assert read["rows"] == expected, name
    for name in ("a_rest", "b_jdbc"):
        assert reads[name]["snapshots"] == [["append", '{"0": 6}'], ["overwrite", None]], name
    assert hashlib.sha256(sqlite_file.read_bytes()).hexdigest() == catalog_bytes  # Spark changed nothing there
