"""A streaming job that follows a topic while another query writes to it.

Run:  python examples/follow_topic.py [ROOT] [SECONDS]
One query writes a rate source into topic "clicks"; a second reads it with
spark.readStream.format("kafkalog") and keeps a running count per key. Stop and rerun: both resume
from their checkpoints, and the reader sees every record once.
"""

import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "follow-logs")
seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
spark = (
    SparkSession.builder.master("local[2]")
    .appName("kafkalog-follow")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")

writer = (
    spark.readStream.format("rate")
    .option("rowsPerSecond", 200)
    .load()
    .selectExpr("CONCAT('page-', CAST(value % 5 AS STRING)) AS key", "CAST(value AS STRING) AS value")
    .writeStream.format("kafkalog")
    .option("topic", "clicks")
    .option("partitions", "2")
    .option("checkpointLocation", root + "-writer-ckpt")
    .trigger(processingTime="1 second")
    .start(root)
)
while not any(p["numInputRows"] for p in writer.recentProgress):  # the first micro-batch is committed
    time.sleep(0.5)

counts = (
    spark.readStream.format("kafkalog")
    .option("subscribe", "clicks")
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", "500")  # split across partitions by lag
    .load(root)
    .selectExpr("CAST(key AS STRING) AS page")
    .groupBy("page")
    .count()
)
reader = (
    counts.writeStream.outputMode("complete")
    .format("memory")
    .queryName("clicks_per_page")
    .option("checkpointLocation", root + "-reader-ckpt")
    .trigger(processingTime="2 seconds")
    .start()
)

time.sleep(seconds)
writer.stop()
reader.processAllAvailable()
reader.stop()
spark.sql("SELECT * FROM clicks_per_page ORDER BY page").show()
total = spark.sql("SELECT SUM(count) AS n FROM clicks_per_page").first().n
print(f"the reader counted {total} clicks")
spark.stop()
