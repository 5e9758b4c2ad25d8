"""A topic kept as an Iceberg table: a stream writes it, the maintenance pass materializes it, Spark SQL and
DuckDB query the table.

Run:  python examples/topic_as_table.py [ROOT]          (default ./table-logs, made afresh)
A streaming query writes 6,000 page views as JSON values into "views" (topic configs: table.mode=append,
table.value.format=json with a declared schema), with a few values that are not JSON; it stops between
micro-batches once it has committed them. One maintenance pass (`kafkalog maintain ROOT --once`, here its
Python form) materializes the topic into the table kafkalog.views of ROOT's own catalog, the bad values
also into kafkalog.views__errors. Then:

- Spark SQL queries the table through Iceberg's Spark runtime when this is pyspark 4.1 and the runtime's
  jars are given (KAFKALOG_ICEBERG_JARS: iceberg-spark-runtime-4.1_2.13-1.12.0.jar and sqlite-jdbc, comma
  separated; `python tools/iceberg/jars.py` resolves them in a checkout). The runtime exists for Spark 4.1
  only; elsewhere Spark SQL runs over the table's rows as pyiceberg scans them into Arrow, and says so.
- DuckDB queries the same table with iceberg_scan, its Iceberg extension loaded from the installed wheel.

Every count printed is checked against spark.read.format("kafkalog") of the topic; the script exits 1 if
one differs.
"""

import os
import shutil
import sys
import time

from kafkalog_ds.local_spark import committed_in, exit_on_interrupt, say, session, still, stop_between_batches
from storage.log_maintenance import run_once  # (what `kafkalog maintain ROOT --once` runs)
from storage.tables.readers import duckdb_connection, static_table, topic_table

PROG = "topic_as_table"
DEFAULT_ROOT = "table-logs"
ROWS = 6_000
root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_ROOT)
if len(sys.argv) <= 1:
    shutil.rmtree(root, ignore_errors=True)  # this example's own directory: start afresh
elif os.path.exists(root) and os.listdir(root):
    sys.exit(f"{PROG}: error: {root} is not empty; give a new directory")

stop = exit_on_interrupt(prog=PROG, summary=lambda: committed_in(root, "views"))  # Ctrl-C: one line, exit 130
jars = os.environ.get("KAFKALOG_ICEBERG_JARS", "")
catalog_db = os.path.join(root, ".kafkalog-tables", "catalog.db")
conf = {"spark.sql.session.timeZone": "UTC"}
if jars:  # Iceberg's JDBC catalog over ROOT's own SQLite catalog: it must be named "kafkalog"
    conf.update(
        {
            "spark.jars": jars,
            "spark.sql.catalog.kafkalog": "org.apache.iceberg.spark.SparkCatalog",
            "spark.sql.catalog.kafkalog.type": "jdbc",
            "spark.sql.catalog.kafkalog.uri": f"jdbc:sqlite:{catalog_db}",
            "spark.sql.catalog.kafkalog.warehouse": "file://" + os.path.join(root, ".kafkalog-tables", "warehouse"),
        }
    )
spark = session("kafkalog-topic-as-table", conf=conf, prog=PROG)
stop.attach(spark)

