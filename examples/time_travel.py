"""Time travel: read what a topic held between two timestamps, with the options of Spark's Kafka source.

Run:  python examples/time_travel.py [ROOT]          (default ./time-travel-logs, made afresh)
It writes a day of readings, one a minute (timestamps as event time), then asks for 06:00 to 09:00;
exit code 1 if that is not the 180 readings written in those three hours.
"""

import os
import shutil
import sys

from kafkalog_ds.local_spark import committed_in, exit_on_interrupt, say, session, still

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "time-travel-logs")
if len(sys.argv) <= 1:
    shutil.rmtree(root, ignore_errors=True)  # this example's own directory: start afresh
elif os.path.exists(root) and os.listdir(root):
    sys.exit(f"time_travel: error: {root} is not empty; give a new directory")
PROG = "time_travel"
exit_on_interrupt(prog=PROG, summary=lambda: committed_in(root, "readings"))  # Ctrl-C: one line, exit 130
spark = session("kafkalog-time-travel", conf={"spark.sql.session.timeZone": "UTC"}, prog=PROG)

day = 1_700_006_400_000  # 2023-11-15T00:00:00Z
readings = spark.range(0, 24 * 60).selectExpr(
    "CONCAT('sensor-', CAST(id % 4 AS STRING)) AS key",
    "CAST(20 + id % 7 AS STRING) AS value",
    f"TIMESTAMP_MILLIS({day} + id * 60000) AS timestamp",
)  # one reading a minute
say(f"{PROG}: writing a day of readings, one a minute, into topic 'readings'")
with still(f"{PROG}: still writing"):
    (
        readings.write.format("kafkalog")
        .mode("append")
        .option("topic", "readings")
        .option("partitions", "2")
        .option("segment.bytes", "16384")
        .save(root)
    )

start, end = day + 6 * 3_600_000, day + 9 * 3_600_000
window = (
    spark.read.format("kafkalog")
    .option("subscribe", "readings")
    .option("startingTimestamp", str(start))  # earliest offset with timestamp >= start
    .option("endingTimestamp", str(end))  # up to (not including) the first >= end
    .load(root)
)
say(f"{PROG}: reading 06:00 to 09:00 back, by timestamp")
with still(f"{PROG}: still reading"):
    window.selectExpr("CAST(key AS STRING) AS sensor", "timestamp").groupBy("sensor").agg(
        {"timestamp": "min", "*": "count"}
    ).orderBy("sensor").show(truncate=False)
    count = window.count()
print(f"{count} readings between 06:00 and 09:00 (expected 180)")
spark.stop()
sys.exit(0 if count == 180 else 1)
