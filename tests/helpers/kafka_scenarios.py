"""Broker -> kafkalog: topics written by Kafka's own Java producer on a live KRaft broker, and what Kafka's own
consumer, ListOffsets and DumpLogSegments say about them, for tests/storage/test_kafka_broker_logs.py to hold
kafkalog to.

`build(broker)` writes every scenario once (topics named `b2k-*`), waits on conditions the broker's files or
checkpoints show (never on time), and returns a `Scenario`: the records Kafka's consumer returns (read_uncommitted),
its offsetsForTimes answers for many timestamps per partition, ListOffsets earliest/latest, and DumpLogSegments'
output for every segment and index file of those topics.

Batches are made deterministic by a producer that never sends on its own (huge linger.ms and batch.size): each
`flush` step ends one batch per partition, so segment rolls, index entries and the offsets named below are the same
on every run. The compacted topics roll only where a timestamp jumps past segment.ms, so the cleaner's passes are the
same on every run too.

A running broker writes log-start-offset-checkpoint every 60 s (log.flush.start.offset.checkpoint.interval.ms), at a
clean shutdown, and when it deletes a partition: build() deletes a throwaway topic so that
the deleteRecords low watermarks are on disk while the broker runs, where kafkalog can see them.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.realkafka.broker import HANG_S, BrokerError, KafkaBroker, b64, unb64

PREFIX = "b2k-"
PATTERN = "^b2k-"
BASE_TS = 1_700_000_000_000  # 2023-11-14: every explicit CreateTime is around here
ONE_TIMESTAMP = BASE_TS + 2_000_150  # asked for every topic: inside the transactions, after or before the others
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")

CODEC_TOPIC = PREFIX + "codecs"  # one partition per codec, every key/value/header shape, rolls
IDEMPOTENT_TOPIC = PREFIX + "idempotent"  # two idempotent producer sessions, many small segments, index per batch
APPEND_TIME_TOPIC = PREFIX + "logappend"  # message.timestamp.type=LogAppendTime
TXN_TOPIC = PREFIX + "txn"  # committed and aborted transactions
KEPT_TOPIC = PREFIX + "compact-kept"  # cleaned twice; tombstones kept (delete.retention.ms one day)
PURGED_TOPIC = PREFIX + "compact-purged"  # cleaned twice; tombstones past their delete horizon are gone
DELETED_TOPIC = PREFIX + "deleted"  # deleteRecords: a raised log start offset
TRIGGER_TOPIC = PREFIX + "trigger"  # deleted at the end: the broker checkpoints log start offsets then

# deleteRecords targets: partition 0 inside a batch in the middle of a segment, partition 1 at a segment's base
# (batches of 10 records from offset 0, two batches per segment: see _deleted() and TOPICS).
LOW_WATERMARKS = {0: 37, 1: 60}

DUMP_FLAG = "--print-data-log"  # every batch line, every record line with its key and payload (deep iteration)
NO_AUTOSEND = {"linger.ms": "600000", "batch.size": "1048576"}  # only a flush sends: one batch per flush


@dataclass
class Scenario:
    broker: KafkaBroker
    topics: dict[str, int]  # topic -> partition count
    records: dict[str, list[dict]]  # topic -> Kafka consumer's records (read_uncommitted)
    queries: dict[str, list[int]]  # topic -> timestamps asked of offsetsForTimes
    offsets_for_times: dict[tuple[str, int], dict[int, int | None]]  # (topic, T) -> {partition: offset or None}
    earliest: dict[tuple[str, int], int]  # ListOffsets earliest (the low watermark)
    latest: dict[tuple[str, int], int]  # ListOffsets latest (the high watermark)
    kafka_dump: dict[str, str]  # file path -> DumpLogSegments output for it (DUMP_FLAG)
    kafka_dump_err: str  # and its report on stderr (index mismatches, non-consecutive offsets)
    files: list[str]  # every .log/.index/.timeindex/.txnindex of the b2k topics
    produced: dict[str, list[dict]] = field(default_factory=dict)  # topic -> producer results, in send order
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step of build()

    @property
    def log_dir(self) -> Path:
        return self.broker.log_dir


# ---------------------------------------------------------------- records


def _rec(
    value: bytes | None, *, key: bytes | None = None, headers=(), ts: int | None = None, partition: int | None = None
) -> dict:
    r = {"key": b64(key), "value": b64(value), "headers": [[k, b64(v)] for k, v in headers]}
    if ts is not None:
        r["timestamp"] = ts
    if partition is not None:
        r["partition"] = partition
    return r


PROSE = b"the quick brown fox jumps over the lazy dog; " * 4  # compressible: every codec really compresses


def _shaped(i: int, partition: int, tag: str, ts: int) -> dict:
    """Record i of a partition with one of several key, value and header shapes."""
    key = None if i % 5 == 0 else bytes([0xFF, 0xFE, i % 256]) + b"-bin" if i % 7 == 3 else f"key-{i % 9}".encode()
    if i % 13 == 6:
        value = None
    elif i % 11 == 4:
        value = b""
    elif i % 17 == 5:
        value = f"ünïcødé ✓ {tag} {i} ".encode() + PROSE
    else:
        value = f"{tag} record {i} ".encode() + PROSE
    headers = [
        (),
        [("trace", f"t-{i}".encode())],
        [("nullable", None), ("dup", b"1"), ("dup", b"2")],
        [("", b"\x00\xff"), ("ключ", "значение".encode()), ("empty", b"")],
    ][i % 4]
    return _rec(value, key=key, headers=headers, ts=ts, partition=partition)


def _backwards_ts(base: int, i: int) -> int:
    """Mostly rising by 10 ms; every 6th record goes back 45 ms, every 10th repeats the one before."""
    ts = base + i * 10
    if i % 6 == 5:
        ts -= 45
    if i % 10 == 9:
        ts -= 10
    return ts


def _groups(sends: list[dict], sizes) -> list[dict]:
    """Steps: `sends` cut into flushed groups of these sizes (cycled), so each group is one batch per partition."""
    steps, i, k = [], 0, 0
    while i < len(sends):
        n = sizes[k % len(sizes)]
        steps += [{"send": s} for s in sends[i : i + n]] + [{"flush": 1}]
        i, k = i + n, k + 1
    return steps


# ---------------------------------------------------------------- the topics


def _codecs() -> list[dict]:
    cmds = []
    for p, codec in enumerate(CODECS):
        sends = [_shaped(i, p, codec, _backwards_ts(BASE_TS + p * 100_000, i)) for i in range(60)]
        steps = _groups(sends, (5, 1, 6, 3))  # uncompressed, 6 records stay below the segment size
        # and Kafka's own sendMany: keys and values from a format, a rising timestamp
        for start in (700, 720):
            steps += [
                {
                    "sendMany": {
                        "count": 6,
                        "partition": p,
                        "key": f"{codec}-many-{start}-%d",
                        "value": f"{codec} many %d " + PROSE.decode(),
                        "timestamp": BASE_TS + p * 100_000 + start,
                        "timestampStep": 3,
                    }
                },
                {"flush": 1},
            ]
        cmds.append(
            {
                "op": "produce",
                "topic": CODEC_TOPIC,
                "config": {"compression.type": codec, "enable.idempotence": "false", "acks": "1", **NO_AUTOSEND},
                "steps": steps,
            }
        )
    return cmds


def _idempotent() -> list[dict]:
    cmds = []
    for session in range(2):
        sends = []
        for i in range(90):
            for p in range(2):
                n = session * 90 + i
                # the second session's last 10 records carry no timestamp: the producer's clock (now)
                ts = None if session == 1 and i >= 80 else _backwards_ts(BASE_TS + 1_000_000 + p * 50_000, n)
                sends.append(_shaped(n, p, f"idem{session}", ts))
        cmds.append(
            {
                "op": "produce",
                "topic": IDEMPOTENT_TOPIC,
                "config": {
                    "enable.idempotence": "true",
                    "acks": "all",
                    "compression.type": "lz4",
                    "max.in.flight.requests.per.connection": "5",
                    **NO_AUTOSEND,
                },
                "steps": _groups(sends, (8, 2, 14)),
            }
        )
    return cmds


def _append_time() -> list[dict]:
    sends = [_shaped(i, i % 2, "appendtime", BASE_TS + i) for i in range(40)]
    return [
        {
            "op": "produce",
            "topic": APPEND_TIME_TOPIC,
            "config": {"compression.type": "gzip", "enable.idempotence": "false", "acks": "1", **NO_AUTOSEND},
            "steps": _groups(sends, (6, 10, 4)),
        }
    ]


def _txn(topic: str = TXN_TOPIC, transactional_id: str = "b2k-txn-producer") -> list[dict]:
    """Seven transactions over two partitions, three of them aborted (tests/storage/transactions reuse it on a
    topic of their own)."""
    steps, i = [], 0

    def sends(counts: dict[int, int], tag: str) -> list[dict]:
        nonlocal i
        out = []
        for p, n in counts.items():
            for _ in range(n):
                out.append({"send": _shaped(i, p, tag, BASE_TS + 2_000_000 + i * 10)})
                i += 1
        return out

    for outcome, counts in (
        ("commit", {0: 5, 1: 4}),
        ("abort", {0: 4, 1: 3}),
        ("commit", {0: 6}),
        ("abort", {1: 5}),
        ("commit", {0: 3, 1: 3}),
        ("abort", {0: 2, 1: 2}),
        ("commit", {0: 4, 1: 1}),
    ):
        # the flush before an abort puts the aborted records in the log (read_uncommitted returns them)
        steps += [{"begin": 1}, *sends(counts, outcome), {"flush": 1}, {outcome: 1}]
    return [
        {
            "op": "produce",
            "topic": topic,
            "config": {"transactional.id": transactional_id, "compression.type": "snappy", **NO_AUTOSEND},
            "steps": steps,
        }
    ]


def _compacted(topic: str, round_: int) -> list[dict]:
    """Round 0: keys k0..k9 three times and tombstones for k3 and k7, then a filler batch whose timestamp is past
    segment.ms: the only roll, so the cleaner's first pass sees the whole round at once. Round 1 (after that pass):
    k0, k1, k2, k4, k5 again, and another roll; the second pass drops the tombstones whose delete horizon passed
    (delete.retention.ms=0), or keeps them (one day)."""
    sends, ts = [], BASE_TS + 3_000_000 + round_ * 2_000
    if round_ == 0:
        for r in range(3):
            for k in range(10):
                sends.append(
                    _rec(
                        f"r{r} k{k} ".encode() + PROSE[:60],
                        key=f"k{k}".encode(),
                        ts=ts,
                        headers=[("round", str(r).encode())],
                        partition=0,
                    )
                )
                ts += 1
        for k in (3, 7):
            sends.append(_rec(None, key=f"k{k}".encode(), ts=ts, partition=0))
            ts += 1
    else:
        for k in (0, 1, 2, 4, 5):
            sends.append(_rec(f"r9 k{k} ".encode() + PROSE[:60], key=f"k{k}".encode(), ts=ts + 100 + k, partition=0))
    roll = BASE_TS + 3_000_000 + (round_ + 1) * 2_000  # more than segment.ms after the segment's first record
    fill = [_rec(b"filler " + PROSE[:60], key=f"f{round_}-{k}".encode(), ts=roll + k, partition=0) for k in range(3)]
    return [
        {
            "op": "produce",
            "topic": topic,
            "config": {"enable.idempotence": "false", "acks": "1", **NO_AUTOSEND},
            "steps": _groups(sends, (5,)) + _groups(fill, (3,)),
        }
    ]


def _deleted() -> list[dict]:
    sends = [
        _rec(f"deleted {i} ".encode() + PROSE[:40], key=f"d{i}".encode(), ts=BASE_TS + 4_000_000 + i, partition=p)
        for p in range(2)
        for i in range(100)
    ]
    by_p = {p: [s for s in sends if s["partition"] == p] for p in range(2)}
    steps = []
    for g in range(10):  # batches of 10 records, both partitions
        steps += [{"send": s} for p in range(2) for s in by_p[p][g * 10 : (g + 1) * 10]] + [{"flush": 1}]
    return [
        {
            "op": "produce",
            "topic": DELETED_TOPIC,
            "config": {"enable.idempotence": "false", "acks": "1", **NO_AUTOSEND},
            "steps": steps,
        },
        {"op": "deleteRecords", "topic": DELETED_TOPIC, "offsets": {str(p): o for p, o in LOW_WATERMARKS.items()}},
    ]


# Segments roll only where a record's timestamp is segment.ms past its segment's first (never by size): the cleaner
# can start only once a round is written whole, so each round is cleaned by exactly one pass.
COMPACT = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "segment.ms": "1000",
    "index.interval.bytes": "1",
}

TOPICS: dict[str, tuple[int, dict]] = {
    CODEC_TOPIC: (len(CODECS), {"internal.segment.bytes": "2000", "index.interval.bytes": "300"}),
    IDEMPOTENT_TOPIC: (2, {"internal.segment.bytes": "2500", "index.interval.bytes": "1"}),
    APPEND_TIME_TOPIC: (
        2,
        {"message.timestamp.type": "LogAppendTime", "internal.segment.bytes": "1500", "index.interval.bytes": "1"},
    ),
    TXN_TOPIC: (2, {"internal.segment.bytes": "1500", "index.interval.bytes": "1"}),
    KEPT_TOPIC: (1, {**COMPACT, "delete.retention.ms": "86400000"}),
    PURGED_TOPIC: (1, {**COMPACT, "delete.retention.ms": "0"}),
    DELETED_TOPIC: (2, {"internal.segment.bytes": "1400", "index.interval.bytes": "1"}),
}


# ---------------------------------------------------------------- conditions on the broker's files


def wait_until(broker: KafkaBroker, condition, what: str) -> None:
    """Poll a condition on the broker's files; a guard of HANG_S against a hang only, never a timing."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        if not broker.running:
            raise BrokerError(f"the broker stopped while waiting for {what}\n" + broker.log_tail())
        if time.monotonic() > deadline:
            raise BrokerError(f"no sign of {what} after {HANG_S:.0f} s (a hang)\n" + broker.log_tail())
        time.sleep(0.05)


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """A Kafka offset checkpoint file (version, count, `topic partition offset` lines); {} if absent."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    out = {}
    for line in lines[2:]:
        topic, partition, offset = line.split()
        out[(topic, int(partition))] = int(offset)
    return out


SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")


def live_bases(partition_dir: Path) -> list[int]:
    """Base offsets of the segments a partition dir holds now (.log files not renamed to .deleted)."""
    return sorted(
        int(m.group(1)) for f in os.listdir(partition_dir) if (m := SEGMENT_FILE.match(f)) and m.group(2) == "log"
    )


def _cleaned_to_active(broker: KafkaBroker, topic: str) -> bool:
    """The cleaner's checkpoint reached the active segment: everything cleanable was cleaned after the last write."""
    done = read_checkpoint(broker.log_dir / "cleaner-offset-checkpoint").get((topic, 0), -1)
    return done >= live_bases(broker.log_dir / f"{topic}-0")[-1]


