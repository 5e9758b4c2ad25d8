"""A streaming query for the kill -9 test: `python tests/spark/spark_kill_driver.py ROOT CHECKPOINT N_ROWS [INPUT]`.

Reads INPUT (parquet files of row numbers, written if missing; default CHECKPOINT + "-input") one
file per micro-batch and appends it to ROOT's topic "events" with format("kafkalog"), under
CHECKPOINT. Exits 0 once every file there is committed. Killed at any moment and started again with the
same arguments, it resumes from the checkpoint; the log must still hold every row exactly once.
"""

from __future__ import annotations

import os
import sys
import time

TOPIC = "events"
PARTITIONS = 3
ROWS_PER_FILE = 40
TRIGGER = "500 milliseconds"


def write_input(input_dir: str, n_rows: int) -> None:
    """Row numbers 0..n_rows-1 as ROWS_PER_FILE-row parquet files; only missing files are written,
    each under a hidden name (Spark skips those) and then renamed, so a reader never sees half a file.
    Grow it by whole files only: a short last file is not rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(input_dir, exist_ok=True)
    for i, lo in enumerate(range(0, n_rows, ROWS_PER_FILE)):
        path = os.path.join(input_dir, f"part-{i:05d}.parquet")
        if os.path.exists(path):
            continue
        tmp = os.path.join(input_dir, f".part-{i:05d}.parquet.tmp")
        ids = pa.array(range(lo, min(lo + ROWS_PER_FILE, n_rows)), pa.int64())
        pq.write_table(pa.table({"id": ids}), tmp)
        os.rename(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    root, ckpt, n_rows = argv[1], argv[2], int(argv[3])
    input_dir = argv[4] if len(argv) == 5 else ckpt.rstrip("/") + "-input"
    write_input(input_dir, n_rows)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    from pyspark.sql import SparkSession

    t0 = time.monotonic()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("kafkalog-kill-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    # Every 5th key is null (round-robin routing), the rest are keyed (murmur2): both must route the
    # same way when Spark replays a batch, or the per-partition skip would drop or double rows.
    stream = (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", 1)
        .parquet(input_dir)
        .selectExpr(
            "CASE WHEN id % 5 = 0 THEN NULL ELSE CAST(id % 11 AS STRING) END AS key", "CAST(id AS STRING) AS value"
        )
    )
    # segment.bytes this small makes most tasks' staging logs big enough to be adopted (renamed in)
    # and the rest copied, so kills land in both commit paths
    q = (
        stream.writeStream.format("kafkalog")
        .option("topic", TOPIC)
        .option("partitions", str(PARTITIONS))
        .option("segment.bytes", "300")
        .option("checkpointLocation", ckpt)
        .trigger(processingTime=TRIGGER)
        .start(root)
    )
    print(f"driver: query started after {time.monotonic() - t0:.1f}s", flush=True)
    q.processAllAvailable()
    print(f"driver: every input file committed after {time.monotonic() - t0:.1f}s", flush=True)
    q.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
