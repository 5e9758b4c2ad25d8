"""A streaming pipeline into a Kafka-format log with no broker: rate source -> format("kafkalog").

Run:  python examples/streaming_pipeline.py [ROOT] [SECONDS]
Then the log is inspected with the `kafkalog` command (describe, consume) and read by kafka-python.
Stop it and run it again: the query resumes from its checkpoint and no row is written twice.
"""

import os
import subprocess
import sys

# Spark's Python workers must run this interpreter, which has kafkalog-ds installed.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from pyspark.sql import SparkSession  # noqa: E402

root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo-logs")
seconds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
checkpoint = root + "-checkpoint"

spark = (SparkSession.builder.master("local[2]").appName("kafkalog-demo")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")

events = (spark.readStream.format("rate").option("rowsPerSecond", 1000).load()
          .selectExpr("CONCAT('user-', CAST(value % 50 AS STRING)) AS key",   # Kafka's partitioner on the key
                      "TO_JSON(NAMED_STRUCT('n', value, 'at', timestamp)) AS value",
                      "timestamp",                                            # becomes the record's CreateTime
                      "ARRAY(NAMED_STRUCT('key', 'source', 'value', CAST('rate' AS BINARY))) AS headers"))

query = (events.writeStream.format("kafkalog")                # found with no register() call
         .option("topic", "events")
         .option("partitions", "3")                           # used when the sink creates the topic
         .option("compression.type", "zstd")
         .option("segment.bytes", "262144")                   # any Kafka topic config, for a new topic
         .option("checkpointLocation", checkpoint)            # also makes the writer id: exactly-once
         .trigger(processingTime="2 seconds")
         .start(root))
query.awaitTermination(seconds)
query.stop()
print(f"committed {query.lastProgress['batchId'] + 1 if query.lastProgress else 0} micro-batches into {root}")
spark.stop()

subprocess.run(["kafkalog", "describe", root], check=True)
subprocess.run(["kafkalog", "consume", root, "--topic", "events", "--partition", "0", "--max-messages", "3"],
               check=True)

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
print(f"kafka-python read {total} records, every CRC valid")
