"""A compacted changelog topic: upserts and deletes by key from Spark, compacted by the maintenance job,
read back as the latest value per key.

Run:  python examples/compacted_changelog.py [ROOT]
Three Spark writes put 3 versions of 1000 customers' addresses into "customers" (cleanup.policy=compact)
and then delete 100 customers with tombstones (null values). `kafkalog maintain ROOT --once` (here its
Python form) compacts the topic: every segment but the active one keeps only the latest record per key.
As with Kafka, the active segment is never cleaned, so a reader of a compacted topic still takes
the latest record per key (and drops tombstones) for the uncleaned head; here that gives the
same rows before and after compaction, from far fewer records.
"""

import os
import subprocess
import sys
import tempfile

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession, Window  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="kafkalog-changelog-"))
spark = (SparkSession.builder.master("local[2]").appName("kafkalog-compacted-changelog")
         .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

topic_config = {                      # applied when the sink creates the topic
    "cleanup.policy": "compact",
    "segment.bytes": "8192",          # small segments so there is something to clean
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": "0",       # tombstones may go on the cleaning after the one that marks them
}
for version in range(3):              # three upserts of every customer
    upserts = spark.range(0, 1000).selectExpr(
        "CONCAT('customer-', CAST(id AS STRING)) AS key",
        f"CONCAT('address v{version} of ', CAST(id AS STRING)) AS value")
    upserts.write.format("kafkalog").mode("append").options(**topic_config) \
        .option("topic", "customers").option("partitions", "2").save(root)
deletes = spark.range(0, 1000, 10).selectExpr(   # customers 0, 10, 20, ... leave: tombstones
    "CONCAT('customer-', CAST(id AS STRING)) AS key", "CAST(NULL AS STRING) AS value")
deletes.write.format("kafkalog").mode("append").option("topic", "customers").save(root)


def read_all():
    return spark.read.format("kafkalog").option("subscribe", "customers").load(root)


def latest_per_key(df):
    """The table a changelog describes: the latest record per key, tombstones dropped."""
    latest = Window.partitionBy("key").orderBy(F.col("offset").desc())
    return sorted(df.withColumn("n", F.row_number().over(latest)).where("n = 1 AND value IS NOT NULL")
                  .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value").collect())


expected_rows = latest_per_key(read_all())
before = read_all().count()
print(f"before compaction: {before} records, {len(expected_rows)} live customers")

kafkalog = [sys.executable, "-m", "kafkalog_ds"]
for _ in range(2):  # the first run marks tombstones with their delete horizon, the second drops them
    subprocess.run(kafkalog + ["maintain", root, "--once"], check=True)

after = read_all().count()
after_rows = latest_per_key(read_all())
ok = after_rows == expected_rows and after < before
print(f"after compaction: {after} records; latest per key unchanged: {after_rows == expected_rows}")
subprocess.run(kafkalog + ["describe", root, "--topic", "customers"], check=True)
spark.stop()
sys.exit(0 if ok else 1)
