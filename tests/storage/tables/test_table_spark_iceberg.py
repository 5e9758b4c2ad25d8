"""Spark reads a topic's table through Iceberg's Spark runtime (iceberg-spark-runtime-4.1_2.13 1.12.0, tools/iceberg)
and gets exactly the rows and the schema `spark.read.format("kafkalog")` gives at read_committed for the table's
range, in the same session: (b) the table in ROOT's own catalog, read as Iceberg's JDBC catalog on its SQLite
file (Spark catalog named "kafkalog", warehouse set), and (c) the table's metadata.json path, with no catalog.
A one-day timestamp filter is pushed down into Iceberg's scan, which then plans a fraction of the data files.

The topic is test_table_readers.build_events_topic's (transactions committed, aborted and open, headers,
null keys and values, weeks of timestamps, two passes). Spark runs in a subprocess with the runtime in
`spark.jars` (pytest-spark's shared session, if the run has one, has its jars fixed); each read comes back as
an Arrow IPC file. Iceberg's runtime exists for Spark 4.1 only: another pyspark skips this test unless
KAFKALOG_REQUIRE_ICEBERG_SPARK=1 (CI runs it in a pyspark 4.1 venv, .ci/run); without Java or Maven it skips
unless that or KAFKALOG_REQUIRE_ICEBERG=1 is set.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyiceberg")

from storage.tables.catalog import CATALOG_FILE, DEFAULT_CATALOG_NAME, WAREHOUSE_DIR  # noqa: E402
from storage.tables.table_state import TABLES_DIR  # noqa: E402
from tests.helpers.table_model import DAY  # noqa: E402
from tests.storage.tables.test_table_readers import arrow_rows, build_events_topic, model_rows  # noqa: E402
from tools.iceberg import jars  # noqa: E402

pytestmark = pytest.mark.iceberg_spark

SPARK_TIMEOUT_S = 900  # a hang guard only
SPARK_SCHEMA = (
    "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
    "timestampType:int,headers:array<struct<key:string,value:binary>>>"
)
REQUIRE = "KAFKALOG_REQUIRE_ICEBERG"
REQUIRE_SPARK = "KAFKALOG_REQUIRE_ICEBERG_SPARK"

SPARK_DRIVER = r"""
import json, sys
import pyarrow as pa
from pyspark.sql import SparkSession

job = json.load(sys.stdin)
builder = SparkSession.builder.master("local[2]")
for k, v in job["conf"].items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")

reads = {
    "kafkalog": spark.read.format("kafkalog")
    .option("subscribe", job["topic"])
    .option("includeHeaders", "true")
    .option("kafka.isolation.level", "read_committed")
    .option("endingOffsets", json.dumps({job["topic"]: job["offsets"]}))
    .load(job["root"]),
    "jdbc_catalog": spark.table(job["table"]),
    "metadata_path": spark.read.format("iceberg").load(job["metadata"]),
}
out = {"reads": {}, "scans": {}}
for name, df in reads.items():
    table = df.toArrow()
    with pa.OSFile(f"{job['out']}/{name}.arrow", "wb") as f, pa.ipc.new_file(f, table.schema) as w:
        w.write_table(table)
    out["reads"][name] = {"simple": df.schema.simpleString(), "json": df.schema.json()}


def scan_node(df):
    # the executed plan's Iceberg BatchScan: its metrics count the data files the scan planned
    todo = [df._jdf.queryExecution().executedPlan()]
    while todo:
        node = todo.pop()
        if node.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
            node = node.executedPlan()
        if node.getClass().getSimpleName() == "BatchScanExec":
            return node
        children = node.children().iterator()
        while children.hasNext():
            todo.append(children.next())
    raise AssertionError("no BatchScanExec in " + df._jdf.queryExecution().executedPlan().toString())


day = f"timestamp >= '{job['day'][0]}' AND timestamp < '{job['day'][1]}'"
for name, df in [("all", spark.table(job["table"])), ("day", spark.table(job["table"]).where(day))]:
    df = df.select("partition", "offset")
    rows = df.collect()
    node = scan_node(df)  # of the plan collect() ran
    metrics = {k: int(node.metrics().apply(k).value()) for k in ("resultDataFiles", "skippedDataFiles")}  # Iceberg's
    out["scans"][name] = {"rows": sorted([r.partition, r.offset] for r in rows), "plan": node.toString(), **metrics}
