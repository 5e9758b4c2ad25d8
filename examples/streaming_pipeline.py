"""A streaming pipeline into a Kafka-format log with no broker: rate source -> format("kafkalog").

Run:  python examples/streaming_pipeline.py [ROOT] [RECORDS]
The query runs until it has committed RECORDS records (default 3000) to ROOT (default ./demo-logs),
however long its micro-batches take on a busy machine, then stops between two micro-batches. Then
the log is inspected with the `kafkalog` command (describe, consume) and read by kafka-python.
Run it again: the query resumes from its checkpoint (ROOT-checkpoint) and no row is written twice.
Exit code 1, with one line saying why, if the query failed or wrote nothing within --timeout.
"""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Spark's Python workers must run this interpreter, which has kafkalog-ds installed.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

from storage.errors import UnknownTopicOrPartitionError  # noqa: E402
from storage.log_manager import LogManager  # noqa: E402

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo-logs")
target = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
timeout_s = float(os.environ.get("KAFKALOG_DEMO_TIMEOUT_S", "600"))  # a bound for a broken setup, not a schedule
checkpoint = root + "-checkpoint"
kafkalog = [sys.executable, "-m", "kafkalog_ds"]  # the `kafkalog` command of this interpreter


def fail(reason: str) -> None:
    print(f"streaming_pipeline: error: {reason}", file=sys.stderr)
    sys.exit(1)


def committed() -> int:
    """Records in topic "events" now: what the sink has committed (the log is the truth, not the query)."""
    lm = LogManager(root)
    try:
        parts = lm.partitions("events")
    except UnknownTopicOrPartitionError:
        return 0
    total = 0
    for tp in parts:
        with lm.open_log(tp) as log:
            total += log.log_end_offset - log.log_start_offset
    return total


# Spark's own logging: errors only, from the start (setLogLevel comes after the startup lines). Spark
# reads log4j2.properties from SPARK_CONF_DIR; the setting is this process's, nothing is installed.
conf_dir = tempfile.mkdtemp(prefix="kafkalog-demo-conf-")
atexit.register(shutil.rmtree, conf_dir, True)  # a temporary directory: gone when the demo ends
with open(os.path.join(conf_dir, "log4j2.properties"), "w") as f:
    f.write(
        "rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n"
        "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer\nlogger.repl.level = error\n"
        "appender.console.type = Console\nappender.console.name = console\nappender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\nappender.console.layout.pattern = %p %c{1}: %m%n\n"
    )
os.environ.setdefault("SPARK_CONF_DIR", conf_dir)
spark = (
    SparkSession.builder.master("local[2]")
    .appName("kafkalog-demo")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")

events = (
    spark.readStream.format("rate")
    .option("rowsPerSecond", 1000)
    .load()
    .selectExpr(
        "CONCAT('user-', CAST(value % 50 AS STRING)) AS key",  # Kafka's partitioner on the key
        "TO_JSON(NAMED_STRUCT('n', value, 'at', timestamp)) AS value",
        "timestamp",  # becomes the record's CreateTime
        "ARRAY(NAMED_STRUCT('key', 'source', 'value', CAST('rate' AS BINARY))) AS headers",
    )
)

before = committed()
query = (
    events.writeStream.format("kafkalog")  # found with no register() call
    .option("topic", "events")
    .option("partitions", "3")  # used when the sink creates the topic
    .option("compression.type", "zstd")
    .option("segment.bytes", "262144")  # any Kafka topic config, for a new topic
    .option("checkpointLocation", checkpoint)  # also makes the writer id: exactly-once
    .trigger(processingTime="1 second")
    .start(root)
)

deadline = time.monotonic() + timeout_s
while query.isActive and committed() - before < target and time.monotonic() < deadline:
    query.awaitTermination(0.5)  # returns at once if the query died
error = query.exception()
# Stop between two micro-batches, so no batch is cut short (that logs an interrupted task).
while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
    time.sleep(0.05)
query.stop()
batches = len(query.recentProgress)
spark.stop()

written = committed() - before
if error is not None:
    fail(f"the query failed: {' '.join(str(error).split())[:500]}")
if written == 0:
    fail(
        f"the query committed no records to {root} in {timeout_s:.0f} s (a very busy machine? set "
        f"KAFKALOG_DEMO_TIMEOUT_S)"
    )
print(f"committed {written} records in {batches} micro-batches into {root}")

subprocess.run(kafkalog + ["describe", root], check=True)
subprocess.run(kafkalog + ["consume", root, "--topic", "events", "--partition", "0", "--max-messages", "3"], check=True)

# an independent Kafka client reads the same files
from kafka.record import MemoryRecords  # noqa: E402

total = 0
for p in range(3):
    d = os.path.join(root, f"events-{p}")
    for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
        records = MemoryRecords(open(os.path.join(d, name), "rb").read())
        while records.has_next():
            batch = records.next_batch()
            assert batch.validate_crc()
            total += sum(1 for _ in batch)
if total != committed():
    fail(f"kafka-python read {total} records, the log holds {committed()}")
print(f"kafka-python read {total} records, every CRC valid")
