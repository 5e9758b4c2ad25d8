"""A streaming pipeline into a Kafka-format log with no broker: rate source -> format("kafkalog").

Run:  python examples/streaming_pipeline.py [ROOT] [RECORDS]
The query runs until it has committed at least RECORDS new records (default 3000) to ROOT (default
./demo-logs), however long its micro-batches take on a busy machine, then stops between two micro-batches
(the first micro-batch carries every row the rate source made while Spark started: often more than RECORDS).
Progress goes to stderr every 5 s; Ctrl-C stops the query between micro-batches, exit code 130. Then
the log is inspected with the `kafkalog` command (describe, consume) and read by kafka-python.
Run it again: the query resumes from its checkpoint (ROOT-checkpoint) and no row is written twice.
Exit code 1, with one line saying why, if the query failed or wrote nothing within --timeout.
"""

import os
import subprocess
import sys
import time

from kafkalog_ds.local_spark import (
    EXIT_INTERRUPTED,
    Interrupt,
    say,
    session,
    still,
    stop_between_batches,
)

PROG = "streaming_pipeline"
root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "demo-logs")
target = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
timeout_s = float(os.environ.get("KAFKALOG_DEMO_TIMEOUT_S", "600"))  # a bound for a broken setup, not a schedule
checkpoint = root + "-checkpoint"
kafkalog = [sys.executable, "-m", "kafkalog_ds"]  # the `kafkalog` command of this interpreter
say(f"{PROG}: a Spark streaming query into a Kafka-format log in {root}, then reading it back")


def fail(reason: str) -> None:
    print(f"{PROG}: error: {reason}", file=sys.stderr)
    sys.exit(1)


def end_offsets() -> dict[int, tuple[int, int]]:
    """Partition -> (log start, log end) of topic "events" now: what the sink has committed (the log is
    the truth, not the query)."""
    from storage.errors import UnknownTopicOrPartitionError  # imported here: "starting Spark" comes first
    from storage.log_manager import LogManager

    lm = LogManager(root)
    try:
        parts = lm.partitions("events")
    except UnknownTopicOrPartitionError:
        return {}
    out = {}
    for tp in parts:
        with lm.open_log(tp) as log:
            out[tp.partition] = (log.log_start_offset, log.log_end_offset)
    return out


def committed() -> int:
    return sum(end - start for start, end in end_offsets().values())


def run() -> tuple[int, int, bool]:
    """Run the query to `target` new records (or Ctrl-C); (records written, micro-batches, interrupted)."""
    spark = session("kafkalog-demo", conf={"spark.sql.shuffle.partitions": "2"}, prog=PROG)
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
    ends = end_offsets()
    before = sum(end - start for start, end in ends.values())
    if ends:
        where = ", ".join(f"partition {p} at offset {end}" for p, (_, end) in sorted(ends.items()))
        say(f"{PROG}: resuming from checkpoint {checkpoint}: events holds {before} records; appending from {where}")
    else:
        say(f"{PROG}: a new log in {root} (checkpoint {checkpoint})")
    with Interrupt(spark, prog=PROG) as stop:
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
        say(f"{PROG}: query started; waiting for the first micro-batch (rate source, 1000 rows a second)")
        deadline = time.monotonic() + timeout_s
        next_report = time.monotonic() + 5
        written = 0
        while query.isActive and written < target and not stop.requested and time.monotonic() < deadline:
            query.awaitTermination(0.5)  # returns at once if the query died
            written = committed() - before
            if time.monotonic() >= next_report:
                batches = sum(1 for p in query.recentProgress if p["numInputRows"])
                say(f"{PROG}: {written} records committed so far, in {batches} micro-batches")
                next_report = time.monotonic() + 5
        error = query.exception()
        stop.immediate = True  # a Ctrl-C now cancels at once
        if query.isActive:
            say(f"{PROG}: {written} records committed; stopping the query between two micro-batches")
            with still(f"{PROG}: still waiting for the micro-batch under way to end"):
                stop_between_batches(query, deadline=deadline)  # no batch is cut short
        batches = sum(1 for p in query.recentProgress if p["numInputRows"])
    spark.stop()
    written = committed() - before
    if error is not None:
        fail(f"the query failed: {' '.join(str(error).split())[:500]}")
    if written == 0 and not stop.requested:
        fail(
            f"the query committed no records to {root} in {timeout_s:.0f} s (a very busy machine? set "
            f"KAFKALOG_DEMO_TIMEOUT_S)"
        )
    return written, batches, stop.requested


def main() -> None:
    written, batches, interrupted = run()
    if interrupted:
        print(
            f"{PROG}: interrupted: committed {written} records in {batches} micro-batches into {root}; run again "
            "to resume from the checkpoint",
            file=sys.stderr,
        )
        sys.exit(EXIT_INTERRUPTED)
    print(f"committed {written} records in {batches} micro-batches into {root}")
    say(f"{PROG}: reading the log back with kafkalog describe and consume (a first run compiles the decoder)")
    with still(f"{PROG}: still reading"):
        subprocess.run(kafkalog + ["describe", root], check=True)
        subprocess.run(
            kafkalog + ["consume", root, "--topic", "events", "--partition", "0", "--max-messages", "3"], check=True
        )

    # an independent Kafka client reads the same files
    from kafka.record import MemoryRecords

    total = 0
    for p in range(3):
        d = os.path.join(root, f"events-{p}")
        for name in sorted(f for f in os.listdir(d) if f.endswith(".log")):
            with open(os.path.join(d, name), "rb") as f:
                records = MemoryRecords(f.read())
            while records.has_next():
                batch = records.next_batch()
                assert batch.validate_crc()
                total += sum(1 for _ in batch)
    if total != committed():
        fail(f"kafka-python read {total} records, the log holds {committed()}")
    print(f"kafka-python read {total} records, every CRC valid")


try:
    main()
except KeyboardInterrupt:
    print(f"{PROG}: interrupted; {committed()} records are in {root}; run again to resume", file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)
