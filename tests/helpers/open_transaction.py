"""A topic a real broker holds with committed, aborted and one OPEN transaction, for the read_committed tests of
the readers (kafkalog consume, the Spark source): Kafka's own transactional producers write it (KafkaTool).

Two partitions. Producer A commits, aborts, commits, then leaves a transaction open on partition 0 only (its
records flushed, the producer closed at once: a graceful close would abort it). Producer B then commits on both
partitions, so partition 0 holds committed records past the open transaction (behind the LSO) and partition 1's
LSO is its log end. Record timestamps are explicit and rise with the send order from t0, so a timestamp picks a
place in that order (open_ts: the first record of the open transaction). t0 is 10 minutes after the produce: the
markers carry the broker's clock, so no timestamp lookup from t0 on lands on a marker (and the broker takes
CreateTimes up to message.timestamp.after.max.ms, 1 hour, ahead).
"""

from __future__ import annotations

import time

from tools.realkafka.broker import KafkaBroker, b64

OPEN_TS_STEP = 1000  # ms between records
# one batch per flush; the open transaction must outlive the tests (the broker's transaction.max.timeout.ms)
PRODUCER = {"linger.ms": "600000", "batch.size": "1048576", "transaction.timeout.ms": "900000"}
PLAN = (  # (producer, outcome, records per partition)
    ("a", "commit", {0: 3, 1: 2}),
    ("a", "abort", {0: 2, 1: 2}),
    ("a", "commit", {0: 2}),
    ("a", "leaveOpen", {0: 2}),
    ("b", "commit", {0: 2, 1: 2}),
)


def open_ts(t0: int) -> int:
    """The timestamp of the first record of the open transaction."""
    i = 0
    for _, outcome, counts in PLAN:
        if outcome == "leaveOpen":
            return t0 + OPEN_TS_STEP * i
        i += sum(counts.values())
    raise AssertionError("no open transaction in PLAN")


def produce(broker: KafkaBroker, topic: str, tag: str) -> int:
    """Create `topic` and write PLAN into it; returns t0, the first record's timestamp."""
    t0 = int(time.time() * 1000) + 600_000
    steps: dict[str, list] = {"a": [], "b": []}
    i = 0
    for who, outcome, counts in PLAN:
        steps[who].append({"begin": 1})
        for p, n in counts.items():
            for _ in range(n):
                value = f"{tag}-{outcome}-{i}".encode()
                send = {
                    "partition": p,
                    "key": b64(f"k{i}".encode()),
                    "value": b64(value),
                    "timestamp": t0 + OPEN_TS_STEP * i,
                }
                steps[who].append({"send": {**send, "headers": [["n", b64(str(i).encode())]]}})
                i += 1
        steps[who] += [{"flush": 1}, {outcome: 1}]
    done = broker.tool(
        {"op": "createTopic", "topic": topic, "partitions": 2, "configs": {}},
        *[
            {"op": "produce", "topic": topic, "config": {"transactional.id": f"{topic}-{who}", **PRODUCER}, "steps": s}
            for who, s in steps.items()
        ],
    )
    sent = done[1] + done[2]
    assert len(sent) == i and not [m for m in sent if "error" in m], sent
    return t0
