"""A streaming pipeline into a Kafka-format log with no broker: rate source -> format("kafkalog").

Run:  python examples/streaming_pipeline.py [ROOT] [RECORDS]
The query runs until it has committed at least RECORDS new records (default 3000) to ROOT (default
./demo-logs), however long its micro-batches take on a busy machine, then stops between two micro-batches
(the first micro-batch carries every row the rate source made while Spark started: often more than RECORDS).
Progress goes to stderr every 5 s; Ctrl-C stops the query at once (a micro-batch it cuts short is not
committed: the next run writes it, exactly once), says what was committed, exit code 130. Then
the log is inspected with the `kafkalog` command (describe, consume) and read by kafka-python.
Run it again: the query resumes from its checkpoint (ROOT-checkpoint) and no row is written twice.
Exit code 1, with one line saying why, if the query failed or wrote nothing within --timeout.
"""

import os
import subprocess
import sys
import time

from kafkalog_ds.local_spark import (
    exit_interrupted,
    exit_on_interrupt,
    say,
    session,
    still,
    stop_between_batches,
    stop_now,
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


class Committed:
    """Data records committed to topic "events", as a read_committed consumer counts them (transaction markers
    take offsets but are not records), counted from the log incrementally: the log is the truth, not the query."""

    def __init__(self) -> None:
        self.upto: dict[int, int] = {}  # partition -> offset counted up to
        self.records = 0

    def __call__(self) -> int:
        from storage.errors import UnknownTopicOrPartitionError  # imported here: "starting Spark" comes first
        from storage.log_manager import LogManager

        lm = LogManager(root)
        try:
            parts = lm.partitions("events")
        except UnknownTopicOrPartitionError:
            return 0
        for tp in parts:
            with lm.open_log(tp) as log:
                counts = log.count_records(self.upto.get(tp.partition), isolation_level="read_committed")
            self.records += counts.records
            self.upto[tp.partition] = counts.end
        return self.records


committed = Committed()
stop = exit_on_interrupt(
    prog=PROG, summary=lambda: f"{committed()} records are committed in {root}; run again to resume"
)


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
    before = committed()
    if committed.upto:
        where = ", ".join(f"partition {p} at offset {end}" for p, end in sorted(committed.upto.items()))
        say(f"{PROG}: resuming from checkpoint {checkpoint}: events holds {before} records; appending from {where}")
    else:
        say(f"{PROG}: a new log in {root} (checkpoint {checkpoint})")
    stop.immediate = False  # from here the first Ctrl-C stops the query, the second ends the process
    stop.message = (
        "interrupted: stopping the query now (a micro-batch cut short is not committed: the next run writes it)"
    )
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
        if time.monotonic() >= next_report and not stop.requested:
            batches = sum(1 for p in query.recentProgress if p["numInputRows"])
            say(f"{PROG}: {written} records committed so far, in {batches} micro-batches")
            next_report = time.monotonic() + 5
    error = query.exception()
    if stop.requested:
        stop_now(query)  # a micro-batch cut short is not committed: the next run writes it, exactly once
    elif query.isActive:
        say(f"{PROG}: {written} records committed; stopping the query between two micro-batches")
        with still(f"{PROG}: still waiting for the micro-batch under way to end"):
            stop_between_batches(query, deadline=deadline)  # no batch is cut short
    stop.immediate = True  # a Ctrl-C now ends the process
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
        exit_interrupted(
            PROG,
            # no micro-batch count: a stop cuts the query short of reporting the progress of the last one
            f"stopped: committed {written} records into {root}; run again to resume from the checkpoint",
        )
    print(f"committed {written} records in {batches} micro-batches into {root}")
    say(f"{PROG}: reading the log back with kafkalog describe and consume (a first run compiles the decoder)")
    with still(f"{PROG}: still reading"):
        # in sessions of their own: a terminal's Ctrl-C reaches this script only, which ends them
        subprocess.run(kafkalog + ["describe", root], check=True, start_new_session=True)
        subprocess.run(
            kafkalog + ["consume", root, "--topic", "events", "--partition", "0", "--max-messages", "3"],
            check=True,
            start_new_session=True,
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
                if not batch.is_control_batch:  # a transaction marker takes an offset but is not a record
                    total += sum(1 for _ in batch)
    if total != committed():
        fail(f"kafka-python read {total} records, the log holds {committed()}")
    print(f"kafka-python read {total} records, every CRC valid")


main()