def _old_segments_renamed(broker: KafkaBroker, topic: str, partition: int, low_watermark: int) -> bool:
    """Retention renamed (to .deleted) every file of the segments wholly below the low watermark."""
    d = broker.log_dir / f"{topic}-{partition}"
    bases = live_bases(d)
    keep = max(b for b in bases if b <= low_watermark)
    return not any((m := SEGMENT_FILE.match(f)) and int(m.group(1)) < keep for f in os.listdir(d))


# ---------------------------------------------------------------- build


def _timestamps_to_ask(produced: list[dict]) -> list[int]:
    """Before the first record, exact hits, between records, after the last, and where timestamps go backwards,
    from what the producer was told (its results carry offsets, and the broker's clock under LogAppendTime)."""
    ts = sorted({r["timestamp"] for r in produced})
    out = {0, ts[0] - 1, ts[0], ts[-1], ts[-1] + 1, ONE_TIMESTAMP, BASE_TS + 12_000_000}
    for i in range(0, len(ts), max(1, len(ts) // 6)):
        out |= {ts[i], ts[i] + 1, ts[i] - 1}
    by_p: dict[int, list[tuple[int, int]]] = {}
    for r in produced:
        by_p.setdefault(r["partition"], []).append((r["offset"], r["timestamp"]))
    for seq in by_p.values():  # timestamps that go backwards: the record after a drop, and just above it
        seq.sort()
        drops = [b for (_, a), (_, b) in zip(seq, seq[1:], strict=False) if b < a]
        for b in drops[:4]:
            out |= {b, b + 1}
    return sorted(out)


def _tool_records(result: list[dict]) -> list[dict]:
    for r in result:
        r["key"], r["value"] = unb64(r["key"]), unb64(r["value"])
        r["headers"] = [(k, unb64(v)) for k, v in r["headers"]]
    return result


def build(broker: KafkaBroker) -> Scenario:
    timings: dict[str, float] = {}
    last = time.monotonic()

    def took(step: str) -> None:
        nonlocal last
        now = time.monotonic()
        timings[step] = round(now - last, 2)
        last = now

    creates = [{"op": "createTopic", "topic": t, "partitions": n, "configs": cfg} for t, (n, cfg) in TOPICS.items()]
    creates.append({"op": "createTopic", "topic": TRIGGER_TOPIC, "partitions": 1})
    first = [
        *_codecs(),
        *_idempotent(),
        *_append_time(),
        *_txn(),
        *_compacted(KEPT_TOPIC, 0),
        *_compacted(PURGED_TOPIC, 0),
        *_deleted(),
    ]
    results = broker.tool(*creates, *first)[len(creates) :]
    produced: dict[str, list[dict]] = {}
    for cmd, res in zip(first, results, strict=False):
        if cmd["op"] == "produce":
            produced.setdefault(cmd["topic"], []).extend(res)
    failed = {t: [r for r in rs if "error" in r] for t, rs in produced.items()}
    assert not any(failed.values()), f"sends failed: {failed}"
    assert {int(p): lw for p, lw in results[-1].items()} == LOW_WATERMARKS, results[-1]
    took("create and produce")

    for topic in (KEPT_TOPIC, PURGED_TOPIC):  # the first cleaning marks the tombstones with a delete horizon
        wait_until(broker, lambda t=topic: _cleaned_to_active(broker, t), f"the cleaner to finish {topic}-0 (round 0)")
    took("cleaning, round 0")
    second = [*_compacted(KEPT_TOPIC, 1), *_compacted(PURGED_TOPIC, 1)]
    for cmd, res in zip(second, broker.tool(*second), strict=False):
        produced[cmd["topic"]].extend(res)
    for topic in (KEPT_TOPIC, PURGED_TOPIC):  # the second drops tombstones past their horizon (delete.retention.ms=0)
        wait_until(broker, lambda t=topic: _cleaned_to_active(broker, t), f"the cleaner to finish {topic}-0 (round 1)")
    took("produce and clean, round 1")
    for p, lw in LOW_WATERMARKS.items():
        wait_until(
            broker,
            lambda p=p, lw=lw: _old_segments_renamed(broker, DELETED_TOPIC, p, lw),
            f"retention to delete the segments of {DELETED_TOPIC}-{p} below {lw}",
        )

    took("retention after deleteRecords")
    # the broker's LogManager.asyncDelete writes the log dir's log-start-offset-checkpoint at once, where it
    # otherwise waits for its 60 s schedule
    broker.tool({"op": "deleteTopics", "topics": [TRIGGER_TOPIC]})
    checkpoint = broker.log_dir / "log-start-offset-checkpoint"

    def start_checkpointed() -> bool:
        # Kafka checkpoints a log start only when it lies above the first segment's base offset
        ck = read_checkpoint(checkpoint)
        return all(
            ck.get((DELETED_TOPIC, p)) == lw
            for p, lw in LOW_WATERMARKS.items()
            if lw > live_bases(broker.log_dir / f"{DELETED_TOPIC}-{p}")[0]
        )

    wait_until(broker, start_checkpointed, "the broker to checkpoint the log start offsets of " + DELETED_TOPIC)
    took("delete a topic: log start checkpoint")

    topics = {t: n for t, (n, _) in TOPICS.items()}
    queries = {t: _timestamps_to_ask(produced[t]) for t in topics}
    # a consumer that does not wait for more data (fetch.max.wait.ms) at the end of each partition
    asks = [{"op": "consume", "topic": t, "config": {"fetch.max.wait.ms": "20"}} for t in topics]
    asks += [{"op": "offsetsForTimes", "topic": t, "timestamp": q} for t in topics for q in queries[t]]
    asks += [
        {"op": "listOffsets", "topic": t, "partitions": list(range(n)), "spec": spec}
        for spec in ("earliest", "latest")
        for t, n in topics.items()
    ]
    answers = broker.tool(*asks)
    took(f"consume, {len(asks) - len(topics)} offsetsForTimes / listOffsets")
    records = {t: _tool_records(res) for t, res in zip(topics, answers, strict=False)}
    offsets_for_times = {}
    for ask, ans in zip(asks, answers, strict=False):
        if ask["op"] == "offsetsForTimes":
            offsets_for_times[(ask["topic"], ask["timestamp"])] = {
                int(p): (None if v is None else v["offset"]) for p, v in ans.items()
            }
    lists = answers[len(asks) - 2 * len(topics) :]
    earliest = {
        (t, int(p)): v["offset"] for t, ans in zip(topics, lists[: len(topics)], strict=False) for p, v in ans.items()
    }
    latest = {
        (t, int(p)): v["offset"] for t, ans in zip(topics, lists[len(topics) :], strict=False) for p, v in ans.items()
    }

    files = sorted(
        str(broker.log_dir / d / f)
        for t, n in topics.items()
        for p in range(n)
        for d in [f"{t}-{p}"]
        for f in os.listdir(broker.log_dir / d)
        if SEGMENT_FILE.match(f)
    )
    out, err = dump_log_segments(broker, files, DUMP_FLAG)
    took("DumpLogSegments")
    return Scenario(
        broker,
        topics,
        records,
        queries,
        offsets_for_times,
        earliest,
        latest,
        split_dump(out),
        err,
        files,
        produced,
        timings,
    )


def dump_log_segments(broker: KafkaBroker, files: list[str], *flags: str) -> tuple[str, str]:
    """Kafka's DumpLogSegments over these files: (stdout, stderr). Its stderr holds the report of index entries that
    do not match the log and of non-consecutive offsets, which broker.dump_log() leaves out."""
    return broker.dump_log_output(files, *flags)


def split_dump(text: str) -> dict[str, str]:
    """DumpLogSegments output of several files, by file (each part starts with its `Dumping <file>` line)."""
    out: dict[str, str] = {}
    current = None
    for line in text.splitlines(keepends=True):
        if line.startswith("Dumping "):
            current = line[len("Dumping ") :].strip()
            out[current] = ""
        if current is not None:
            out[current] += line
    return out
