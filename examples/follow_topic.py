"""A streaming job that follows a topic while another query writes to it.

Run:  python examples/follow_topic.py [ROOT] [SECONDS]
One query writes a rate source into topic "clicks"; a second reads it with
spark.readStream.format("kafkalog") and keeps a running count per key. Stop and rerun: both resume
from their checkpoints, and the reader sees every record once.
"""

import os
import sys
import time

from kafkalog_ds.local_spark import (
    committed_in,
    exit_interrupted,
    exit_on_interrupt,
    say,
    session,
    still,
    stop_between_batches,
    stop_now,
)

PROG = "follow_topic"

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "follow-logs")
seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
stop = exit_on_interrupt(prog=PROG, summary=lambda: committed_in(root, "clicks"))  # Ctrl-C: at most two lines, 130
spark = session("kafkalog-follow", conf={"spark.sql.shuffle.partitions": "2"}, prog=PROG)

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
stop.immediate = False  # from here the first Ctrl-C stops the queries, the second ends the process
stop.message = (
    "interrupted: stopping both queries now (a micro-batch cut short is not committed: the next run writes it)"
)
say(f"{PROG}: writer started; waiting for its first micro-batch")
began = next_report = time.monotonic()
while not any(p["numInputRows"] for p in writer.recentProgress) and not stop.requested:
    writer.awaitTermination(0.5)  # returns at once if the writer died
    if writer.exception() is not None:
        sys.exit(f"{PROG}: error: the writer failed: {' '.join(str(writer.exception()).split())[:300]}")
    if time.monotonic() >= next_report + 5 and not stop.requested:
        next_report = time.monotonic()
        say(f"{PROG}: still waiting for the writer's first micro-batch ({next_report - began:.0f} s)")
if stop.requested:
    stop.immediate = True
    stop_now(writer)
    spark.stop()
    exit_interrupted(PROG, "stopped before the writer's first micro-batch: nothing was committed")

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

say(f"{PROG}: reader started; both run for {seconds} s")


def rows(query) -> int:
    return sum(p["numInputRows"] for p in query.recentProgress)


deadline = time.monotonic() + seconds  # how long the demo runs: a schedule, not a bound on a wait
next_report = time.monotonic() + 5
while time.monotonic() < deadline and not stop.requested and writer.isActive and reader.isActive:
    reader.awaitTermination(0.5)
    if time.monotonic() >= next_report and not stop.requested:
        say(f"{PROG}: the writer has committed {rows(writer)} records, the reader has read {rows(reader)}")
        next_report = time.monotonic() + 5
stop.immediate = True  # a Ctrl-C now ends the process
if stop.requested:
    stop_now(writer, reader)
    spark.stop()
    exit_interrupted(
        PROG,
        f"stopped: the writer committed {rows(writer)} records, the reader read {rows(reader)}; both resume from "
        "their checkpoints when run again",
    )
with still(f"{PROG}: still waiting for the writer's micro-batch under way to end"):
    stop_between_batches(writer)
say(f"{PROG}: writer stopped; the reader catches up")
with still(f"{PROG}: the reader is still catching up"):
    reader.processAllAvailable()
    reader.stop()
spark.sql("SELECT * FROM clicks_per_page ORDER BY page").show()
total = spark.sql("SELECT SUM(count) AS n FROM clicks_per_page").first().n
print(f"the reader counted {total} clicks")
spark.stop()