day_rows = reads["kafkalog"].where(day).select("partition", "offset").collect()
out["scans"]["kafkalog_day"] = {"rows": sorted([r.partition, r.offset] for r in day_rows)}
spark.stop()
print("RESULT " + json.dumps(out))
"""


def _runtime_jars() -> list[str]:
    """The runtime's jars, or the test skips (fails where a variable requires it) saying why not."""
    pyspark = pytest.importorskip("pyspark")
    error = None
    try:
        return jars.spark_runtime_jars(pyspark.__version__)
    except jars.Unavailable as e:
        error = e
    required = (
        (REQUIRE_SPARK,) if not pyspark.__version__.startswith(jars.SPARK_MINOR + ".") else (REQUIRE, REQUIRE_SPARK)
    )
    if any(os.environ.get(var) == "1" for var in required):
        pytest.fail(f"Spark cannot read the tables through Iceberg here: {error}", pytrace=False)
    pytest.skip(str(error).splitlines()[0])


def _iso_day(ms: int) -> tuple[str, str]:
    start = dt.datetime.fromtimestamp(ms // DAY * DAY / 1000, dt.timezone.utc)
    return start.strftime("%Y-%m-%d %H:%M:%S"), (start + dt.timedelta(days=1)).strftime("%Y-%m-%d %H:%M:%S")


def _read_arrow(path: Path):
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def test_spark_reads_the_table_through_iceberg_as_kafkalog_reads_the_topic(tmp_path):
    runtime = _runtime_jars()
    root = tmp_path / "logs"
    model, passes = build_events_topic(str(root))
    location, offsets = passes[-1]
    tables = root / TABLES_DIR
    catalog_db = tables / CATALOG_FILE
    catalog_bytes = hashlib.sha256(catalog_db.read_bytes()).hexdigest()

    committed = model.committed(offsets)
    busiest = Counter(r.ts // DAY for r in committed).most_common(1)[0][0]  # the day with the most rows
    day = _iso_day(busiest * DAY)
    out = tmp_path / "spark"
    out.mkdir()
    job = {
        "conf": {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "2",
            "spark.jars": ",".join(runtime),
            # (b) ROOT's catalog as Iceberg's JDBC catalog: named as pyiceberg's rows name it, warehouse required
            f"spark.sql.catalog.{DEFAULT_CATALOG_NAME}": "org.apache.iceberg.spark.SparkCatalog",
            f"spark.sql.catalog.{DEFAULT_CATALOG_NAME}.type": "jdbc",
            f"spark.sql.catalog.{DEFAULT_CATALOG_NAME}.uri": f"jdbc:sqlite:{catalog_db}",
            f"spark.sql.catalog.{DEFAULT_CATALOG_NAME}.warehouse": (tables / WAREHOUSE_DIR).as_uri(),
            f"spark.sql.catalog.{DEFAULT_CATALOG_NAME}.jdbc.init-catalog-tables": "false",
        },
        "root": str(root),
        "topic": "events",
        "offsets": {str(p): o for p, o in sorted(offsets.items())},
        "table": f"{DEFAULT_CATALOG_NAME}.kafkalog.events",
        "metadata": location,  # (c)
        "day": day,
        "out": str(out),
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
    result = json.loads(result_lines[-1].removeprefix("RESULT "))

    # rows: the kafkalog source's are the model's; both Iceberg reads are exactly those, null headers included
    want = arrow_rows(_read_arrow(out / "kafkalog.arrow"))
    assert want == model_rows(model, offsets)
    assert any(r[7] is None for r in want) and any(r[7] for r in want)
    for name in ("jdbc_catalog", "metadata_path"):
        table = _read_arrow(out / f"{name}.arrow")
        assert arrow_rows(table) == want, name
        assert table.schema.equals(_read_arrow(out / "kafkalog.arrow").schema), name

    # schemas: the Kafka source's, names, types and nullability, from all three
    reads = result["reads"]
    assert {name: r["simple"] for name, r in reads.items()} == dict.fromkeys(reads, SPARK_SCHEMA)
    assert reads["jdbc_catalog"]["json"] == reads["kafkalog"]["json"] == reads["metadata_path"]["json"]

    # a one-day timestamp filter is pushed into Iceberg's scan: it plans at most a fifth of the data files
    scans = result["scans"]
    assert "timestamp >= " in scans["day"]["plan"] and "timestamp < " in scans["day"]["plan"], scans["day"]["plan"]
    total = scans["all"]["resultDataFiles"]
    assert scans["all"]["skippedDataFiles"] == 0 and total >= 20, scans["all"]
    assert 0 < scans["day"]["resultDataFiles"] <= total / 5, scans["day"]
    assert scans["all"]["rows"] == [[r[3], r[4]] for r in want]
    ordered = sorted(committed, key=lambda r: (r.partition, r.offset))
    in_day = [[r.partition, r.offset] for r in ordered if r.ts // DAY == busiest]
    assert scans["day"]["rows"] == scans["kafkalog_day"]["rows"] == in_day and len(in_day) >= 10

    assert hashlib.sha256(catalog_db.read_bytes()).hexdigest() == catalog_bytes  # Spark changed nothing there
