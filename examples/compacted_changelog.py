"""A compacted changelog topic: upserts and deletes by key from Spark, compacted by the maintenance job,
read back as the latest value per key.

Run:  python examples/compacted_changelog.py [ROOT]          (default ./changelog-logs, made afresh)
Spark writes 3 versions of 1000 customers' addresses into "customers" (cleanup.policy=compact),
deletes 100 of them with tombstones (null values), and goes on writing new customers, so the segments
holding the tombstones roll and become cleanable (the active segment never is, as in Kafka). The
maintenance job (`kafkalog maintain ROOT --once`, here its Python form) runs twice, with more writes
in between, as it would on a schedule:

- the first cleaning keeps only the latest record per key, and keeps the tombstones, marking each
  with its delete horizon (now + delete.retention.ms, 0 here), as Kafka's cleaner does, so that a
  reader part way through the log still sees the delete;
- the second cleaning, past that horizon, drops the tombstones.

The rows a reader takes from the topic (latest record per key, tombstones dropped) are checked
against a model of the writes before and after; the script exits 1 if anything it prints is not so.
"""

import os
import shutil
import sys

from pyspark.sql import Window
from pyspark.sql import functions as F

from kafkalog_ds.local_spark import committed_in, exit_on_interrupt, say, session, still
from storage.log_maintenance import run_once  # (what `kafkalog maintain ROOT --once` runs)

DEFAULT_ROOT = "changelog-logs"
root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_ROOT)
if len(sys.argv) <= 1:
    shutil.rmtree(root, ignore_errors=True)  # this example's own directory: start afresh
elif os.path.exists(root) and os.listdir(root):
    sys.exit(f"compacted_changelog: error: {root} is not empty; give a new directory")

PROG = "compacted_changelog"
exit_on_interrupt(prog=PROG, summary=lambda: committed_in(root, "customers"))  # Ctrl-C: one line, exit 130
spark = session("kafkalog-compacted-changelog", conf={"spark.sql.session.timeZone": "UTC"}, prog=PROG)

topic_config = {  # applied when the sink creates the topic
    "cleanup.policy": "compact",
    "segment.bytes": "8192",  # small segments so there is something to clean
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": "0",  # a tombstone may go on the cleaning after the one that marks it
}
model = {}  # what the changelog describes: customer -> address, deletes removed
written = 0


def upsert(ids, version):
    global written
    df = spark.createDataFrame(
        [(f"customer-{i}", f"address v{version} of {i}") for i in ids], "key string, value string"
    )
    df.write.format("kafkalog").mode("append").options(**topic_config).option("topic", "customers").option(
        "partitions", "2"
    ).save(root)
    model.update({f"customer-{i}": f"address v{version} of {i}" for i in ids})
    written += len(ids)


def delete(ids):
    global written
    df = spark.createDataFrame([(f"customer-{i}", None) for i in ids], "key string, value string")
    df.write.format("kafkalog").mode("append").option("topic", "customers").save(root)
    for i in ids:
        model.pop(f"customer-{i}", None)
    written += len(ids)


def read_all():
    return spark.read.format("kafkalog").option("subscribe", "customers").load(root)


def latest_per_key(df):
    """The table a changelog describes: the latest record per key, tombstones dropped."""
    latest = Window.partitionBy("key").orderBy(F.col("offset").desc())
    return dict(
        df.withColumn("n", F.row_number().over(latest))
        .where("n = 1 AND value IS NOT NULL")
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
        .collect()
    )


def tombstones():
    return read_all().where("value IS NULL").count()


def maintain(label):
    print(f"--- maintenance pass {label}")
    reports = run_once(root, out=sys.stdout)
    if any(r.errors for r in reports):
        sys.exit("compacted_changelog: error: a maintenance pass failed (see above)")
    return sum(r.tombstones_dropped for r in reports)


failures = []


def check(ok, what):
    print(f"{'ok' if ok else 'NOT OK'}: {what}")
    if not ok:
        failures.append(what)


say(f"{PROG}: writing 3 versions of 1000 customers, 100 deletes and 1000 new customers (6 Spark writes)")
with still(f"{PROG}: still writing"):
    for version in range(3):  # three upserts of every customer
        upsert(range(1000), version)
    delete(range(0, 1000, 10))  # customers 0, 10, 20, ... leave: 100 tombstones
    upsert(range(1000, 2000), 0)  # new customers: the tombstones' segments roll

say(f"{PROG}: reading the topic back (Spark)")
with still(f"{PROG}: still reading"):
    before = read_all().count()
    check(before == written and tombstones() == 100, f"before compaction: {before} records, 100 tombstones")
    check(latest_per_key(read_all()) == model, f"latest per key = the model's {len(model)} live customers")

dropped_first = maintain("1")  # compacts; tombstones kept and marked with their horizon
with still(f"{PROG}: still reading"):
    after_first = read_all().count()
    check(
        dropped_first == 0 and tombstones() == 100,
        f"after the first pass: {after_first} records, the 100 tombstones kept (marked)",
    )
    check(latest_per_key(read_all()) == model, "latest per key unchanged")

say(f"{PROG}: writing 1000 more customers: the log is dirty again")
with still(f"{PROG}: still writing"):
    upsert(range(2000, 3000), 0)  # the changelog goes on: the log is dirty again
dropped_second = maintain("2")  # past the horizon: the tombstones go
with still(f"{PROG}: still reading"):
    after_second = read_all().count()
    check(
        dropped_second == 100 and tombstones() == 0,
        f"after the second pass: {after_second} records, {dropped_second} tombstones dropped, none left",
    )
    check(
        latest_per_key(read_all()) == model and after_second < written,
        f"latest per key unchanged: {len(model)} live customers from {after_second} of {written} records written",
    )
spark.stop()
sys.exit(1 if failures else 0)