topic_config = {  # applied when the sink creates the topic
    "partitions": "2",
    "table.mode": "append",
    "table.value.format": "json",
    "table.value.schema": "user STRING, page STRING, ms BIGINT",
}
views = (
    spark.readStream.format("rate-micro-batch")  # its timestamps start now: retention keeps them
    .option("rowsPerBatch", ROWS // 2)
    .option("startTimestamp", int(time.time() * 1000))
    .load()
    .where(f"value < {ROWS}")
    .selectExpr(
        "CAST(value % 50 AS STRING) AS key",
        # every 1000th value is not JSON: it goes to the errors table, and its row keeps null columns
        "CASE WHEN value % 1000 = 999 THEN CAST('not json' AS BINARY) ELSE CAST(to_json(named_struct("
        "'user', concat('user-', CAST(value % 50 AS STRING)), 'page', concat('/page/', CAST(value % 7 AS STRING)),"
        " 'ms', value)) AS BINARY) END AS value",
        "timestamp",
    )
)
say(f"{PROG}: writing {ROWS} page views into topic 'views' of {root}")
query = (
    views.writeStream.format("kafkalog")
    .options(**topic_config)
    .option("topic", "views")
    .option("checkpointLocation", root + "-checkpoint")
    .trigger(processingTime="1 second")  # a gap between micro-batches, where stop_between_batches stops it
    .start(root)
)
with still(f"{PROG}: still writing (two micro-batches of {ROWS // 2})"):
    while query.isActive and sum(p["numInputRows"] for p in query.recentProgress) < ROWS:
        query.awaitTermination(0.5)  # until every view is committed: the rate source goes on with none after them
    stop_between_batches(query)
if query.exception() is not None:
    sys.exit(f"{PROG}: error: the streaming query failed: {query.exception()}")
shutil.rmtree(root + "-checkpoint", ignore_errors=True)

say(f"{PROG}: the maintenance pass materializes the topic")
reports = run_once(root, out=sys.stdout)
if reports.failed:
    sys.exit(f"{PROG}: error: the maintenance pass failed (see above)")
metadata = reports.tables[0].metadata_location
print(f"table kafkalog.views: {metadata}")

failures = []


def check(ok, what):
    print(f"{'ok' if ok else 'NOT OK'}: {what}")
    if not ok:
        failures.append(what)


log_rows = (
    spark.read.format("kafkalog")
    .option("subscribe", "views")
    .option("kafka.isolation.level", "read_committed")
    .load(root)
    .count()
)
if jars:
    spark.sql(
        "SELECT page, count(*) AS views, count(DISTINCT user) AS users FROM kafkalog.kafkalog.views "
        "WHERE page IS NOT NULL GROUP BY page ORDER BY page"
    ).show()
    table_rows = spark.sql("SELECT count(*) AS n FROM kafkalog.kafkalog.views").first().n
    errors = spark.sql("SELECT count(*) AS n FROM kafkalog.kafkalog.views__errors").first().n
    how = "Spark SQL through Iceberg's Spark runtime"
else:
    spark.createDataFrame(static_table(metadata).scan().to_arrow()).createOrReplaceTempView("views")
    spark.sql(
        "SELECT page, count(*) AS views, count(DISTINCT user) AS users FROM views "
        "WHERE page IS NOT NULL GROUP BY page ORDER BY page"
    ).show()
    table_rows = spark.sql("SELECT count(*) AS n FROM views").first().n
    errors = topic_table(root, "views", errors=True).scan().to_arrow().num_rows
    how = (
        "Spark SQL over pyiceberg's Arrow scan (Iceberg's Spark runtime exists for Spark 4.1 only; "
        "on pyspark 4.1 set KAFKALOG_ICEBERG_JARS to read the table with it)"
    )
check(table_rows == log_rows == ROWS, f"{how}: {table_rows} rows, as spark.read.format('kafkalog') reads {log_rows}")

con = duckdb_connection()
n, bad = con.execute(
    f"SELECT count(*), count(*) FILTER (WHERE page IS NULL) FROM iceberg_scan('{metadata}')"
).fetchone()
top = con.execute(
    f"SELECT user, count(*) AS views FROM iceberg_scan('{metadata}') WHERE user IS NOT NULL "
    f"GROUP BY user ORDER BY views DESC, user LIMIT 3"
).fetchall()
print(f"DuckDB: the three busiest users: {top}")
check(n == log_rows, f"DuckDB iceberg_scan: {n} rows")
check(bad == ROWS // 1000, f"{bad} values that were not JSON: null columns in the table, rows in views__errors")
check(errors == bad, f"the errors table holds {errors} of them")
spark.stop()
sys.exit(1 if failures else 0)
