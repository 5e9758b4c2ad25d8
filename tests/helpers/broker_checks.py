"""What a hand-off to a real broker is checked against: the broker's log (no recovery, rebuild, truncation or
stray directory), the records its Java consumer returns, and the records kafkalog's engine reads, in one shape:
(offset, timestamp, timestampType, key, value, headers)."""

from __future__ import annotations

import base64
import re
import time

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tools.realkafka.broker import BrokerError

# what a broker logs when it recovers, rebuilds, truncates or sets aside what it was given
BAD_SIGNS = [
    "Found invalid messages",
    "Corruption found",
    "recovering segment and rebuilding index files",
    "Found a corrupted index file",
    "marked stray",
    "Deleting all segments",
    "Truncation detected",
    "Recovering unflushed segment",
    "since no clean shutdown file was found",
    "Found an orphaned index file",
    "Found invalid offset during recovery",
    "Caught segment overflow error",
    "is less than start offset",
    "Loaded stray log",
]
LOAD_RE = re.compile(
    r"Completed load of Log\(dir=(?P<dir>[^,]+), .*?\) with (?P<segments>\d+) segments, "
    r"local-log-start-offset (?P<start>\d+) and log-end-offset (?P<end>\d+)"
)
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


def bad_lines(log: str, topics) -> list[str]:
    """Lines of a broker log that show recovery, rebuilds, truncation, stray dirs or corrupt data (the metadata
    log's own recovery at each start aside), and any WARN or ERROR naming one of the topics."""
    return [
        line
        for line in log.splitlines()
        if any(s in line for s in BAD_SIGNS)
        and "__cluster_metadata" not in line
        or re.search(r"\] (WARN|ERROR) ", line)
        and any(t in line for t in topics)
    ]


def kafkalog_records(
    root: str | LogManager, topic: str, isolation_level: str = "read_uncommitted"
) -> dict[int, list[tuple]]:
    """partition -> records as kafkalog's engine reads them from its log start (`root`: a path, or a LogManager
    the caller opened, as an S3 ROOT needs with its storage options)."""
    lm = root if isinstance(root, LogManager) else LogManager(root)
    out = {}
    for tp in lm.partitions(topic):
        rows = []
        with lm.open_log(tp) as log:
            for batch in log.read_records(log.log_start_offset, isolation_level=isolation_level):
                d = batch.to_pydict()
                for i in range(batch.num_rows):
                    rows.append(
                        (
                            d["offset"][i],
                            d["timestamp"][i],
                            TIMESTAMP_TYPES[d["timestampType"][i]],
                            d["key"][i],
                            d["value"][i],
                            tuple((h["key"], h["value"]) for h in d["headers"][i] or ()),
                        )
                    )
        out[tp.partition] = rows
    return out


def _unb64(text):
    return None if text is None else base64.b64decode(text)


def consumed(broker, topics, partitions: int, **consume) -> dict[str, dict[int, list[tuple]]]:
    """Every record of each topic as Kafka's Java consumer returns it, in kafkalog's shape. `consume` goes into
    each consume command (for example isolation="read_committed")."""
    results = broker.tool(*({"op": "consume", "topic": t, **consume} for t in topics))
    return {topic: consumed_rows(records, partitions) for topic, records in zip(topics, results, strict=True)}


def consumed_rows(records: list[dict], partitions: int) -> dict[int, list[tuple]]:
    """The result of one KafkaTool consume command in kafkalog's shape, partition -> records (for a caller that
    runs it among other commands in one `broker.tool` call; `consumed` runs its own)."""
    per: dict[int, list[tuple]] = {p: [] for p in range(partitions)}
    for r in records:
        per[r["partition"]].append(
            (
                r["offset"],
                r["timestamp"],
                r["timestampType"],
                _unb64(r["key"]),
                _unb64(r["value"]),
                tuple((k, _unb64(v)) for k, v in r["headers"]),
            )
        )
    return {p: sorted(rows) for p, rows in per.items()}


def differences(expected: dict, got: dict) -> list[str]:
    """partition -> records, compared record by record."""
    diffs = []
    for p in sorted(set(expected) | set(got)):
        a, b = expected.get(p, []), got.get(p, [])
        if len(a) != len(b):
            diffs.append(f"partition {p}: {len(a)} records expected, {len(b)} read")
        for x, y in zip(a, b, strict=False):
            if x != y:
                diffs.append(f"partition {p}: expected {x!r:.200}, read {y!r:.200}")
    return diffs


def wait(condition, what: str, broker, timeout: float = 180.0):
    """Poll a condition (the broker's own progress), failing with the broker's log after a hang guard."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not broker.running:
            raise BrokerError(f"the broker exited while waiting for {what}\n" + broker.log_tail())
        if time.monotonic() > deadline:
            raise BrokerError(f"no sign of {what} after {timeout:.0f} s\n" + broker.log_tail())
        time.sleep(0.1)


def expected_loads(lm: LogManager, topic: str, *, staged: bool = False) -> dict[TopicPartition, tuple[int, int, int]]:
    """What the broker must load of each partition: the segments the export writes (those holding records at or
    above the log start; a segment holding no record is left out but for the last: docs/kafka-broker.md), the log
    start, the log end. The log start is kafkalog's, or the first exported segment's base when that lies above;
    through a staging directory (`staged`) it is always that base: the broker's checkpoint files, where the log
    start lives, are not the command's to write there (the delete-records JSON moves it once the broker runs)."""
    out = {}
    for tp in lm.partitions(topic):
        with lm.open_log(tp) as log:
            segs, start = log.segments, log.log_start_offset
            counts = [
                sum(int(c.scan.headers["record_count"].sum()) for c in s.checked_chunks_from_start()) for s in segs
            ]
            kept = [
                s.base_offset
                for i, s in enumerate(segs)
                if i + 1 == len(segs) or (segs[i + 1].base_offset > start and counts[i])
            ]
            out[tp] = (len(kept), kept[0] if staged else max(start, kept[0]), log.log_end_offset)
    return out
